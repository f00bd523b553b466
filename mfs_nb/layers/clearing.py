"""S2: zero-LLM tool-result handling on the send copy (docs/architecture.md, "Tool-result clearing").

A pure function over the projected messages; the log is never touched. In order:
(a) a result larger than the trim size keeps its head and tail, its fact lines and a recall handle;
(b) results before the *clear* boundary become a one-line placeholder naming what was cleared
    and how to get it back;
(c) tool-call arguments before the *prune* boundary that are long become a stub with a handle.
Every replacement is a function of the event alone (uid, name, size), so the bytes are the same
on every turn between two clearing events and the provider's prefix cache keeps hitting. A call
and its result are never separated: only contents change, never the messages' order or count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .facts import extract

HEAD, TAIL, MAX_FACTS = 400, 200, 12
PRUNE_ARGS_OVER = 200  # characters of tool-call arguments worth stubbing
TRIM_SHARE = 0.04  # a single result above this share of the usable window is trimmed
KEEP_ROUNDS = 3  # the newest tool rounds keep their results when old ones are cleared
# A clearing rewrites the payload from its first cleared result on, so every token after it misses
# the provider's prefix cache once. "Touch rarely, touch completely" (docs/architecture.md, "Layers
# and the byte-stable prefix"): a clearing must free at least MIN_GAIN of the usable window, and it
# clears down to HEADROOM below the warn line — the oldest rounds first, as few as get there (until
# 2026-12-05 every round but the last KEEP_ROUNDS, which at 128k took a payload of 93k tokens to 38k
# where 60k was the aim) — keeping fewer rounds if needed, so that the next one is many calls away; when no option frees
# that much, nothing is cleared and compaction acts at its own line. Measured on the three shared
# coding sessions at 8k (`mfs-nb bench consolidation`): 0.05 and 0 cleared every 3-5 calls and
# kept 83-87 % of the prefix over all calls; these kept 93-95 % (before clearing stopped at its aim;
# at 7bf5c37 the same sessions keep 95.5-96.3 %, the 8k tool schemas of 9008b2a included).
MIN_GAIN = 0.25
HEADROOM = 0.30
CHARS_PER_TOKEN = 3.5
# The memory layer's own tools page their results to a bounded share of the window (tools.MEMORY_SHARE),
# so S2 never trims them: a recall cut to head and tail would have to be recalled again.
MEMORY_TOOLS = frozenset({"recall_history", "recall_search"})


def trim_chars(effective_tokens: int) -> int:
    """Size above which one tool result is trimmed: a share of the window, never a fixed count."""
    return int(TRIM_SHARE * effective_tokens * CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Clearing:
    """Where S2 acts in the send view. `clear_before`/`prune_before` are uids (0: nowhere)."""

    trim_chars: int = 0
    clear_before: int = 0
    prune_before: int = 0

    @property
    def key(self) -> str:
        """Part of the payload fingerprint: a change here is a structural change."""
        return f"s2:{self.trim_chars}:{self.clear_before}:{self.prune_before}"


@dataclass
class ClearingStats:
    trimmed: int = 0
    cleared: int = 0
    pruned: int = 0
    chars_saved: int = 0


def handle(uid: int) -> str:
    return f"recall_history({uid}, {uid})"


def trimmed_text(content: str, uid: int) -> str:
    """(a): head + fixed elision marker with a recall handle + tail + the result's fact lines."""
    facts = [f.text for f in extract(content)[:MAX_FACTS]]
    out = (content[:HEAD] + f"\n[… output trimmed: {len(content):,} chars; {handle(uid)} …]\n" + content[-TAIL:])
    if facts:
        out += "\n[fact lines]\n" + "\n".join(facts)
    return out


def cleared_text(content: str, uid: int, name: str) -> str:
    """(b): what was cleared and how to get it back, in one line."""
    what = f"{name} output" if name else "tool output"
    return f"[tool result cleared: {what}, {len(content):,} chars; {handle(uid)}]"


