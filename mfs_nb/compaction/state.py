"""The compactor's state: the segments in force as the store declares them, the lease as
`exclusive()`, the commit check. The parts that make, settle and schedule segments build on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..events import Event, after
from ..layers import segments as seg
from ..layers.segments import Segment
from ..layers.workset import lines_of
from ..window import budget
from ..window.tokens import estimate_tokens
from . import coldrange, limits
from .breaker import Breaker
from .lease import Lease, live_claims, owner_name
from .protocol import ProtocolRows

if TYPE_CHECKING:
    from ..host import Host


@dataclass
class Pending:
    """A background pre-compaction: the snapshot it works on and, when done, its segment."""

    seq: int
    events: list[Event]
    claim: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    segment: Segment | None = None
    info: dict[str, Any] = field(default_factory=dict)


class CompactorState:
    """Segments of one session, as every kernel's declarations in the store say, and the lease."""

    def __init__(self, host: Host):
        self.host = host
        self.segments: list[Segment] = []
        self.evicted: list[tuple[int, int]] = []
        self.calls = 0
        self.last_compaction_call = -10**9
        self.refill_skipped = False
        self.pending: Pending | None = None
        self.trials: list[Segment] = []  # segments in `segments` for one projection only, not yet declared
        self._trial_lock = threading.Lock()  # `trials` and `segments` change together for `in_force()`
        self._lock = threading.Lock()
        self.recovered: list[str] = []
        self.ignored: list[str] = []
        self.upgrade_done = False
        self.seq = 0
        self.lease = Lease(host.store, host.name, owner_name(host.writer))
        self.rows = ProtocolRows(host, self.lease)
        self.breaker = Breaker(host, limits.BREAKER)  # restored from the session's saved state
        self.load()
        self.recovered += self.ignored  # reported once, when the session opens

    # -- state from the store -------------------------------------------------------------
    def load(self, holding: bool = False) -> None:
        """Segments and evicted ranges from the declarations in the store (any kernel's), in seq
        order; unfinished compactions whose lease is dead are cleaned. `holding`: we hold the
        lease, so every other unfinished compaction is dead."""
        rows = self.host.store.load_compactions(self.host.name)
        by_seq: dict[int, dict[str, dict[str, Any]]] = {}
        for r in rows:
            by_seq.setdefault(r["seq"], {})[r["phase"]] = r
        self.seq = max([self.seq if holding else 0, *by_seq])
        self.segments, self.evicted, self.ignored = [], [], []
        # unfinished rows under a live lease are in progress (ours, when we hold it); the rest crashed
        live = {self.lease.claim} if holding else set(live_claims(self.host.store.load_leases(self.host.name), time.time()))
        mine = self.pending.seq if self.pending is not None else None
        for number in sorted(by_seq):
            phases = by_seq[number]
            declared = phases.get("declared")
            if declared:
                self.honour(declared, number)
            started = phases.get("started")
            if started and not ({"finished", "aborted"} & phases.keys()) and number != mine \
                    and started.get("lease") not in live:
                self.rows.recover(number, bool(declared))
                note = (f"recovered an interrupted compaction (#{number}): "
                        + ("its declaration was complete and stays" if declared else "nothing half-done was kept"))
                self.recovered.append(note)
                self.host.log("recovered", seq=number, declared=bool(declared))

    def refresh(self) -> None:
        """Under the lease: what every kernel committed, and events other kernels appended."""
        self.host.catch_up()
        self.load(holding=True)

    def acquire(self, wait_s: float) -> str | None:
        """Take the lease (or keep ours); the reason when another kernel holds it."""
        if self.lease.held:
            if self.lease.valid():
                return None
            self.lease.release()  # ours expired: start over with a fresh claim
        if self.lease.acquire(wait_s):
            self.refresh()
            return None
        owners = sorted({v["owner"] for v in self.lease.holders().values()})
        return "another kernel is compacting this session" + (f" ({', '.join(owners)})" if owners else "")

    def release(self) -> None:
        if self.pending is None and self.lease.held:
            self.lease.release()

    @contextmanager
    def exclusive(self, wait_s: float = 0.0, *, idle: bool = False) -> Iterator[str | None]:
        """The compaction lease for the block: yields None when it is held (and releases it after,
        unless a background task still needs it), else why it is busy (nothing is taken then).
        `idle`: busy too while this kernel is compacting (a background task under way, the lease held)."""
        if idle and (self.pending is not None or self.lease.held):
            yield "a background compaction of this session is under way"
            return
        busy = self.acquire(wait_s)
        try:
            yield busy
        finally:
            if busy is None:
                self.release()

    @contextmanager
    def trying(self, segment: Segment) -> Iterator[None]:
        """`segment` in force for what the block projects (a preview, `payload_with`), and left out of
        `in_force()`, what other threads read of the session (the indexer, search): it is a trial before
        it is in `segments` and until it has left them."""
        with self._trial_lock:
            self.trials.append(segment)
            self.segments.append(segment)
        try:
            yield
        finally:
            with self._trial_lock:
                self.segments.remove(segment)
                self.trials.remove(segment)

    def in_force(self) -> list[Segment]:
        """The declared segments in force: `segments` without a trial's."""
        with self._trial_lock:
            return [x for x in self.segments if not any(x is y for y in self.trials)]

    def honour(self, row: dict[str, Any], number: int = 0) -> None:
        if row.get("type") == "retract":
            # undo: only the newest segment, while it is still an L0 in force (checked when declared)
            if self.segments and self.segments[-1].id == row["segment_id"] and self.segments[-1].level == 0:
                self.segments.pop()
            else:
                self.ignored.append(f"retraction #{number} names segment #{row['segment_id']}, which is not the "
                                    "newest segment in force; not honoured")
            return
        if row.get("type") == "consolidate":
            named = list(row["segment_ids"])
            at = [i for i, x in enumerate(self.segments) if x.id in named]
            if not consecutive(self.segments, at, named):
                self.ignored.append(f"consolidation #{number} names segments that are not in force; not honoured")
                return
            self.segments[at[0]:at[-1] + 1] = [Segment.from_json(row["segment"])]
            return
        if row.get("type") == "upgrade":
            new = Segment.from_json(row["segment"])
            self.segments = [new if x.uid_from == new.uid_from and x.uid_to == new.uid_to else x for x in self.segments]
            return
        if row.get("type") == "evict":
            ids = set(row["segment_ids"])
            gone = [x for x in self.segments if x.id in ids]
            self.segments = [x for x in self.segments if x.id not in ids]
            for x in gone:
                if self.evicted and self.evicted[-1][1] + 1 >= x.uid_from:
                    self.evicted[-1] = (self.evicted[-1][0], x.uid_to)
                else:
                    self.evicted.append((x.uid_from, x.uid_to))
        else:
            new = Segment.from_json(row["segment"])
            events = self.host.events()
            start = self.covered_to + 1 if self.covered_to else (events[0].uid if events else new.uid_from)
            if new.uid_from != start:
                # a stale writer's declaration: every reader skips it alike, so projections agree
                self.ignored.append(f"declaration #{number} (uids {new.uid_from}–{new.uid_to}) does not follow "
                                    f"the covered prefix (…{self.covered_to}); not honoured")
                return
            self.segments.append(new)

    @property
    def covered_to(self) -> int:
        ends = [x.uid_to for x in self.segments] + [b for _, b in self.evicted]
        return max(ends, default=0)

    def raw(self) -> list[Event]:
        return list(after(self.host.events(), self.covered_to))

    # -- the range -----------------------------------------------------------------------
    def choose(self, effective: int, emergency: bool = False, small_ok: bool = False,
               now: bool = False) -> tuple[list[Event], str]:
        """The cold range (`coldrange.choose`) of what no segment covers yet, keeping raw what the plan
        leaves under the fill (`keep_tail`), measured as the payload in force sends it. `now`: the range
        is committed at once (a compaction riding on a clearing), not at the compress line."""
        raw = self.raw()
        view = self.host.view()
        sent = sent_tokens(view, self.host.counts(view)) if view is not None else {}
        return coldrange.choose(raw, effective, self.keep_tail(effective, raw, now=now, view=view), emergency,
                                small_ok, sent=lambda e: sent.get(e.uid, e.tokens))

    def plan(self, effective: int) -> budget.Plan:
        """The window's budget under the session's settings (`budget.plan`)."""
        return budget.plan(effective, self.host.settings())

    def keep_tail(self, effective: int, raw: Sequence[Event] | None = None, *, now: bool = False,
                  view: Any = None) -> int:
        """The raw tail a compaction keeps, in tokens as the payload sends them: the room the layers
        leave under the planned fill once it is committed — the layers in force, the segment to come
        (guide and fact list), the fact and user-verbatim tracks as the range could fill them
        (`track_room`) — never under the plan's floor. A range chosen below the compress line (the
        pre-compaction at the warn line) is committed there, and what arrives meanwhile joins the tail,
        so that room is left too; one committed at once (`now`: riding on a clearing) leaves none, and
        so ends at the fill like any other. `raw`: the uncovered events, when the caller has them."""
        settings = self.host.settings()
        p = budget.plan(effective, settings)
        view = self.host.view() if view is None else view
        if view is None:
            return p.tail
        tracks = track_room(p, view.layers, self.raw() if raw is None else raw)
        kinds = {layer.kind for layer in view.layers}
        standing = sum(max(layer.tokens, tracks.get(layer.kind, 0)) for layer in view.layers if layer.kind != "raw")
        standing += sum(v for k, v in tracks.items() if k not in kinds)
        segment = coldrange.guide_bounds(p.block)[1] + seg.fact_budget(p.block)[1]
        usage = self.host.usage()
        if usage is None:
            return max(p.tail, p.target - standing - segment)
        # what the meter counts beyond the layers (tool schemas, calibration) stands too
        beyond = max(0, usage.tokens - sum(layer.tokens for layer in view.layers))
        ahead = 0 if now else max(0, int(settings.compress_at * effective) - usage.tokens)
        return max(p.tail, p.target - standing - beyond - segment - ahead)

    def target(self, events: Sequence[Event], effective: int) -> int:
        return coldrange.target(events, self.plan(effective).block)

    # -- one compaction event ----------------------------------------------------------------
    def next_seq(self) -> int:
        """The next protocol number, allocated under the lease from what the store holds."""
        with self._lock:
            stored = max((r["seq"] for r in self.host.store.load_compactions(self.host.name)), default=0)
            self.seq = max(self.seq, stored) + 1
            return self.seq

    # -- committing ------------------------------------------------------------------------
    def commit(self, segment: Segment) -> str | None:
        """Atomic commit, checked against the store right before declaring: we still hold the
        lease, the covered uids start right after the covered prefix as committed by any kernel,
        are contiguous, and their stored hashes are unchanged. Returns the rejection reason, or None."""
        if not self.lease.valid():
            return "the compaction lock expired or was taken over before the commit"
        self.refresh()
        covered = self.host.store.load_events(self.host.name, segment.uid_from, segment.uid_to)
        if segment.uid_from != self.covered_to + 1 and not (self.covered_to == 0 and covered and self.host.events()
                                                            and covered[0].uid == self.host.events()[0].uid):
            return f"range {segment.uid_from}–{segment.uid_to} no longer follows the covered prefix"
        if [e.uid for e in covered] != list(range(segment.uid_from, segment.uid_to + 1)):
            return "covered uids are not contiguous"
        if seg.covered_hash(covered) != segment.covered_hash:
            return "covered events changed since the snapshot"
        self.rows.declare(segment.id, {"segment": segment.to_json()})
        self.segments.append(segment)
        return None

    def payload_with(self, segment: Segment) -> tuple[int, int]:
        """(tokens now, tokens if `segment` were committed): the number the meter would show, both times."""
        now = self.host.usage().tokens
        with self.trying(segment):
            return now, self.host.usage().tokens

    # -- the breaker (breaker.py): what the session, %mfs status and tests read of it ------------
    @property
    def breaker_open(self) -> bool:
        return self.breaker.open

    @property
    def failures(self) -> int:
        return self.breaker.failures

    @property
    def opened_at(self) -> float:
        return self.breaker.opened_at

    def breaker_state(self) -> dict[str, Any]:
        return self.breaker.state()

    def breaker_line(self) -> str:
        """For %mfs status: where the breaker stands and what to do."""
        return self.breaker.line(limits.BREAKER_COOLDOWN_S)


