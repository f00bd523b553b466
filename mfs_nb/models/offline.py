"""The embedded offline default (docs/architecture.md, "Model boundaries and the offline default"):
a local litellm provider, deterministic, no network.

It answers chat requests by saying plainly that no model is configured, and reports usage
counted with the o200k tokenizer (or the estimator) so the meter and the anchor behave as they
would with a real provider. Requests marked as summarization get a deterministic extractive
summary: same input, same text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from functools import cache, lru_cache
from typing import Any

from .. import lang
from ..layers.origin import OFFLINE_NOTICE, canned
from ..window.tokens import estimate_tokens, exact_counter, message_tokens

SUMMARY_MARKER = "<<mfs:summarize>>"
MERGE_MARKER = "<<mfs:consolidate>>"  # consolidation: the members' guides are merged, not re-summarized

def offline_reply(messages: list[dict[str, Any]]) -> str:
    """The text the offline default answers with: chat notice or extractive summary."""
    last = (messages[-1].get("content") or "") if messages else ""
    if messages and messages[-1].get("role") == "user" and last.lstrip().startswith(SUMMARY_MARKER):
        target = re.search(r"about (\d+) tokens", last)
        return extractive_summary(messages[:-1], int(target.group(1)) if target else 1000, _asked_language(last))
    if messages and messages[-1].get("role") == "user" and last.lstrip().startswith(MERGE_MARKER):
        target = re.search(r"about (\d+) tokens", last)
        return extractive_merge(messages[:-1], int(target.group(1)) if target else 1000, _asked_language(last))
    return OFFLINE_NOTICE


def _asked_language(instruction: str) -> str:
    """The language the instruction asks the guide to be written in (`segments.language_line`):
    the offline default follows it as a model would, for its own labels."""
    m = re.search(r"Write the guide in (\w+), the language of this conversation", instruction)
    return lang.translated(m.group(1)) if m else ""


_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")


_INFORMATIVE = re.compile(r"\d+|(?<=\s)[A-Z][a-z]+|[\u4e00-\u9fff]{2,}")


def _best_sentence(text: str) -> str:
    """The sentence that carries the most: numbers, names, substance; pleasantries score low."""
    sentences = [s for s in _SENTENCE.split(text) if s.strip()] or [text]

    def score(s: str) -> float:
        words = len(s.split())
        return 3 * len(_INFORMATIVE.findall(s)) + min(words, 24) / 4 - (5 if words < 4 and len(s) < 12 else 0)

    return max(sentences, key=score)  # max keeps the earliest of equals: deterministic


def extractive_summary(messages: list[dict[str, Any]], target_tokens: int = 1000, language: str = "") -> str:
    """Deterministic extractive guide: the most informative sentence (≤ 160 chars) of each user and
    assistant message, user messages first when the target does not fit them all; order kept.
    Speakers are labelled in `language` (lang.py)."""
    rank = {"user": 0, "assistant": 1}
    picked: list[tuple[int, int, str]] = []
    for i, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            continue
        text = " ".join((m.get("content") or "").split())
        if not text or text.startswith("(continuing") or canned(text):
            continue  # the offline default's own notice carries nothing worth summarizing
        best = _best_sentence(text)
        if len(best) > 160:
            best = best[:159] + "…"
        # a tool result sent as a labelled note (the notebook's cell log) is not the user speaking
        role = "tool" if text.startswith("[tool result #") else str(m.get("role"))
        picked.append((rank.get(role, 2), i, f"- {lang.speaker(role, language)}{best}"))
    kept, used = set(), 0
    for _, i, line in sorted(picked):
        cost = estimate_tokens(line) + 1
        if used + cost > target_tokens:
            continue
        kept.add(i)
        used += cost
    lines = [line for _, i, line in picked if i in kept]
    return "\n".join(lines) or lang.text("nothing_to_summarize", language)


def extractive_merge(messages: list[dict[str, Any]], target_tokens: int = 1000, language: str = "") -> str:
    """Deterministic merge of guides: their lines in order, the user's lines first when the target
    does not fit them all (the offline default's consolidation); a user line is labelled in
    English or in Chinese, whichever the guides were written in."""
    users = ("user:", lang.speaker("user", lang.CHINESE))
    lines: list[str] = []
    for m in messages:
        for line in (m.get("content") or "").splitlines():
            line = line.strip()
            if line and not line.startswith("[guide to uids") and line not in lines:
                lines.append(line)
    order = sorted(range(len(lines)), key=lambda i: (not any(u in lines[i][:12] for u in users), i))
    kept, used = set(), 0
    for i in order:
        cost = estimate_tokens(lines[i]) + 1
        if used + cost <= target_tokens:
            kept.add(i)
            used += cost
    return "\n".join(lines[i] for i in sorted(kept)) or lang.text("nothing_to_merge", language)


@cache
def _counter() -> Callable[[str], int]:
    """Exact counts, remembered for the texts of recent requests: each request repeats the one before
    it, and counting the whole prompt afresh made a turn's cost grow with the history."""
    return lru_cache(maxsize=16_384)(exact_counter("o200k_base") or estimate_tokens)


def _usage(messages: list[dict[str, Any]], reply: str, tools: list[dict[str, Any]] | None = None) -> dict[str, int]:
    count = _counter()
    prompt = sum(message_tokens(m, count) for m in messages) + 3
    if tools:  # a provider counts the tool schemas it was sent in the prompt, so the anchor includes them
        prompt += count(json.dumps(tools))
    completion = count(reply)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def complete(messages: list[dict[str, Any]], stream: bool = True, on_delta: Callable[[str], None] | None = None,
             tools: list[dict[str, Any]] | None = None) -> tuple[str, dict[str, int]]:
    """The offline default answered in-process, without importing litellm (which takes seconds):
    the same text and usage the litellm provider below returns, streamed in the same pieces."""
    reply = offline_reply(messages)
    if stream and on_delta:
        words = re.findall(r"\S+\s*", reply)
        for i in range(0, len(words), 8):
            on_delta("".join(words[i:i + 8]))
    return reply, _usage(messages, reply, tools)


@cache
def provider_class() -> type:
    """The `mfs-offline/…` provider's class (a litellm CustomLLM), built once, on first use."""
    from litellm import CustomLLM
    from litellm.types.utils import Choices, Message, ModelResponse, Usage

    class OfflineProvider(CustomLLM):
        """litellm custom provider `mfs-offline/…`."""

        def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:
            reply = offline_reply(messages)
            usage = _usage(messages, reply, (kwargs.get("optional_params") or {}).get("tools"))
            return ModelResponse(
                model=model,
                choices=[Choices(message=Message(role="assistant", content=reply), finish_reason="stop", index=0)],
                usage=Usage(prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"],
                            total_tokens=usage["total_tokens"]),
            )

        def streaming(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:  # type: ignore[override]
            reply = offline_reply(messages)
            usage = _usage(messages, reply, (kwargs.get("optional_params") or {}).get("tools"))
            words = re.findall(r"\S+\s*", reply)
            for i in range(0, len(words), 8):
                yield {"text": "".join(words[i:i + 8]), "tool_use": None, "is_finished": False,
                       "finish_reason": "", "usage": None, "index": 0}
            yield {"text": "", "tool_use": None, "is_finished": True, "finish_reason": "stop", "usage": usage,
                   "index": 0}

    return OfflineProvider


def __getattr__(name: str) -> Any:
    # `OfflineProvider` subclasses litellm's CustomLLM: built on first use, so importing this
    # module (and answering offline in-process) never imports litellm
    if name == "OfflineProvider":
        return provider_class()
    raise AttributeError(name)