def trimmed_arguments(arguments: str, uid: int) -> str:
    """(a) for arguments: an oversized call keeps the head and tail of its arguments, as JSON."""
    return json.dumps({"trimmed": arguments[:HEAD] + " … " + arguments[-TAIL:],
                       "note": f"arguments of {len(arguments):,} chars; {handle(uid)}"}, ensure_ascii=False)


def pruned_arguments(arguments: str, uid: int) -> str:
    """(c): long arguments of an old tool call, replaced by a valid JSON stub with a handle."""
    return json.dumps({"cleared": f"arguments of {len(arguments):,} chars; {handle(uid)}"})


def apply(items: list[tuple[dict[str, Any], int | None]], clearing: Clearing
          ) -> tuple[list[tuple[dict[str, Any], int | None, str]], ClearingStats]:
    """Apply S2 to (message, uid) pairs; returns (message, uid, form) triples and what it did.

    `form` is one of full | trimmed | cleared | pruned: with the uid it identifies the exact
    bytes of the message, so token counts can be cached on it."""
    stats = ClearingStats()
    names: dict[str, str] = {}
    out: list[tuple[dict[str, Any], int | None, str]] = []
    for message, uid in items:
        form = "full"
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                names[str(call.get("id", ""))] = (call.get("function") or {}).get("name", "")
            prune = uid is not None and uid < clearing.prune_before
            if uid is not None and (prune or clearing.trim_chars):
                calls = []
                for call in message["tool_calls"]:
                    fn = call.get("function") or {}
                    args = fn.get("arguments") or ""
                    stub = None
                    if prune and len(args) > PRUNE_ARGS_OVER:
                        stub, form = pruned_arguments(args, uid), "pruned"
                    elif clearing.trim_chars and len(args) > clearing.trim_chars:
                        stub = trimmed_arguments(args, uid)
                        form = "pruned" if form == "pruned" else "trimmed"
                    if stub is not None and len(stub) < len(args):
                        stats.chars_saved += len(args) - len(stub)
                        call = {**call, "function": {**fn, "arguments": stub}}
                    calls.append(call)
                if form != "full":
                    stats.pruned += form == "pruned"
                    stats.trimmed += form == "trimmed"
                    message = {**message, "tool_calls": calls}
        elif uid is not None and (message.get("role") == "tool" or is_tool_note(message, uid)):
            content = message.get("content") or ""
            name = message.get("name") or names.get(str(message.get("tool_call_id", "")), "") or note_name(content)
            if uid < clearing.clear_before:
                new = cleared_text(content, uid, name)
                if len(new) < len(content):
                    stats.cleared += 1
                    stats.chars_saved += len(content) - len(new)
                    message, form = {**message, "content": new}, "cleared"
            elif clearing.trim_chars and len(content) > clearing.trim_chars and name not in MEMORY_TOOLS:
                new = trimmed_text(content, uid)
                if len(new) < len(content):
                    stats.trimmed += 1
                    stats.chars_saved += len(content) - len(new)
                    message, form = {**message, "content": new}, "trimmed"
        out.append((message, uid, form))
    return out, stats


def is_tool_note(message: dict[str, Any], uid: int) -> bool:
    """A tool result sent without its call (the notebook's cell log, a result whose call left the
    payload): the projection labels it `[tool result #uid …]` in a user message."""
    content = str(message.get("content") or "")
    return message.get("role") == "user" and content.startswith((f"[tool result #{uid}]", f"[tool result #{uid} from "))


def note_name(content: str) -> str:
    head = content.split("]", 1)[0]
    return head.split(" from ", 1)[1] if " from " in head else ""


def rounds(events: list[Any]) -> list[int]:
    """uids of the assistant events that open a tool round, oldest first."""
    return [e.uid for e in events if e.role == "assistant" and e.tool_calls]
