"""Projection of the log into the send view (docs/architecture.md, "The log" and "Layers and the
byte-stable prefix").

A pure function: events in, the exact `messages` payload and its layers out. Nothing here
touches storage, the model or the notebook. S1 sends the whole uncovered history; later layers
(segments, verbatim tracks) slot in between the system layer and the raw tail.

The projection guarantees the pairing invariant: every tool call in the payload is followed by
its result and every result follows its call. A call with no recorded result gets a fixed
placeholder result; a result whose call is not in the payload is sent as a labelled user note.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import lang
from ..events import Event, after
from ..window.tokens import message_tokens
from .clearing import Clearing, ClearingStats, apply

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
    counts: list[int] | None = None  # token counts per message, filled once by whoever needs them
    whole: tuple[int, ...] = ()  # events a layer other than the raw tail shows word for word (the tracks)

    @property
    def tokens(self) -> int:
        return sum(layer.tokens for layer in self.layers)

    def raw_uids(self) -> set[int]:
        return {u for u in self.uids if u is not None}

    def shown_uids(self) -> set[int]:
        """The events the payload shows whole, word for word (the raw tail, less what clearing trimmed,
        cleared or pruned; the messages the verbatim and fact tracks show whole): a search for the model
        leaves them out of its page (`recall_search`)."""
        forms = self.forms or ["full"] * len(self.uids)
        return {u for u, f in zip(self.uids, forms) if u is not None and f == "full"} | set(self.whole)


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


def drop_oldest_rounds(view: SendView, counts: Sequence[int], turn_starts: set[int],
                       gap_tokens: int | None) -> SendView | None:
    """A copy of `view` without its oldest raw rounds (whole turns), for a prompt-too-long retry:
    enough to cover `gap_tokens` (with 10 % to spare), else 20 % of the rounds; never the last
    round. A note names the dropped uids. Returns None when there is nothing left to drop."""
    first_raw = next((i for i, u in enumerate(view.uids) if u is not None), None)
    if first_raw is None:
        return None
    cuts = [i for i in range(first_raw, len(view.uids)) if view.uids[i] in turn_starts]
    if len(cuts) < 2:
        return None
    if gap_tokens:
        need, end = gap_tokens * 1.1, cuts[1]
        for c in cuts[1:]:
            end = c
            if sum(counts[first_raw:c]) >= need:
                break
    else:
        end = cuts[max(1, len(cuts) // 5)]
    dropped = [u for u in view.uids[first_raw:end] if u is not None]
    note = {"role": "user", "content": f"[uids {dropped[0]}–{dropped[-1]} were left out of this request to fit the "
                                       "window; recall_history returns them]"}
    messages = view.messages[:first_raw] + [note] + view.messages[end:]
    uids = view.uids[:first_raw] + [None] + view.uids[end:]
    forms = (view.forms or ["full"] * len(view.uids))
    forms = forms[:first_raw] + ["ptl-note"] + forms[end:]
    layers = [view.layers[0], Layer("dropped", dropped[0], dropped[-1], message_tokens(note), messages=1)]
    return SendView(messages, layers, uids, forms, view.structure + ":ptl", view.clearing, whole=view.whole)


class RawCache:
    """Projected raw items reused from call to call. The log only grows, and neither pairing nor
    S2 looks across a turn start, so everything before the newest turn start is final; only the
    events after it are projected again. Any change of covered prefix or S2 state starts over."""

    def __init__(self) -> None:
        self.key: tuple[int, str] | None = None
        self.upto = 0
        self.last_uid = 0
        self.items: list[tuple[dict[str, Any], int | None, str]] = []
        self.stats = ClearingStats()

    def project(self, raw: Sequence[Event], clearing: Clearing
                ) -> tuple[list[tuple[dict[str, Any], int | None, str]], ClearingStats]:
        key = (raw[0].uid if raw else 0, clearing.key)
        if key != self.key or self.upto > len(raw) or (self.upto and raw[self.upto - 1].uid != self.last_uid):
            self.key, self.upto, self.last_uid, self.items, self.stats = key, 0, 0, [], ClearingStats()
        cut = next((i for i in range(len(raw) - 1, self.upto, -1) if raw[i].turn_start), self.upto)
        if cut > self.upto:
            items, stats = apply(pair_tool_messages(raw[self.upto:cut]), clearing)
            self.items += items
            self.stats = _add(self.stats, stats)
            self.upto, self.last_uid = cut, raw[cut - 1].uid
        tail, stats = apply(pair_tool_messages(raw[self.upto:]), clearing)
        return self.items + tail, _add(self.stats, stats)


def _add(a: ClearingStats, b: ClearingStats) -> ClearingStats:
    return ClearingStats(a.trimmed + b.trimmed, a.cleared + b.cleared, a.pruned + b.pruned,
                         a.chars_saved + b.chars_saved)


def project(
    events: Sequence[Event],
    system_prompt: str,
    count_message: Callable[[dict[str, Any], int | None, str], int] | None = None,
    clearing: Clearing | None = None,
    segments: Sequence[Any] = (),
    evicted: Sequence[tuple[int, int]] = (),
    cache: RawCache | None = None,
    track: Any = None,
    fact_track: Any = None,
    knowledge: str | None = None,
    retried: Collection[int] = (),
) -> SendView:
    """The send view: system, the knowledge slot, the note for evicted segment maps, the segment block (oldest first),
    the user-verbatim track, then every event not covered, raw, with S2 applied. The events of `retried` (turns
    that failed and were asked again at once, `events.Retries`) are left out: the retry takes their place."""
    def count(msg: dict[str, Any], uid: int | None, form: str) -> int:
        return count_message(msg, uid, form) if count_message else message_tokens(msg)

    clearing = clearing or Clearing()
    system = {"role": "system", "content": system_prompt}
    messages: list[dict[str, Any]] = [system]
    uids: list[int | None] = [None]
    forms = ["full"]
    layers = [Layer("system", None, None, count(system, None, "full"), messages=1)]
    if knowledge:
        msg = {"role": "user", "content": knowledge}
        messages.append(msg)
        uids.append(None)
        forms.append(f"knowledge:{hashlib.sha256(knowledge.encode()).hexdigest()[:16]}")
        layers.append(Layer("knowledge", None, None, count(msg, None, forms[-1]), messages=1))
    covered_to = 0
    if evicted:
        from ..lang import header_language

        # in the language of the summaries that remain (each stores its own), else of the evicted history
        language = (getattr(segments[0], "language", "") if segments
                    else header_language([e for e in events if e.uid <= evicted[-1][1]]))
        note = {"role": "user", "content": evicted_note(evicted, language)}
        messages.append(note)
        uids.append(None)
        forms.append(f"evicted:{len(evicted)}:{evicted[-1][1]}" + (f":{language}" if language else ""))
        layers.append(Layer("evicted", evicted[0][0], evicted[-1][1], count(note, None, forms[-1]), messages=1))
        covered_to = evicted[-1][1]
    for seg in segments:
        msg = {"role": "user", "content": seg.render()}
        messages.append(msg)
        uids.append(None)
        forms.append(f"segment:{seg.id}")
        layers.append(Layer("segment", seg.uid_from, seg.uid_to, count(msg, None, forms[-1]), seg.level,
                            seg.degraded, messages=1))
        covered_to = max(covered_to, seg.uid_to)
    if fact_track is not None:
        msg = {"role": "user", "content": fact_track.text}
        messages.append(msg)
        uids.append(None)
        forms.append(f"facts:{fact_track.upto}:{len(fact_track.text)}:{fact_track.tokens}")
        layers.append(Layer("facts", fact_track.first_uid, fact_track.upto, count(msg, None, forms[-1]), messages=1))
    if track is not None:
        msg = {"role": "user", "content": track.text}
        messages.append(msg)
        uids.append(None)
        forms.append(f"verbatim:{track.upto}:{len(track.text)}:{track.tokens}")
        layers.append(Layer("verbatim", track.kept[0] if track.kept else None, track.upto,
                            count(msg, None, forms[-1]), messages=1))
    raw = list(after(events, covered_to))
    if retried:
        raw = [e for e in raw if e.uid not in retried]
    items, stats = cache.project(raw, clearing) if cache is not None else apply(pair_tool_messages(raw), clearing)
    if items:
        tokens = 0
        for msg, uid, form in items:
            messages.append(msg)
            uids.append(uid)
            forms.append(form)
            tokens += count(msg, uid, form)
        layers.append(Layer("raw", raw[0].uid, raw[-1].uid, tokens, messages=len(items)))
    structure = (f"{clearing.key}:kn:{forms[1] if knowledge else ''}:seg:{segments[-1].id if segments else 0}:ev:{len(evicted)}"
                 f":vt:{track.upto if track is not None else 0}:ft:{fact_track.upto if fact_track is not None else 0}")
    return SendView(messages, layers, uids, forms, structure, stats,
                    whole=(track.whole if track is not None else ()) + (fact_track.whole if fact_track is not None else ()))


def evicted_note(ranges: Sequence[tuple[int, int]], language: str = "") -> str:
    """One line naming the uid ranges whose segment maps left the payload (still recallable)."""
    return lang.text("evicted", language, spans=", ".join(f"{a}–{b}" for a, b in ranges))
