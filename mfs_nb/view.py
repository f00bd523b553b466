"""Projection of the log into the send view (DESIGN §2.1, §3 S1).

A pure function: events in, the exact `messages` payload and its layers out. Nothing here
touches storage, the model or the notebook. S1 sends the whole uncovered history; later layers
(segments, verbatim tracks) slot in between the system layer and the raw tail.

The projection guarantees the pairing invariant: every tool call in the payload is followed by
its result and every result follows its call. A call with no recorded result gets a fixed
placeholder result; a result whose call is not in the payload is sent as a labelled user note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .clearing import Clearing, ClearingStats, apply
from .events import Event
from .tokens import message_tokens

MISSING_RESULT = "[no result was recorded for this tool call]"


@dataclass(frozen=True)
class Layer:
    """One contiguous part of the payload: its kind, the uids it stands for, its size."""

    kind: str
    uid_from: int | None
    uid_to: int | None
    tokens: int
    level: int | None = None
    degraded: bool = False
    messages: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SendView:
    """The exact payload the model receives, with one uid (or None) per message."""

    messages: list[dict[str, Any]]
    layers: list[Layer]
    uids: list[int | None] = field(default_factory=list)
    forms: list[str] = field(default_factory=list)
    structure: str = ""
    clearing: ClearingStats = field(default_factory=ClearingStats)

    @property
    def tokens(self) -> int:
        return sum(layer.tokens for layer in self.layers)

    def raw_uids(self) -> set[int]:
        return {u for u in self.uids if u is not None}


def pair_tool_messages(events: Sequence[Event]) -> list[tuple[dict[str, Any], int | None]]:
    """Messages for `events`, with every tool call and tool result paired (see module doc)."""
    out: list[tuple[dict[str, Any], int | None]] = []
    i, n = 0, len(events)
    while i < n:
        event = events[i]
        if event.role == "assistant" and event.tool_calls:
            out.append((event.to_message(), event.uid))
            results: dict[str, Event] = {}
            j = i + 1
            while j < n and events[j].role == "tool" and events[j].tool_call_id in event.tool_call_ids \
                    and events[j].tool_call_id not in results:
                results[events[j].tool_call_id] = events[j]
                j += 1
            for call_id in event.tool_call_ids:
                result = results.get(call_id)
                if result is not None:
                    out.append((result.to_message(), result.uid))
                else:
                    out.append(({"role": "tool", "tool_call_id": call_id, "content": MISSING_RESULT}, None))
            i = j
            continue
        if event.role == "tool":
            note = f"[tool result #{event.uid}" + (f" from {event.name}" if event.name else "") + "]\n"
            out.append(({"role": "user", "content": note + event.content}, event.uid))
        else:
            out.append((event.to_message(), event.uid))
        i += 1
    return out


def unpaired(messages: Sequence[dict[str, Any]]) -> int:
    """How many tool calls lack their result right after them, plus results without their call."""
    bad, i = 0, 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "tool":
            bad += 1
            i += 1
            continue
        ids = [c.get("id") for c in m.get("tool_calls") or ()]
        if m.get("role") == "assistant" and ids:
            following = messages[i + 1:i + 1 + len(ids)]
            answered = [x.get("tool_call_id") for x in following if x.get("role") == "tool"]
            bad += sum(1 for cid in ids if cid not in answered)
            i += 1 + len(answered)
            continue
        i += 1
    return bad


def project(
    events: Sequence[Event],
    system_prompt: str,
    count_message: Callable[[dict[str, Any], int | None, str], int] | None = None,
    clearing: Clearing | None = None,
) -> SendView:
    """The send view: the system layer, then every event as a raw message, with S2 applied."""
    def count(msg: dict[str, Any], uid: int | None, form: str) -> int:
        return count_message(msg, uid, form) if count_message else message_tokens(msg)

    clearing = clearing or Clearing()
    system = {"role": "system", "content": system_prompt}
    messages: list[dict[str, Any]] = [system]
    uids: list[int | None] = [None]
    forms = ["full"]
    layers = [Layer("system", None, None, count(system, None, "full"), messages=1)]
    items, stats = apply(pair_tool_messages(events), clearing)
    if items:
        tokens = 0
        for msg, uid, form in items:
            messages.append(msg)
            uids.append(uid)
            forms.append(form)
            tokens += count(msg, uid, form)
        layers.append(Layer("raw", events[0].uid, events[-1].uid, tokens, messages=len(items)))
    return SendView(messages, layers, uids, forms, clearing.key, stats)
