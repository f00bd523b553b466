"""S3 segments (docs/architecture.md, "Segments (S3)"): pure functions, no model, no storage.

A segment replaces a contiguous run of the log (uid_from..uid_to) in the send view. It is made
once, from the originals only, and carries a header with its uid range, a constant honesty line
(no digits, so it never disturbs the prefix), a prose guide and the verbatim fact list.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from .. import lang
from ..events import Event
from ..lang import conversation_language, header_language
from ..window.tokens import estimate_tokens
from . import workset
from .facts import tool_digest
from .origin import canned, markup_free
from .view import pair_tool_messages

HONESTY = lang.text("honesty")
assert not re.search(r"\d", HONESTY)

INPUT_CHARS = 120_000  # compressor input budget per segment
TARGET_MIN, TARGET_MAX = 1_000, 16_000
DEGRADED_HEAD, DEGRADED_TAIL = 120, 60
STYLES = ("bullets", "handoff")


@dataclass(frozen=True)
class Segment:
    """A committed replacement of uids uid_from..uid_to. `level` is the merge depth (0 for now)."""

    id: int
    uid_from: int
    uid_to: int
    prose: str
    facts: str
    level: int = 0
    degraded: bool = False
    tokens: int = 0
    covered_hash: str = ""
    keywords: str = ""  # a few topic words of the range (search.keywords), so the model knows what to search
    language: str = ""  # the covered user messages' language when a header translation exists (lang.py)

    def render(self) -> str:
        degraded = " · " + lang.text("segment_degraded", self.language) if self.degraded else ""
        # a segment stored before topics left CJK out may hold character bigrams: never shown
        words = ", ".join(w for w in self.keywords.split(", ") if w and not lang.has_cjk(w))
        topics = " · " + lang.text("segment_topics", self.language, words=words) if words else ""
        text = f"[segment #{self.id} · uids {self.uid_from}–{self.uid_to}{degraded}{topics}]\n"
        text += lang.text("honesty", self.language) + "\n\n" + self.prose.strip()
        if self.facts.strip():
            text += "\n\n" + lang.text("facts_label", self.language) + "\n" + self.facts.strip()
        return text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Segment:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def covered_hash(events: Sequence[Event]) -> str:
    """Identity of a range: its uids and content hashes (the atomic-commit check compares this)."""
    h = hashlib.sha256()
    for e in events:
        h.update(f"{e.uid}:{e.sha256};".encode())
    return h.hexdigest()[:32]


def cut_points(events: Sequence[Event]) -> list[int]:
    """Indices where a range may start or end: registered turn starts (user cells and tool-only
    rounds). Cutting there never separates a tool call from its result."""
    return [i for i, e in enumerate(events) if e.turn_start]


@dataclass(frozen=True)
class RangeChoice:
    start: int  # index into the raw events
    end: int  # exclusive
    reason: str = ""  # why nothing was chosen, when start == end


def event_tokens(e: Event) -> int:
    return e.tokens


def compressor_chars(e: Event) -> int:
    return len(tool_digest(e.content)) if e.role == "tool" else len(e.content) + sum(
        len((c.get("function") or {}).get("arguments", "")) for c in e.tool_calls)


def select_range(raw: Sequence[Event], keep_tail_tokens: int, min_tokens: int = 2_000,
                 input_chars: int = INPUT_CHARS, sent: Callable[[Event], int] = event_tokens) -> RangeChoice:
    """The oldest raw events worth compressing: cut at turn starts, keep the recent tail by whole
    turns (a last turn larger than the retention is kept whole), fit the compressor's input budget
    and back off to a turn start; skip a range under `min_tokens` as `range_too_small`. `sent`: an
    event's tokens as the payload sends it (a cleared result as its placeholder), which the kept
    tail is measured in; the range's own worth is measured in the log's tokens."""
    cuts = cut_points(raw)
    if not raw or not cuts:
        return RangeChoice(0, 0, "nothing_raw")
    # the tail: whole turns from the end while they fit the retention; the last turn always stays
    tail_start = cuts[-1]
    tokens = sum(sent(e) for e in raw[tail_start:])
    for c in reversed(cuts[:-1]):
        extra = sum(sent(e) for e in raw[c:tail_start])
        if tokens + extra > keep_tail_tokens:
            break
        tokens += extra
        tail_start = c
    start = cuts[0]
    if tail_start <= start:
        return RangeChoice(0, 0, "only_current_turn")
    # fit the compressor's input budget, then back off to a turn start
    used, end = 0, start
    for i in range(start, tail_start):
        used += compressor_chars(raw[i])
        if used > input_chars:
            break
        end = i + 1
    if end < tail_start:
        backed = max((c for c in cuts if start < c <= end), default=None)
        if backed is None:  # a single turn larger than the budget: take it whole, the digest bounds it
            backed = min((c for c in cuts if c > start), default=tail_start)
        end = backed
    if sum(event_tokens(e) for e in raw[start:end]) < min_tokens:
        return RangeChoice(0, 0, "range_too_small")
    return RangeChoice(start, end)


def target_tokens(range_tokens: int) -> int:
    """Output target: half the range, clamped to 1,000–16,000 tokens, never a fixed small number."""
    return max(TARGET_MIN, min(TARGET_MAX, range_tokens // 2))


def compressor_messages(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The covered events as messages, tool results reduced to the digest, pairs kept whole. The
    digest leaves out the error lines the range's fact list carries verbatim, so
    the prose covers what the facts do not."""
    taken = workset.lines_of(events)
    by_uid: dict[int, list[str]] = {}
    for line in taken:
        if line.group == "errors":
            for uid in line.uids:
                by_uid.setdefault(uid, []).append(line.key.rsplit(" — ", 1)[-1])  # the key: no speaker, not cut twice
    out = []
    for message, at in pair_tool_messages(events):
        if message.get("role") == "tool":
            message = {**message, "content": tool_digest(message.get("content") or "",
                                                         taken=by_uid.get(at, ()) if at is not None else ())}
        out.append(message)
    if out and out[0].get("role") == "assistant":
        out.insert(0, {"role": "user", "content": "(continuing the conversation)"})
    return out


