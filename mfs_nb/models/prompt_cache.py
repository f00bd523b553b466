"""Prompt-cache hints for the providers that cache only where a request asks (issue 42).

The payload's layers are ordered so that its prefix stays byte-stable from call to call (architecture,
"The send view"). OpenAI caches such a prefix by itself, from 1,024 tokens; a `prompt_cache_key` per
session keeps one conversation's calls on one cache. Anthropic's Messages API — and Claude on Bedrock
and Vertex AI — caches nothing unless a block is marked `cache_control`: at most four marks a request,
each looked up among the 20 blocks before it. The marks go where the layers are stable, in this order
of need: the newest message (a rolling anchor, so the next call reads everything up to it), the end of
the standing prefix (system prompt and knowledge slot), the end of the history layers (the segment
block and the tracks), the previous call's anchor when the newest is out of its lookup's reach, and
the tool schemas. The budget note that ends the newest message is a block of its own after the mark,
since the next call does not repeat it.

`mark` rewrites a request for one endpoint; the session decides where the stable points are
(`hints_for`), the LLM boundary applies them per endpoint, so a fallback of another family gets that
family's rules.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_MARKS = 4  # Anthropic's limit per request
LOOKBACK = 16  # messages a mark's lookup may safely reach back (Anthropic: 20 blocks; a message can be several)
EPHEMERAL = {"type": "ephemeral"}
HISTORY_LAYERS = ("evicted", "segment", "facts", "verbatim")
STANDING_LAYERS = ("system", "knowledge")


@dataclass(frozen=True)
class CacheHints:
    """Where a request's stable points are (message indices), and the session's cache key."""

    standing: int | None = None  # last message of the standing prefix
    history: int | None = None  # last message of the history layers
    anchor: int | None = None  # the newest message
    previous: int | None = None  # the previous call's anchor, when everything up to it is unchanged
    note: str = ""  # appended to the newest message for this call only (the budget note)
    key: str = ""  # prompt_cache_key for OpenAI-style endpoints


def family(model: str) -> str:
    """'anthropic' where litellm sends Anthropic-style caching (anthropic/, claude-…, Claude on bedrock/
    and vertex_ai/), 'openai' for OpenAI (and OpenAI-compatible endpoints named openai/…), else ''."""
    name = model.lower()
    provider, _, rest = name.partition("/")
    if provider == "anthropic" or name.startswith("claude"):
        return "anthropic"
    if provider in ("bedrock", "vertex_ai", "vertex_ai_beta") and "claude" in rest:
        return "anthropic"
    if provider in ("openai", "azure") or name.startswith(("gpt-", "o1", "o3", "o4")):
        return "openai"
    return ""


def hints_for(layers: Sequence[Any], n_messages: int, note: str, key: str,
              previous: tuple[int, str] | None, messages: Sequence[dict[str, Any]]) -> CacheHints:
    """The stable points of a payload from its layers (`view.Layer`: kind and message count);
    `previous` is the last call's (anchor, fingerprint), kept when the messages up to it are unchanged."""
    standing = history = None
    at = 0
    for layer in layers:
        at += layer.messages
        if layer.kind in STANDING_LAYERS:
            standing = at - 1
        elif layer.kind in HISTORY_LAYERS:
            history = at - 1
    anchor = n_messages - 1 if n_messages else None
    kept = None
    if previous is not None and anchor is not None and previous[0] < anchor \
            and fingerprint(messages, previous[0]) == previous[1]:
        kept = previous[0]
    return CacheHints(standing, history, anchor, kept, note, key)


def fingerprint(messages: Sequence[dict[str, Any]], upto: int) -> str:
    """A digest of the messages up to and including index `upto` (what a mark there caches)."""
    digest = hashlib.sha256()
    for message in messages[:upto + 1]:
        digest.update(json.dumps(message, sort_keys=True, ensure_ascii=False, default=str).encode())
    return digest.hexdigest()


def choose(hints: CacheHints, has_tools: bool) -> tuple[list[int], bool]:
    """The message indices to mark and whether to mark the tool schemas: at most four in all."""
    wanted = [hints.anchor, hints.standing, hints.history]
    if hints.previous is not None and hints.anchor is not None and hints.anchor - hints.previous >= LOOKBACK:
        wanted.append(hints.previous)
    marks: list[int] = []
    for index in wanted:
        if index is not None and index not in marks and len(marks) < MAX_MARKS:
            marks.append(index)
    tools = has_tools and len(marks) < MAX_MARKS
    return sorted(marks), tools


def _markable(message: dict[str, Any]) -> bool:
    return message.get("role") in ("system", "user", "tool") and isinstance(message.get("content"), str) \
        and bool(message["content"].strip())


def mark(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
         hints: CacheHints) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, int]:
    """The request in litellm's content-block form with `cache_control` on the chosen blocks; returns
    the messages, the tools and how many marks were placed. Messages that cannot carry a mark (an
    assistant turn, an empty text) are left as they are. Nothing else changes: the text of every
    block is the text of the message, so the prefix up to each mark is the same bytes every call."""
    indices, mark_tools = choose(hints, bool(tools))
    out = list(messages)
    placed = 0
    for index in indices:
        if not 0 <= index < len(out) or not _markable(out[index]):
            continue
        message = out[index]
        text = message["content"]
        blocks: list[dict[str, Any]]
        if index == hints.anchor and hints.note and text.endswith(hints.note):
            head = text[:len(text) - len(hints.note)]
            blocks = [{"type": "text", "text": head, "cache_control": dict(EPHEMERAL)},
                      {"type": "text", "text": hints.note}] if head.strip() else \
                [{"type": "text", "text": text, "cache_control": dict(EPHEMERAL)}]
        else:
            blocks = [{"type": "text", "text": text, "cache_control": dict(EPHEMERAL)}]
        out[index] = {**message, "content": blocks}
        placed += 1
    if mark_tools and tools:
        tools = [*tools[:-1], {**tools[-1], "cache_control": dict(EPHEMERAL)}]
        placed += 1
    return out, tools, placed


def rejected(message: str) -> bool:
    """Whether a provider's 400 names the cache hints (so the call is worth one retry without them)."""
    text = message.lower()
    return "cache_control" in text or "prompt_cache_key" in text or "cache control" in text
