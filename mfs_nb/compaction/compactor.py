"""The compactor: one implementation behind the automatic tiers, `%compact` and `Session.compact`;
a fork's cover and `%compact --undo`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .. import lang
from ..events import Event
from ..layers import segments as seg
from ..layers.segments import Segment
from ..window.usage import TIERS, human, human_pair, tier_label
from . import limits
from .background import Background
from .block import BlockWork
from .making import SegmentMaking
from .state import CompactorState

if TYPE_CHECKING:
    from ..host import Host


def _of_state(name: str, doc: str, settable: bool = True) -> property:
    """One of the state's attributes, as the session, `%mfs status`, the views and the tests read it."""
    def get(self: Compactor) -> Any:
        return getattr(self.state, name)

    def put(self: Compactor, value: Any) -> None:
        setattr(self.state, name, value)
    return property(get, put if settable else None, doc=doc)


class Compactor:
    """Segments of one session and the machinery that makes them: the entry points (the tier hook,
    `compact`, a fork's `cover`, `undo`, the compaction riding on a clearing) over four parts that own
    their state — `state` (the segments in force, the lease, the protocol's rows, the breaker),
    `making` (one segment), `block` (consolidation, the sink, eviction) and `background` (the
    pre-compaction made off the turn)."""

    def __init__(self, host: Host):
        self.host = host
        self.state = CompactorState(host)
        self.making = SegmentMaking(self.state)
        self.block = BlockWork(self.state, self.making)
        self.background = Background(self.state, self.making)

    segments = _of_state("segments", "The segments in force, oldest first.")
    evicted = _of_state("evicted", "The uid ranges whose maps left the payload.")
    pending = _of_state("pending", "The background pre-compaction under way, if any.")
    recovered = _of_state("recovered", "What opening the session cleaned or did not honour, reported once.")
    breaker = _of_state("breaker", "The circuit breaker over summarizer failures.")
    lease = _of_state("lease", "The compaction lease.", settable=False)
    trials = _of_state("trials", "Segments in force for one projection only, not yet declared.", settable=False)
    seq = _of_state("seq", "The newest protocol number this kernel knows.")
    calls = _of_state("calls", "Model calls the tier hook has seen.")
    last_compaction_call = _of_state("last_compaction_call", "The call at which the last compaction ran.")
    covered_to = _of_state("covered_to", "The newest uid a segment or an evicted range covers.", settable=False)
    breaker_open = _of_state("breaker_open", "Whether automatic LLM compaction is off.", settable=False)
    failures = _of_state("failures", "Summarizer failures in a row.", settable=False)

    def in_force(self) -> list[Segment]:
        return self.state.in_force()

    def trying(self, segment: Segment) -> AbstractContextManager[None]:
        return self.state.trying(segment)

    def exclusive(self, wait_s: float = 0.0, *, idle: bool = False) -> AbstractContextManager[str | None]:
        return self.state.exclusive(wait_s, idle=idle)

    def choose(self, effective: int, emergency: bool = False, small_ok: bool = False,
               now: bool = False) -> tuple[list[Event], str]:
        return self.state.choose(effective, emergency, small_ok, now)

    def plan(self, effective: int) -> Any:
        return self.state.plan(effective)

    def commit(self, segment: Segment) -> str | None:
        return self.state.commit(segment)

    def breaker_state(self) -> dict[str, Any]:
        return self.state.breaker_state()

    def breaker_line(self) -> str:
        return self.state.breaker_line()

    def summarize(self, events: Sequence[Event], effective: int, focus: str = "",
                  earlier: str = "") -> tuple[str | None, dict[str, Any]]:
        return self.making.summarize(events, effective, focus, earlier)

    def take_pending(self, wait: bool = False) -> tuple[Segment, dict[str, Any]] | None:
        return self.background.take_pending(wait)

    def compact(self, tier: str, reason: str, focus: str = "", *, manual: bool = False,
                only_ready: bool = False) -> list[str]:
        """Commit what the background made, then make and commit segments until pressure is under
        the target or nothing is left. `only_ready`: commit the finished background result only."""
        s = self.host
        with self.state.exclusive(limits.LOCK_WAIT_S if manual or tier == "hard" else 0.0) as busy:
            if busy:
                s.log("skip", tier=tier, reason="locked", trigger=reason, detail=busy)
                return [f"{busy}; this compaction was skipped" + ("; try %compact again in a moment" if manual else "")]
            return self._compact_locked(tier, reason, focus, manual=manual, only_ready=only_ready)

    def _compact_locked(self, tier: str, reason: str, focus: str, *, manual: bool, only_ready: bool) -> list[str]:
        s = self.host
        if manual and self.state.breaker.open:
            self.state.breaker.half_open = True  # the user's %compact tries the model once
        before = s.usage()
        effective = before.effective
        notices: list[str] = []
        made: list[Segment] = []
        llm_tokens = 0
        digests: list[Segment] = []  # committed as the zero-LLM digest because the summary was not smaller
        stuck: str | None = None  # at the hard tier and not even the digest made the payload smaller: why
        started = time.monotonic()
        upgraded = self.making.upgrade_last_degraded(effective)
        if upgraded:
            notices.append(upgraded)
        ready = self.background.take_pending(wait=not only_ready)
        if ready:
            made.append(ready[0])
            llm_tokens += ready[1].get("llm_tokens", 0)
            notices += self.making.notes(ready[0], ready[1], tier)
        wider: list[Event] = []  # at the hard line, after a range not even the digest made smaller: all of it
        widened = False
        while not only_ready and s.usage().tokens >= self.state.plan(effective).target or manual and not made:
            events, why = (wider, "") if wider else self.state.choose(effective, small_ok=manual, now=True)
            wider = []
            if not events and s.usage().tier == "hard":
                events, why = self.state.choose(effective, emergency=True)
            if not events:
                if not made:
                    s.log("skip", tier=tier, reason=why, trigger=reason, tokens=before.tokens)
                    if manual:
                        notices.append("nothing to compact" + (f" ({why.replace('_', ' ')})" if why else ""))
                break
            seq = self.state.next_seq()
            self.state.rows.start(seq, trigger=reason, tier=tier, uid_from=events[0].uid, uid_to=events[-1].uid)
            segment, info = self.making.make(seq, events, effective, focus)
            llm_tokens += info.get("llm_tokens", 0)
            now, then = self.state.payload_with(segment)
            over = tier == "hard" or now >= effective
            if then >= now and over and not segment.degraded:
                # the hard tier always ends below the window (issue 39): a summary that does not make
                # the payload smaller gives way to the zero-LLM digest of the same range
                seq, segment, info = self.making.digest_instead(seq, segment, events, effective, tier, reason, now, then)
                now, then = self.state.payload_with(segment)
            if then >= now:
                # a segment that does not make the payload smaller is not committed (issue 17)
                self.state.rows.abort(seq, "not_smaller", tokens=[now, then])
                s.log("skip", tier=tier, reason="not_smaller", trigger=reason, tokens_before=now, tokens_after=then,
                       uid_from=segment.uid_from, uid_to=segment.uid_to)
                if over:  # the terminal chain below takes over; its notice says what happened
                    stuck = "" if info.get("fallback") else str(info.get("error") or "")
                    if not widened:  # once: the whole raw history but the current turn, where a capped guide pays
                        widened = True
                        wider = self.state.choose(effective, emergency=True)[0]
                        if len(wider) > len(events):
                            continue
                        wider = []
                elif not made:
                    tokens = sum(seg.event_tokens(e) for e in events)
                    notices.append(lang.text("not_worth", self.making.language(events[-1].uid), n=len(events),
                                             tokens=human(tokens), now=human(now), then=human(then)))
                break
            rejected = self.state.commit(segment)
            if rejected:
                self.state.rows.abort(seq, rejected)
                s.log("commit_rejected", tier=tier, reason=rejected, uid_from=segment.uid_from, uid_to=segment.uid_to)
                notices.append(f"compaction result dropped: {rejected}")
                break
            self.state.rows.finish(seq)
            made.append(segment)
            stuck = None  # a range starts at the oldest raw event: this one covers any that stayed raw
            if info.get("fallback"):
                digests.append(segment)
                s.log("degraded", tier=tier, seq=segment.id, reason="not_smaller", error=info.get("error", ""),
                      uid_from=segment.uid_from, uid_to=segment.uid_to)
            else:
                notices += self.making.notes(segment, info, tier)
            manual = False
        merged: list[str] = []
        evicted: list[Segment] = []
        if made:
            merged, evicted = self.block.settle_block(effective, tier)
        fell_back: list[Segment] = []
        if (digests or stuck is not None) and s.usage().tier == "hard":
            # still at the hard line, a reply away from the window: the terminal chain to its end
            sunk, fell_back = self.block.to_window(effective, tier)
            merged += sunk
        if digests or fell_back or (stuck is not None and not made):
            notices.append(self.making.fallback_note(digests, stuck, fell_back, s.usage().tokens < effective))
            if not made and (merged or fell_back):
                self.state.last_compaction_call = self.state.calls  # the payload was rewritten: a compaction event
        if made:
            after = s.usage()
            self.state.last_compaction_call = self.state.calls
            uid_from, uid_to = made[0].uid_from, made[-1].uid_to
            ids = f"#{made[0].id}" if len(made) == 1 else f"#{made[0].id}–#{made[-1].id}"
            s.log("compaction", tier=tier, trigger=reason, tokens_before=before.tokens, tokens_after=after.tokens,
                   llm_tokens=llm_tokens, uid_from=uid_from, uid_to=uid_to, segments=[x.id for x in made],
                   degraded=any(x.degraded for x in made), duration_s=round(time.monotonic() - started, 3),
                   evicted=[x.id for x in evicted + fell_back])
            notices.insert(0, lang.text("compacted", self.making.language(uid_to), **dict(zip(
                ("before", "after"), human_pair(before.tokens, after.tokens))), ids=ids, a=uid_from, b=uid_to))
            notices += merged
            if evicted:
                notices.append(f"the oldest {len(evicted)} segment map{'s' if len(evicted) > 1 else ''} left the "
                               f"payload (uids {evicted[0].uid_from}–{evicted[-1].uid_to} stay recallable)")
        return notices

    def cover(self, events: list[Event], reason: str, focus: str = "",
              earlier: str = "") -> tuple[Segment | None, list[str]]:
        """One segment over exactly `events` — a fork's whole inherited history — committed even when
        it is not smaller than the events (the fork starts from a summary by design). When the range
        is more than the compressor takes at once, the summarizer reads the newest events that fit,
        after `earlier` (the parent's segments: their text stands for what came before)."""
        with self.state.exclusive(limits.LOCK_WAIT_S) as busy:
            if busy:
                return None, [f"{busy}; try again in a moment"]
            before = self.host.usage()
            seq = self.state.next_seq()
            self.state.rows.start(seq, trigger=reason, tier=before.tier, uid_from=events[0].uid, uid_to=events[-1].uid)
            segment, info = self.making.make(seq, events, before.effective, focus, earlier)
            rejected = self.state.commit(segment)
            if rejected:
                self.state.rows.abort(seq, rejected)
                return None, [f"the fork's summary was not committed: {rejected}"]
            self.state.rows.finish(seq)
            self.host.log("compaction", tier=before.tier, trigger=reason, tokens_before=before.tokens,
                       tokens_after=self.host.usage().tokens, llm_tokens=info.get("llm_tokens", 0),
                       uid_from=segment.uid_from, uid_to=segment.uid_to, segments=[segment.id],
                       degraded=segment.degraded, evicted=[])
            return segment, self.making.notes(segment, info, before.tier)

    def undo(self) -> list[str]:
        """Retract the newest segment (`%compact --undo`): an append-only declaration that the
        projection honours, so its uids are raw again. Only when they fit below the warn line (else
        the next call would compact them again) and the segment is still an L0 in force."""
        s = self.host
        with self.state.exclusive(limits.LOCK_WAIT_S) as busy:
            if busy:
                return [f"{busy}; nothing was undone; try again in a moment"]
            self.state.refresh()
            if not self.state.segments:
                return ["nothing to undo: no segment is in the payload"
                        + (" (older maps were evicted; their uids are recallable)" if self.state.evicted else "")]
            last = self.state.segments[-1]
            where = f"segment #{last.id} (uids {last.uid_from}–{last.uid_to})"
            if last.level > 0:
                return [f"nothing undone: {where} consolidates earlier segments; only the newest compaction "
                        f"can be undone, before it is consolidated (recall_history({last.uid_from}, {last.uid_to}) "
                        "shows the originals)"]
            before = s.usage()
            self.state.segments.pop()
            try:
                after = s.usage()
            finally:
                self.state.segments.append(last)
            if after.tier != "ok":
                return [f"nothing undone: with uids {last.uid_from}–{last.uid_to} raw again the payload would be "
                        f"{human(after.tokens)} tokens, past the warn line ({tier_label(after.tier)}), and the next "
                        f"call would compact them again; %recall {last.uid_from}-{last.uid_to} shows them"]
            seq = self.state.next_seq()
            self.state.rows.start(seq, trigger="undo", segment=last.id)
            declaration = {"type": "retract", "segment_id": last.id, "uid_from": last.uid_from, "uid_to": last.uid_to}
            self.state.rows.declare(seq, declaration)
            self.state.honour(declaration, seq)
            self.state.rows.finish(seq)
            s.log("undo", segment=last.id, uid_from=last.uid_from, uid_to=last.uid_to, tokens_before=before.tokens,
                  tokens_after=after.tokens)
            return [f"undid {where}: those messages are raw again ({human(before.tokens)} → "
                    f"{human(after.tokens)} tokens)"]

    def piggyback(self, tier: str, synchronous_background: bool, effective: int | None = None) -> list[str]:
        """Right after a clearing, which rewrote the payload from the history layers on: commit a
        compaction if one is ready now, so that the two share one cache miss. Nothing waits for the
        summarizer: with background compaction only a finished pre-compaction is taken; in line (a
        replay, `background_compaction=False`) one is made here. `effective`: the usable window, when the
        caller has measured it already (else it is measured here)."""
        if self.state.pending is None and synchronous_background:
            self.background.start_background(effective or self.host.usage().effective, True, now=True)
        return self.compact(tier, "with clearing", only_ready=True) if self.background.ready() else []

    def on_tier(self, tier: str, synchronous_background: bool, effective: int | None = None,
                cleared: bool = False) -> list[str]:
        """warn: pre-compact in the background; compress: commit what is ready (start it if nothing
        is under way); hard: compact now, waiting for the background result first. `effective`: the
        usable window of the usage the tier came from (a second projection of the payload costs
        milliseconds a call once the history is long). `cleared`: a clearing has just rewritten the
        payload, so a pre-compaction ready in time rides on it (`piggyback`) and its range is chosen
        to end at the fill then, not at the compress line."""
        self.state.calls += 1
        if TIERS.index(tier) < TIERS.index("warn"):
            return []
        effective = effective or self.host.usage().effective
        if tier == "warn":
            self.background.start_background(effective, synchronous_background, now=cleared)
            return []
        if tier == "compress":
            if self.state.calls - self.state.last_compaction_call <= limits.REFILL_CALLS and not self.state.refill_skipped:
                self.state.refill_skipped = True
                self.host.log("skip", tier=tier, reason="rapid_refill")
                return ["context refilled right after a compaction; skipping one automatic compaction"]
            self.state.refill_skipped = False
            if self.state.pending is None:
                self.background.start_background(effective, synchronous_background)
            # nothing finished to commit: the lease (two writes, three reads) is not taken
            return self.compact(tier, "auto", only_ready=True) if self.background.ready() else []
        self.state.refill_skipped = False
        return self.compact(tier, "auto")
