"""The embedded offline default (DESIGN §9): a local litellm provider, deterministic, no network.

It answers chat requests by saying plainly that no model is configured, and reports usage
counted with the o200k tokenizer (or the estimator) so the meter and the anchor behave as they
would with a real provider. Requests marked as summarization get a deterministic extractive
summary: same input, same text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from litellm import CustomLLM
from litellm.types.utils import Choices, Message, ModelResponse, Usage

from .tokens import estimate_tokens, exact_counter, message_tokens

SUMMARY_MARKER = "<<mfs:summarize>>"

_CHAT_REPLY = (
    "**No model is configured**, so this reply comes from mfs_nb's offline default and no LLM "
    "read your message. It is saved in the log (message {n} of this conversation, {chars} characters) "
    "and will be sent in full once a model is set: `%mfs config model=openai/gpt-4o-mini` with "
    "`OPENAI_API_KEY` in the environment, or any litellm model name via `MFS_MODEL`."
)


def offline_reply(messages: list[dict[str, Any]]) -> str:
    """The text the offline default answers with: chat notice or extractive summary."""
    if any(SUMMARY_MARKER in (m.get("content") or "") for m in messages if m.get("role") == "system"):
        return extractive_summary(messages)
    users = [m for m in messages if m.get("role") == "user"]
    last = (users[-1].get("content") or "") if users else ""
    return _CHAT_REPLY.format(n=len([m for m in messages if m.get("role") != "system"]), chars=f"{len(last):,}")


_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")


def extractive_summary(messages: list[dict[str, Any]]) -> str:
    """One bullet per non-system message: its first sentence, cut to 160 characters."""
    bullets = []
    for m in messages:
        if m.get("role") == "system":
            continue
        text = " ".join((m.get("content") or "").split())
        if not text:
            continue
        first = _SENTENCE.split(text, maxsplit=1)[0]
        if len(first) > 160:
            first = first[:159] + "…"
        bullets.append(f"- {m.get('role')}: {first}")
    return "\n".join(bullets) or "- (nothing to summarize)"


def _usage(messages: list[dict[str, Any]], reply: str) -> dict[str, int]:
    count = exact_counter("o200k_base") or estimate_tokens
    prompt = sum(message_tokens(m, count) for m in messages) + 3
    completion = count(reply)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class OfflineProvider(CustomLLM):
    """litellm custom provider `mfs-offline/…`."""

    def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:
        reply = offline_reply(messages)
        usage = _usage(messages, reply)
        return ModelResponse(
            model=model,
            choices=[Choices(message=Message(role="assistant", content=reply), finish_reason="stop", index=0)],
            usage=Usage(prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"],
                        total_tokens=usage["total_tokens"]),
        )

    def streaming(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        reply = offline_reply(messages)
        usage = _usage(messages, reply)
        words = re.findall(r"\S+\s*", reply)
        for i in range(0, len(words), 8):
            yield {"text": "".join(words[i:i + 8]), "tool_use": None, "is_finished": False,
                   "finish_reason": "", "usage": None, "index": 0}
        yield {"text": "", "tool_use": None, "is_finished": True, "finish_reason": "stop", "usage": usage, "index": 0}