def language_line(language: str | None) -> str:
    """Keeps the guide in the conversation's language: a summary must not switch a Chinese chat to English."""
    if language:
        return (f"Write the guide in {language}, the language of this conversation, headings included; "
                "copy quotes, names, numbers and code exactly as they were written.")
    return "Write the guide in the language the user writes in."


def instruction(style: str, uid_from: int, uid_to: int, target: int, focus: str = "",
                language: str | None = None) -> str:
    if style not in STYLES:
        raise ValueError(f"unknown summary style {style!r}; use one of {', '.join(STYLES)}")
    text = resources.files("mfs_nb").joinpath(f"prompts/summary_{style}.md").read_text(encoding="utf-8")
    focus_line = f"Pay particular attention to: {focus.strip()}" if focus.strip() else ""
    text = text.format(uid_from=uid_from, uid_to=uid_to, target=target, focus=focus_line).strip()
    return text + "\n" + language_line(language)


FACT_LINES, FACT_TOKENS = 40, 2_400  # a segment's fact list at most ("Segments (S3)")
FACT_BLOCK = 1 / 8  # …and at most this share of the segment block's budget (`budget.plan`), so it holds several


def fact_budget(block: int | None) -> tuple[int, int]:
    """(lines, tokens) of one segment's fact list: 40 lines / 2,400 tokens, scaled down with
    the segment block's budget (`block`, the session's `budget.plan(...).block`; None: no window
    known) at small windows. Lines a segment leaves out stay in the session's fact track."""
    if not block:
        return FACT_LINES, FACT_TOKENS
    tokens = max(100, min(FACT_TOKENS, int(FACT_BLOCK * block)))
    return max(3, min(FACT_LINES, tokens // 45)), tokens


def fact_list(events: Sequence[Event], block: int | None = None) -> workset.Budgeted:
    """The verbatim fact list of a range (docs/architecture.md, "Segments (S3)"): its working set —
    errors seen, commands run, files touched, what the user and the assistant said — within `fact_budget`,
    the same lines the session's fact track would show, labelled in the range's header language."""
    lines, tokens = fact_budget(block)
    return workset.budget(workset.lines_of(events), tokens, lines, header_language(events))


def degraded_prose(events: Sequence[Event], language: str = "") -> str:
    """Zero-LLM guide: per event its first 120 and last 60 characters (speakers in `language`)."""
    lines = []
    for e in events:
        text = " ".join(e.content.split())
        if not text and e.tool_calls:
            text = lang.text("calls", language,
                             names=", ".join((c.get("function") or {}).get("name", "?") for c in e.tool_calls))
        if len(text) > DEGRADED_HEAD + DEGRADED_TAIL + 5:
            text = text[:DEGRADED_HEAD] + " … " + text[-DEGRADED_TAIL:]
        if text:
            lines.append(f"- #{e.uid} {lang.speaker(e.role, language)}{text}")
    return "\n".join(lines)


def topic_keywords(events: Sequence[Event], n: int = 5) -> str:
    """Topic words of a range, deterministic, from what the user and assistant said (not tool output,
    nor the offline default's notice, nor the lines around an attached document). Only words
    written with spaces between them: CJK text has none, and its character bigrams (`宝可`, `可梦`,
    `的宝`) are fragments, not words. So a range whose user writes Chinese, Japanese or Korean gets no
    topics (its few Latin words, mostly paths, would misname it), and any other range none of the
    CJK bigrams (a segmenter with a dictionary would be needed for real ones)."""
    from ..recall.ranking import keywords

    if conversation_language(events):
        return ""
    said = [markup_free(e.content) for e in events
            if e.role == "user" or (e.role == "assistant" and not canned(e.content))]
    ranked = keywords(said, 10 ** 9)  # all, best first
    return ", ".join([t for t in ranked if not lang.has_cjk(t)][:n])


def build(segment_id: int, events: Sequence[Event], prose: str | None, block: int | None = None) -> Segment:
    """A segment for `events`: the given prose, or the degraded guide when prose is None; its fact
    list within `fact_budget(block)`."""
    facts = fact_list(events, block)
    degraded = prose is None
    body = degraded_prose(events, facts.language) if degraded else prose
    seg = Segment(segment_id, events[0].uid, events[-1].uid, body or "", facts.render(), 0, degraded, 0,
                  covered_hash(events), topic_keywords(events), facts.language)
    return _counted(seg)


def merged(segment_id: int, members: Sequence[Segment], events: Sequence[Event], prose: str, level: int,
           block: int | None = None) -> Segment:
    """A consolidated segment: the members' union range, `prose` (the merged guide), the union
    range's working set as its fact list (within `fact_budget(block)`), one level deeper (`level`)."""
    facts = fact_list(events, block)
    new = Segment(segment_id, members[0].uid_from, members[-1].uid_to, prose, facts.render(), level, False, 0,
                  covered_hash(events), topic_keywords(events), facts.language)
    return _counted(new)


def with_prose(segment: Segment, prose: str) -> Segment:
    """`segment` with another prose (its fact list and topics as they are), its tokens counted again."""
    return _counted(Segment(**{**segment.to_json(), "prose": prose}))


def _counted(segment: Segment) -> Segment:
    """`segment` with its tokens: what its rendering costs in the payload."""
    return Segment(**{**segment.to_json(), "tokens": estimate_tokens(segment.render()) + 4})


def uncovered(uids: Sequence[int], raw: set[int], spans: Sequence[tuple[int, int]]) -> list[int]:
    """uids that are neither raw in the payload nor inside a segment or evicted range.
    Spans are sorted once and walked with the uids: O(n + s log s)."""
    ordered = sorted(spans)
    out, j = [], 0
    for uid in sorted(uids):
        if uid in raw:
            continue
        while j < len(ordered) and ordered[j][1] < uid:
            j += 1
        if not (j < len(ordered) and ordered[j][0] <= uid <= ordered[j][1]):
            out.append(uid)
    return out