def sent_tokens(view: Any, counts: Sequence[int]) -> dict[int, int]:
    """The tokens each raw event takes in the payload `view` (`counts`: per message), by uid: a cleared
    result counts as its placeholder, a trimmed one as what is left of it."""
    out: dict[int, int] = {}
    for uid, n in zip(view.uids, counts):
        if uid is not None:
            out[uid] = out.get(uid, 0) + n
    return out


def consecutive(segments: Sequence[Segment], at: list[int], ids: list[int]) -> bool:
    """Whether the segments at indices `at` are exactly `ids`, in order and side by side."""
    return bool(at) and [segments[i].id for i in at] == ids and at == list(range(at[0], at[0] + len(ids)))


ENTRY = 8  # tokens a track entry adds to its text: the uid tag, a label, the line break


def track_room(p: budget.Plan, layers: Sequence[Any], raw: Sequence[Event]) -> dict[str, int]:
    """The tokens the fact and user-verbatim tracks may take once a compaction of (part of) `raw` is
    committed: what each holds now plus what the raw part could add to it — the user messages, the
    working-set lines of its messages — within the plan's ceiling; when the user track would overflow,
    the messages it gives up bring their lines into the fact track, so that one is counted full.
    Sizing both at their ceilings whatever the range holds left a compaction of a chat of short
    questions far under the target."""
    held = {layer.kind: layer.tokens for layer in layers}
    verbatim = held.get("verbatim", 0) + sum(e.tokens + ENTRY for e in raw if e.role == "user") + ENTRY
    if verbatim > p.verbatim:  # the user track gives up its oldest messages, whose lines join the fact track
        return {"facts": p.facts, "verbatim": p.verbatim}
    lines = sum(estimate_tokens(x.render()) + 2 for x in lines_of(raw, outputs=p.facts))
    return {"facts": min(p.facts, held.get("facts", 0) + lines + ENTRY), "verbatim": verbatim}
