"""S3 compaction over the append-only log (docs/architecture.md, "Segments (S3)", "The compaction
protocol" and "Failure handling").

One implementation behind three entry points (automatic tiers, `%compact`, `Session.compact`).
Each segment is committed through a protocol appended to the store (its rows: `protocol.py`):

    started (takes the lock) → summary_completed → declared (the only row the projection
    honours) → finished (releases)      — or aborted, with the reason.

The lock is a lease in the store (`lease.py`), valid across processes and machines. Sequence
numbers are allocated under it from what the store holds, and the commit check reads the store
(covered ranges and content hashes as committed by any kernel) right before declaring.

A `started` without `finished`/`aborted` whose lease has expired is a crash: it is reported and
cleaned; a declaration that was written is complete and stays. A declaration that does not
follow the covered prefix (a stale writer) is reported and not honoured, by every reader alike.

This module is the protocol; the policies it carries out are each a module of their own:
`coldrange` (what a compaction covers), `consolidation` (when and what to merge, the gates) and
`terminal` (the sink and eviction once depth is exhausted); the circuit breaker is `breaker`. The
session is reached only through `host.Host`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import coldrange, lang, terminal
from . import consolidation as con
from . import segments as seg
from .breaker import Breaker
from .errors import MfsError
from .events import Event, after
from .lease import Lease, live_claims, owner_name
from .protocol import ProtocolRows
from .segments import Segment
from .summary_check import validate_summary
from .tokens import estimate_tokens
from .usage import TIERS, human, human_pair, tier_label

if TYPE_CHECKING:
    from .host import Host

BLOCK_SHARE = 0.35  # the segment block may take this share before its oldest maps are evicted
BREAKER = 3  # consecutive summarizer failures before automatic LLM compaction stops
REFILL_CALLS = 2  # a compaction needed again within this many calls is a rapid refill
LOCK_WAIT_S = 10.0  # a manual or hard-line compaction waits this long for another kernel's lease
BREAKER_COOLDOWN_S = 600.0  # an open breaker lets one automatic try through after this long (half-open)
EARLIER_CHARS = 40_000  # of earlier summaries shown before a range too large to read at once (a fork)


@dataclass
class Pending:
    """A background pre-compaction: the snapshot it works on and, when done, its segment."""

    seq: int
    events: list[Event]
    claim: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    segment: Segment | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Compactor:
    """Segments of one session and the machinery that makes them."""

    def __init__(self, host: Host):
        self.host = host
        self.segments: list[Segment] = []
        self.evicted: list[tuple[int, int]] = []
        self.calls = 0
        self.last_compaction_call = -10**9
        self.refill_skipped = False
        self.pending: Pending | None = None
        self.trial: Segment | None = None  # a preview's segment, in `segments` for one projection only
        self._lock = threading.Lock()
        self.recovered: list[str] = []
        self.ignored: list[str] = []
        self.upgrade_done = False
        self.seq = 0
        self.lease = Lease(host.store, host.name, owner_name(host.writer))
        self.rows = ProtocolRows(host, self.lease)
        self.breaker = Breaker(host, BREAKER)  # restored from the session's saved state
        self._load()
        self.recovered += self.ignored  # reported once, when the session opens

    # -- state from the store -------------------------------------------------------------
    def _load(self, holding: bool = False) -> None:
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
                self._honour(declared, number)
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
        self._load(holding=True)

    def _acquire(self, wait_s: float) -> str | None:
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

    def _release(self) -> None:
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
        busy = self._acquire(wait_s)
        try:
            yield busy
        finally:
            if busy is None:
                self._release()

    @contextmanager
    def trying(self, segment: Segment) -> Iterator[None]:
        """`segment` in force for what the block projects (a preview), and left out of `in_force()`,
        what other threads read of the session (the indexer, search)."""
        self.trial = segment
        self.segments.append(segment)
        try:
            yield
        finally:
            self.segments.remove(segment)
            self.trial = None

    def in_force(self) -> list[Segment]:
        """The committed segments in force: `segments` without a preview's trial segment."""
        return [x for x in self.segments if x is not self.trial]

    def _honour(self, row: dict[str, Any], number: int = 0) -> None:
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
            if not _consecutive(self.segments, at, named):
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
    def choose(self, effective: int, emergency: bool = False, small_ok: bool = False) -> tuple[list[Event], str]:
        """The cold range (`coldrange.choose`) of what no segment covers yet."""
        return coldrange.choose(self.raw(), effective, emergency, small_ok)

    def target(self, events: Sequence[Event], effective: int) -> int:
        return coldrange.target(events, effective)

    # -- making one segment ----------------------------------------------------------------
    def summarize(self, events: Sequence[Event], effective: int, focus: str = "",
                  earlier: str = "") -> tuple[str | None, dict[str, Any]]:
        """Ask the model for the prose guide; (None, info) on any failure or unusable output."""
        target = self.target(events, effective)
        info: dict[str, Any] = {"target": target, "style": self.host.settings().summary_style, "llm_tokens": 0}
        if self.breaker.open and not self.breaker.may_try(BREAKER_COOLDOWN_S):
            info["error"] = "circuit breaker open: automatic LLM compaction is off for this session"
            return None, info
        shown = _newest_within(events, seg.INPUT_CHARS)
        # a range larger than the compressor reads at once (a fork's whole history): the newest part,
        # after what the earlier summaries (`earlier`) say of the rest
        before = ([{"role": "user", "content": f"(uids {events[0].uid}–{shown[0].uid - 1} came before this and are "
                                              "not shown; their fact lines are kept with the summary"
                                              + (f"; earlier summaries of them:)\n\n{earlier[-EARLIER_CHARS:]}"
                                                 if earlier else ")")}]
                  if shown[0].uid != events[0].uid else [])
        messages = [{"role": "system", "content": self.host.system_prompt()}, *before, *seg.compressor_messages(shown),
                    {"role": "user", "content": seg.instruction(self.host.settings().summary_style, events[0].uid,
                                                                events[-1].uid, target, focus,
                                                                self.language(events[-1].uid))}]
        info["envelope"] = {"model": self.host.settings().model, "messages": len(messages), "tools": False}
        started = time.monotonic()
        try:
            completion = self._summarizer_call(messages)
        except MfsError as exc:
            info["error"] = str(exc)
            return None, info
        except Exception as exc:  # the summarizer must never break the turn
            info["error"] = f"{type(exc).__name__}: {exc}"
            return None, info
        info["duration_s"] = round(time.monotonic() - started, 3)
        usage = completion.usage or {}
        info["llm_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        prose, why = validate_summary(completion.text, events, target)
        if prose is None:
            info["error"] = f"summary rejected: {why}; not committed"
            self.host.log("summary_rejected", reason=why, uid_from=events[0].uid, uid_to=events[-1].uid,
                        chars=len(completion.text or ""))
        elif why:
            info["note"] = why
        return prose, info

    def language(self, upto: int) -> str | None:
        """The conversation's language as the user writes it, from the user's messages up to `upto`."""
        return seg.conversation_language([e for e in self.host.events() if e.uid <= upto])

    def make(self, seq: int, events: list[Event], effective: int, focus: str = "",
             earlier: str = "") -> tuple[Segment, dict[str, Any]]:
        # the user messages of this range join the verbatim track when it commits: classify them
        # now, off the turn when this runs in the background (a failure leaves them own words)
        try:
            self.host.before_cover(events[-1].uid)
        except Exception:
            pass
        prose, info = self.summarize(events, effective, focus, earlier)
        if prose is None and "circuit breaker open" not in str(info.get("error")):
            info["breaker"] = self.breaker.failed()
        elif prose is not None:
            self.breaker.succeeded()
        segment = seg.build(seq, events, prose, effective)
        self.rows.complete(seq, segment, info, degraded=segment.degraded)
        return segment, info

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
        self.segments.append(segment)
        try:
            return now, self.host.usage().tokens
        finally:
            self.segments.remove(segment)

    def upgrade_last_degraded(self, effective: int) -> str | None:
        """Catch-up, once per session: at a compaction event, re-summarize the newest degraded
        segment still in the payload and replace it only if the LLM version is strictly shorter.
        A failed attempt counts toward the circuit breaker like any summarizer failure."""
        degraded = [x for x in self.segments if x.degraded and x.level == 0]
        if self.breaker.open or self.upgrade_done or not degraded:
            return None
        old = degraded[-1]
        events = [e for e in self.host.events() if old.uid_from <= e.uid <= old.uid_to]
        prose, info = self.summarize(events, effective)
        if prose is None:
            self.breaker.failed()
            return None
        self.breaker.succeeded()
        new = seg.build(old.id, events, prose, effective)
        if new.tokens >= old.tokens or new.covered_hash != old.covered_hash:
            return None
        self.upgrade_done = True
        seq = self.next_seq()
        self.rows.start(seq, trigger="upgrade", segment=old.id)
        self.rows.declare(seq, {"type": "upgrade", "segment": new.to_json()})
        self.rows.finish(seq)
        self._honour({"type": "upgrade", "segment": new.to_json()})
        self.host.log("upgrade", segment=old.id, tokens_before=old.tokens, tokens_after=new.tokens,
                    llm_tokens=info.get("llm_tokens", 0))
        return f"segment #{old.id} upgraded from its zero-LLM form: {human(old.tokens)} → {human(new.tokens)} tokens"

    # -- the breaker (breaker.py): what the session, %mfs status and tests read of it ------------
    @property
    def breaker_open(self) -> bool:
        return self.breaker.open

    @breaker_open.setter
    def breaker_open(self, value: bool) -> None:
        self.breaker.open = value

    @property
    def failures(self) -> int:
        return self.breaker.failures

    @property
    def opened_at(self) -> float:
        return self.breaker.opened_at

    @opened_at.setter
    def opened_at(self, value: float) -> None:
        self.breaker.opened_at = value

    def breaker_state(self) -> dict[str, Any]:
        return self.breaker.state()

    def breaker_line(self) -> str:
        """For %mfs status: where the breaker stands and what to do."""
        return self.breaker.line(BREAKER_COOLDOWN_S)

    def _summarizer_call(self, messages: list[dict[str, Any]]) -> Any:
        """One summarizer call; what the provider counted for it (input, cache reads and writes,
        output) is a `summarizer` ledger row, so the session's bill has it (`Session.cost`)."""
        completion = self.host.summarizer().complete(messages, tools=None, stream=False)
        usage = completion.usage or {}
        if usage:
            self.host.log("summarizer", model=completion.model, prompt_tokens=usage.get("prompt_tokens", 0),
                       cached_tokens=usage.get("cached_tokens", 0),
                       cache_write_tokens=usage.get("cache_write_tokens", 0),
                       completion_tokens=usage.get("completion_tokens", 0))
        return completion

    @contextmanager
    def _evicting(self) -> Iterator[list[Segment]]:
        """The maps evicted inside the block (`_evict_oldest`) are declared as one protocol entry at its
        end, under the caller's lease, so a restart agrees; on any failure this kernel's view goes back
        to what the store declares and the error goes on."""
        saved = (list(self.segments), list(self.evicted))
        gone: list[Segment] = []
        try:
            yield gone
            seq = self.next_seq()
            ids = [x.id for x in gone]
            self.rows.start(seq, trigger="evict", segment_ids=ids)
            self.rows.declare(seq, {"type": "evict", "segment_ids": ids})
        except Exception:
            self.segments, self.evicted = saved
            raise
        self.rows.finish(seq)

    def _evict_oldest(self, gone: list[Segment]) -> None:
        gone.append(self.segments[0])
        self._honour({"type": "evict", "segment_ids": [self.segments[0].id]})

    def evict_if_needed(self, effective: int) -> list[Segment]:
        """(b) of the terminal chain (`terminal.py`): the oldest maps leave the payload while the
        block is over its share, then while the payload is over 0.9 × the window — but only when
        leaving can get it there (a payload that is mostly raw is the hard tier's work, not a reason
        to drop every map). Declared like a segment (its own protocol entry), under the lease, so a
        restart agrees; the ledger row says whether the check held. Nothing changes on failure."""
        n = terminal.evictions(self.segments, BLOCK_SHARE * effective)
        if not n or not self.lease.valid():
            return []
        block_before = con.block_tokens(self.segments)
        with self._evicting() as gone:
            for _ in range(n):
                self._evict_oldest(gone)
            usage = self.host.usage()
            limit = terminal.EVICT_CHECK * usage.window
            if usage.tokens - con.block_tokens(self.segments[:-1]) <= limit:
                while usage.tokens > limit and len(self.segments) > 1:
                    self._evict_oldest(gone)
                    usage = self.host.usage()
        ids = [x.id for x in gone]
        self.host.log("eviction", segments=ids, uid_from=gone[0].uid_from, uid_to=gone[-1].uid_to,
                   block_before=block_before, block_after=con.block_tokens(self.segments),
                   payload_after=usage.tokens, window=usage.window, within=usage.tokens <= limit)
        return gone

    # -- consolidation and the terminal chain (policies: consolidation.py, terminal.py) -------
    def settle_block(self, effective: int, tier: str) -> tuple[list[str], list[Segment]]:
        """After a compaction: past ≈ 80 % of its budget, the block's oldest run is consolidated
        (gates permitting); once depth is exhausted the deterministic sink absorbs the coldest L0;
        only what is still over the budget is evicted. `consolidation=False`: eviction only."""
        st = self.host.settings()
        budget = BLOCK_SHARE * effective
        notices: list[str] = []
        for _ in range(2 * st.max_consolidations + 2):  # each pass commits one merge or stops
            if not st.consolidation or not con.over_trigger(self.segments, budget):
                break
            run = con.choose_run(self.segments, st.max_consolidations, st.eager_merge)
            note = self._merge(run, effective, tier) if run else None
            deep = max((x.level for x in self.segments), default=0) >= st.max_consolidations
            if note is None and (not run or deep) and con.block_tokens(self.segments) > budget:
                # the chain's end: no run left, or a run the gates turned down while depth is
                # exhausted; the sink comes before any eviction (issue 15, terminal chain)
                sink = terminal.sink_run(self.segments)
                note = self._merge(sink, effective, tier, sink=True) if sink else None
            if note is None:
                break
            notices.append(note)
        return notices, self.evict_if_needed(effective)

    def _merge(self, run: list[int], effective: int, tier: str, sink: bool = False) -> str | None:
        """One consolidation (or, `sink`, the terminal chain's zero-LLM merge) through the same
        protocol as a compaction: started → summary_completed → declared → finished, or aborted
        with the gate or the reason. Returns the notice, or None when nothing was committed."""
        s, st = self.host, self.host.settings()
        members = [self.segments[i] for i in run]
        ids = [x.id for x in members]
        events = [e for e in s.events() if members[0].uid_from <= e.uid <= members[-1].uid_to]
        seq = self.next_seq()
        kind = "sink" if sink else "consolidate"
        self.rows.start(seq, trigger=kind, tier=tier, segment_ids=ids, uid_from=members[0].uid_from,
                        uid_to=members[-1].uid_to)
        info: dict[str, Any] = {"llm_tokens": 0}
        if sink:
            prose: str | None = terminal.sink_prose(members)
        else:
            prose, info = self.merge_prose(members, effective)
            if prose is None and tier == "hard":  # only at the hard tier: a deterministic merge instead
                prose, info["degraded"] = terminal.sink_prose(members), True
        level = st.max_consolidations if sink else min(max(x.level for x in members) + 1, st.max_consolidations)
        row = {"merge": kind, "tier": tier, "segments": ids, "uid_from": members[0].uid_from,
               "uid_to": members[-1].uid_to, "llm_tokens": info.get("llm_tokens", 0), "level": level}
        if prose is None:
            self.rows.abort(seq, info.get("error", "no summary"))
            s.log("consolidation", accepted=False, gate="", error=info.get("error", "no summary"), **row)
            return None
        merged = seg.merged(seq, members, events, prose, level, effective)
        if sink:  # the chain's end stays bounded: the whole map within SINK_SHARE of the block budget
            room = int(BLOCK_SHARE * effective * terminal.SINK_SHARE) - (merged.tokens - estimate_tokens(merged.prose))
            merged = seg.merged(seq, members, events, terminal.bounded(prose, max(room, 60), members[-1].language),
                                level, effective)
        self.rows.complete(seq, merged, info, segment_ids=ids)
        view = s.view()
        first = next((i for i, x in enumerate(view.layers) if x.kind == "segment" and x.uid_from == members[0].uid_from), 1)
        miss = sum(x.tokens for x in view.layers[first:])
        before = con.block_tokens(self.segments)
        after = before - sum(x.tokens for x in members) + merged.tokens
        gates = con.gates(miss, before, after, hard=sink or tier == "hard", miss_weight=s.miss_weight())
        if not gates.passed:
            self.rows.abort(seq, f"gate: {gates.failed}", **gates.to_json())
            s.log("consolidation", **row, **gates.to_json())
            return None
        rejected = self._check_members(ids, members)
        if rejected:
            self.rows.abort(seq, rejected)
            s.log("consolidation", **row, **{**gates.to_json(), "accepted": False, "gate": "commit"}, reason=rejected)
            return None
        declaration = {"type": "consolidate", "segment_ids": ids, "segment": merged.to_json()}
        self.rows.declare(seq, declaration)
        self._honour(declaration, seq)
        self.rows.finish(seq)
        s.log("consolidation", **row, **gates.to_json(), degraded=bool(info.get("degraded")))  # `miss`: the cache miss it caused
        what = "folded" if sink else "merged"
        return (f"{what} {len(ids)} summaries ({', '.join(f'#{i}' for i in ids)}; uids {merged.uid_from}–"
                f"{merged.uid_to}) into one (−{human(gates.freed)} tokens"
                + (", without a model call" if sink or info.get("degraded") else "") + ")")

    def _check_members(self, ids: list[int], members: list[Segment]) -> str | None:
        """The atomic check of a consolidation: we still hold the lease, and the members are still
        in force, consecutive and unchanged as committed by any kernel."""
        if not self.lease.valid():
            return "the compaction lock expired or was taken over before the commit"
        self.refresh()
        now = {x.id: x for x in self.segments}
        if not _consecutive(self.segments, [i for i, x in enumerate(self.segments) if x.id in ids], ids):
            return "the segments to merge are no longer in force"
        if any(now[x.id].covered_hash != x.covered_hash for x in members):
            return "a segment to merge changed since it was read"
        return None

    def merge_prose(self, members: list[Segment], effective: int) -> tuple[str | None, dict[str, Any]]:
        """The members' guides merged by the summarizer (the one summary of summaries the design
        allows); (None, info) on any failure or unusable output — the originals then stay."""
        target = min(con.merge_target(members), int(0.2 * effective))
        info: dict[str, Any] = {"target": target, "llm_tokens": 0}
        messages = [{"role": "system", "content": self.host.system_prompt()},
                    *con.merge_messages(members, target, self.language(members[-1].uid_to))]
        info["envelope"] = {"model": self.host.settings().model, "messages": len(messages), "tools": False}
        try:
            completion = self._summarizer_call(messages)
        except Exception as exc:  # a failed consolidation keeps the originals; it never breaks the turn
            info["error"] = f"{type(exc).__name__}: {exc}"
            return None, info
        usage = completion.usage or {}
        info["llm_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        guides = [Event(x.uid_from, self.host.name, 0, "user", x.prose) for x in members]
        prose, why = validate_summary(completion.text, guides, target)
        if prose is None:
            info["error"] = f"merged guide rejected: {why}"
        return prose, info

    # -- one compaction event ----------------------------------------------------------------
    def next_seq(self) -> int:
        """The next protocol number, allocated under the lease from what the store holds."""
        with self._lock:
            stored = max((r["seq"] for r in self.host.store.load_compactions(self.host.name)), default=0)
            self.seq = max(self.seq, stored) + 1
            return self.seq

    def compact(self, tier: str, reason: str, focus: str = "", *, manual: bool = False,
                only_ready: bool = False) -> list[str]:
        """Commit what the background made, then make and commit segments until pressure is under
        the target or nothing is left. `only_ready`: commit the finished background result only."""
        s = self.host
        with self.exclusive(LOCK_WAIT_S if manual or tier == "hard" else 0.0) as busy:
            if busy:
                s.log("skip", tier=tier, reason="locked", trigger=reason, detail=busy)
                return [f"{busy}; this compaction was skipped" + ("; try %compact again in a moment" if manual else "")]
            return self._compact_locked(tier, reason, focus, manual=manual, only_ready=only_ready)

    def cover(self, events: list[Event], reason: str, focus: str = "",
              earlier: str = "") -> tuple[Segment | None, list[str]]:
        """One segment over exactly `events` — a fork's whole inherited history — committed even when
        it is not smaller than the events (the fork starts from a summary by design). When the range
        is more than the compressor takes at once, the summarizer reads the newest events that fit,
        after `earlier` (the parent's segments: their text stands for what came before)."""
        with self.exclusive(LOCK_WAIT_S) as busy:
            if busy:
                return None, [f"{busy}; try again in a moment"]
            before = self.host.usage()
            seq = self.next_seq()
            self.rows.start(seq, trigger=reason, tier=before.tier, uid_from=events[0].uid, uid_to=events[-1].uid)
            segment, info = self.make(seq, events, before.effective, focus, earlier)
            rejected = self.commit(segment)
            if rejected:
                self.rows.abort(seq, rejected)
                return None, [f"the fork's summary was not committed: {rejected}"]
            self.rows.finish(seq)
            self.host.log("compaction", tier=before.tier, trigger=reason, tokens_before=before.tokens,
                       tokens_after=self.host.usage().tokens, llm_tokens=info.get("llm_tokens", 0),
                       uid_from=segment.uid_from, uid_to=segment.uid_to, segments=[segment.id],
                       degraded=segment.degraded, evicted=[])
            return segment, self._notes(segment, info, before.tier)

    def undo(self) -> list[str]:
        """Retract the newest segment (`%compact --undo`): an append-only declaration that the
        projection honours, so its uids are raw again. Only when they fit below the warn line (else
        the next call would compact them again) and the segment is still an L0 in force."""
        s = self.host
        with self.exclusive(LOCK_WAIT_S) as busy:
            if busy:
                return [f"{busy}; nothing was undone; try again in a moment"]
            self.refresh()
            if not self.segments:
                return ["nothing to undo: no segment is in the payload"
                        + (" (older maps were evicted; their uids are recallable)" if self.evicted else "")]
            last = self.segments[-1]
            where = f"segment #{last.id} (uids {last.uid_from}–{last.uid_to})"
            if last.level > 0:
                return [f"nothing undone: {where} consolidates earlier segments; only the newest compaction "
                        f"can be undone, before it is consolidated (recall_history({last.uid_from}, {last.uid_to}) "
                        "shows the originals)"]
            before = s.usage()
            self.segments.pop()
            try:
                after = s.usage()
            finally:
                self.segments.append(last)
            if after.tier != "ok":
                return [f"nothing undone: with uids {last.uid_from}–{last.uid_to} raw again the payload would be "
                        f"{human(after.tokens)} tokens, past the warn line ({tier_label(after.tier)}), and the next "
                        f"call would compact them again; %recall {last.uid_from}-{last.uid_to} shows them"]
            seq = self.next_seq()
            self.rows.start(seq, trigger="undo", segment=last.id)
            declaration = {"type": "retract", "segment_id": last.id, "uid_from": last.uid_from, "uid_to": last.uid_to}
            self.rows.declare(seq, declaration)
            self._honour(declaration, seq)
            self.rows.finish(seq)
            s.log("undo", segment=last.id, uid_from=last.uid_from, uid_to=last.uid_to, tokens_before=before.tokens,
                  tokens_after=after.tokens)
            return [f"undid {where}: those messages are raw again ({human(before.tokens)} → "
                    f"{human(after.tokens)} tokens)"]

    def _compact_locked(self, tier: str, reason: str, focus: str, *, manual: bool, only_ready: bool) -> list[str]:
        s = self.host
        if manual and self.breaker.open:
            self.breaker.half_open = True  # the user's %compact tries the model once
        before = s.usage()
        effective = before.effective
        notices: list[str] = []
        made: list[Segment] = []
        llm_tokens = 0
        digests: list[Segment] = []  # committed as the zero-LLM digest because the summary was not smaller
        stuck: str | None = None  # at the hard tier and not even the digest made the payload smaller: why
        started = time.monotonic()
        upgraded = self.upgrade_last_degraded(effective)
        if upgraded:
            notices.append(upgraded)
        ready = self.take_pending(wait=not only_ready)
        if ready:
            made.append(ready[0])
            llm_tokens += ready[1].get("llm_tokens", 0)
            notices += self._notes(ready[0], ready[1], tier)
        wider: list[Event] = []  # at the hard line, after a range not even the digest made smaller: all of it
        widened = False
        while not only_ready and s.usage().tokens >= coldrange.TARGET_AFTER * effective or manual and not made:
            events, why = (wider, "") if wider else self.choose(effective, small_ok=manual)
            wider = []
            if not events and s.usage().tier == "hard":
                events, why = self.choose(effective, emergency=True)
            if not events:
                if not made:
                    s.log("skip", tier=tier, reason=why, trigger=reason, tokens=before.tokens)
                    if manual:
                        notices.append("nothing to compact" + (f" ({why.replace('_', ' ')})" if why else ""))
                break
            seq = self.next_seq()
            self.rows.start(seq, trigger=reason, tier=tier, uid_from=events[0].uid, uid_to=events[-1].uid)
            segment, info = self.make(seq, events, effective, focus)
            llm_tokens += info.get("llm_tokens", 0)
            now, then = self.payload_with(segment)
            over = tier == "hard" or now >= effective
            if then >= now and over and not segment.degraded:
                # the hard tier always ends below the window (issue 39): a summary that does not make
                # the payload smaller gives way to the zero-LLM digest of the same range
                seq, segment, info = self._digest_instead(seq, segment, events, effective, tier, reason, now, then)
                now, then = self.payload_with(segment)
            if then >= now:
                # a segment that does not make the payload smaller is not committed (issue 17)
                self.rows.abort(seq, "not_smaller", tokens=[now, then])
                s.log("skip", tier=tier, reason="not_smaller", trigger=reason, tokens_before=now, tokens_after=then,
                       uid_from=segment.uid_from, uid_to=segment.uid_to)
                if over:  # the terminal chain below takes over; its notice says what happened
                    stuck = "" if info.get("fallback") else str(info.get("error") or "")
                    if not widened:  # once: the whole raw history but the current turn, where a capped guide pays
                        widened = True
                        wider = self.choose(effective, emergency=True)[0]
                        if len(wider) > len(events):
                            continue
                        wider = []
                elif not made:
                    tokens = sum(seg.event_tokens(e) for e in events)
                    notices.append(lang.text("not_worth", self.language(events[-1].uid), n=len(events),
                                             tokens=human(tokens), now=human(now), then=human(then)))
                break
            rejected = self.commit(segment)
            if rejected:
                self.rows.abort(seq, rejected)
                s.log("commit_rejected", tier=tier, reason=rejected, uid_from=segment.uid_from, uid_to=segment.uid_to)
                notices.append(f"compaction result dropped: {rejected}")
                break
            self.rows.finish(seq)
            made.append(segment)
            stuck = None  # a range starts at the oldest raw event: this one covers any that stayed raw
            if info.get("fallback"):
                digests.append(segment)
                s.log("degraded", tier=tier, seq=segment.id, reason="not_smaller", error=info.get("error", ""),
                      uid_from=segment.uid_from, uid_to=segment.uid_to)
            else:
                notices += self._notes(segment, info, tier)
            manual = False
        merged: list[str] = []
        evicted: list[Segment] = []
        if made:
            merged, evicted = self.settle_block(effective, tier)
        fell_back: list[Segment] = []
        if (digests or stuck is not None) and s.usage().tier == "hard":
            # still at the hard line, a reply away from the window: the terminal chain to its end
            sunk, fell_back = self.to_window(effective, tier)
            merged += sunk
        if digests or fell_back or (stuck is not None and not made):
            notices.append(self._fallback_note(digests, stuck, fell_back, s.usage().tokens < effective))
            if not made and (merged or fell_back):
                self.last_compaction_call = self.calls  # the payload was rewritten: a compaction event
        if made:
            after = s.usage()
            self.last_compaction_call = self.calls
            uid_from, uid_to = made[0].uid_from, made[-1].uid_to
            ids = f"#{made[0].id}" if len(made) == 1 else f"#{made[0].id}–#{made[-1].id}"
            s.log("compaction", tier=tier, trigger=reason, tokens_before=before.tokens, tokens_after=after.tokens,
                   llm_tokens=llm_tokens, uid_from=uid_from, uid_to=uid_to, segments=[x.id for x in made],
                   degraded=any(x.degraded for x in made), duration_s=round(time.monotonic() - started, 3),
                   evicted=[x.id for x in evicted + fell_back])
            notices.insert(0, lang.text("compacted", self.language(uid_to), **dict(zip(
                ("before", "after"), human_pair(before.tokens, after.tokens))), ids=ids, a=uid_from, b=uid_to))
            notices += merged
            if evicted:
                notices.append(f"the oldest {len(evicted)} segment map{'s' if len(evicted) > 1 else ''} left the "
                               f"payload (uids {evicted[0].uid_from}–{evicted[-1].uid_to} stay recallable)")
        return notices

    def _digest_instead(self, seq: int, summary: Segment, events: list[Event], effective: int, tier: str,
                        reason: str, now: int, then: int) -> tuple[int, Segment, dict[str, Any]]:
        """The hard tier's answer to a summary that would not make the payload smaller (a model that
        ignored the target length): the summary's protocol number is aborted, and the zero-LLM digest
        of the same range is made under the next one (started → summary_completed → declared →
        finished, as any compaction). Returns (seq, digest, info) for the caller to check and commit."""
        s = self.host
        self.rows.abort(seq, "not_smaller", tokens=[now, then], fallback="degraded")
        s.log("skip", tier=tier, reason="not_smaller", trigger=reason, tokens_before=now, tokens_after=then,
              uid_from=summary.uid_from, uid_to=summary.uid_to, fallback="degraded")
        seq = self.next_seq()
        self.rows.start(seq, trigger=reason, tier=tier, uid_from=events[0].uid, uid_to=events[-1].uid,
                        fallback="not_smaller")
        digest = seg.build(seq, events, None, effective)
        error = f"the summary would not make the payload smaller ({now} → {then} tokens)"
        self.rows.complete(seq, digest, {"envelope": None, "error": error}, degraded=True)
        return seq, digest, {"fallback": True, "error": error, "llm_tokens": 0}

    def to_window(self, effective: int, tier: str) -> tuple[list[str], list[Segment]]:
        """The terminal chain to its end, for a payload still at the hard line after a summary that was
        not smaller: the deterministic sink (when it makes the block smaller), then the oldest maps
        leave — the newest too, if need be — until the payload is under the hard line (so below the
        usable window, `effective`, with room for the reply) or no map is left. Returns (the sink's
        notices, the segments evicted). Their uids stay recallable."""
        notices: list[str] = []
        run = terminal.sink_run(self.segments)
        note = self._merge(run, effective, tier, sink=True) if run else None
        if note:
            notices.append(note)
        if self.host.usage().tier != "hard" or not self.segments or not self.lease.valid():
            return notices, []
        block_before = con.block_tokens(self.segments)
        with self._evicting() as gone:
            usage = self.host.usage()
            while usage.tier == "hard" and self.segments:
                self._evict_oldest(gone)
                usage = self.host.usage()
        ids = [x.id for x in gone]
        self.host.log("eviction", segments=ids, uid_from=gone[0].uid_from, uid_to=gone[-1].uid_to,
                   block_before=block_before, block_after=con.block_tokens(self.segments),
                   payload_after=usage.tokens, window=usage.window, within=usage.tokens < effective,
                   reason="over_window")
        return notices, gone

    @staticmethod
    def _fallback_note(digests: list[Segment], stuck: str | None, gone: list[Segment], within: bool) -> str:
        """The one notice of a hard-tier compaction whose summary was not smaller: what was kept instead.
        `digests`: what was committed instead; `stuck`: None, or why a range stayed raw because even its
        digest was not smaller ("" after a summary that was not smaller, the summarizer's error after a failure)."""
        if digests:
            ids = f"#{digests[0].id}" if len(digests) == 1 else f"#{digests[0].id}–#{digests[-1].id}"
            text = ("the summary was longer than what it replaced; kept a shorter automatic digest instead "
                    f"(segment{'s' if len(digests) > 1 else ''} {ids}: verbatim heads, tails and fact lines)")
        elif stuck:
            text = (f"summarizer unavailable ({_short(stuck)}), and the automatic digest was not smaller than what "
                    "it would replace; those messages stay as they were")
        else:
            text = ("the summary was longer than what it replaced, and so was the automatic digest; those messages "
                    "stay as they were")
        if gone:
            text += (f"; to fit the usable window, {len(gone)} segment map{'s' if len(gone) > 1 else ''} "
                     f"left the payload (uids {gone[0].uid_from}–{gone[-1].uid_to} stay recallable)")
        if not within:
            text += "; the context is still over the usable window, and nothing older is left to take out"
        return text

    def _notes(self, segment: Segment, info: dict[str, Any], tier: str) -> list[str]:
        """Ledger rows and notices for a degraded segment and for the breaker opening (once)."""
        if not segment.degraded:
            return []
        self.host.log("degraded", tier=tier, seq=segment.id, error=info.get("error", ""), uid_from=segment.uid_from,
                    uid_to=segment.uid_to)
        if info.get("breaker"):
            return ["automatic LLM compaction stopped after 3 failures in a row; history is kept with zero-LLM "
                    "segments. Fix the model, then %compact, or start over with %mfs new NAME"]
        if self.breaker.open:
            return []
        return [f"summarizer unavailable ({_short(info.get('error', ''))}); segment #{segment.id} keeps verbatim "
                "heads, tails and fact lines instead"]

    # -- background pre-compaction -----------------------------------------------------------
    def start_background(self, effective: int, synchronous: bool) -> bool:
        """At the warn line: compress cold history into an L0 segment from a snapshot, off the turn."""
        if self.pending is not None or self.breaker.open:
            return False
        if not self.choose(effective)[0]:  # nothing cold to compress: the lease (two writes, three reads) is not taken
            return False
        if self._acquire(0.0):
            return False
        events, _ = self.choose(effective)  # again: the lease brought what other kernels declared
        if not events:
            self._release()
            return False
        seq = self.next_seq()
        self.rows.start(seq, trigger="background", tier="warn", uid_from=events[0].uid, uid_to=events[-1].uid)
        pending = Pending(seq, list(events), self.lease.claim)
        self.pending = pending

        def work() -> None:
            try:
                pending.segment, pending.info = self.make(seq, pending.events, effective)
            except Exception as exc:  # the background task never breaks a turn
                pending.info = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                pending.done.set()

        if synchronous:
            work()
        else:
            threading.Thread(target=work, daemon=True, name=f"mfs-precompact-{seq}").start()
        return True

    def take_pending(self, wait: bool = False) -> tuple[Segment, dict[str, Any]] | None:
        """Commit a finished background result (or drop it with commit_rejected)."""
        pending = self.pending
        if pending is None or (not pending.done.is_set() and not wait):
            return None
        pending.done.wait()
        self.pending = None
        if not self.lease.held or self.lease.claim != pending.claim:  # the lease lapsed meanwhile: stale
            self.rows.abort(pending.seq, "lease lost")
            return None
        if pending.segment is None:
            self.rows.abort(pending.seq, pending.info.get("error", "no result"))
            return None
        now, then = self.payload_with(pending.segment)
        rejected = self.commit(pending.segment) if then < now else f"would not make the payload smaller ({now} → {then} tokens)"
        if rejected:
            self.rows.abort(pending.seq, rejected)
            self.host.log("commit_rejected", tier="compress", reason=rejected, uid_from=pending.segment.uid_from,
                        uid_to=pending.segment.uid_to)
            return None
        self.rows.finish(pending.seq)
        return pending.segment, pending.info

    # -- the tier hook -----------------------------------------------------------------------
    def _ready(self) -> bool:
        """Whether a background pre-compaction has finished and waits to be committed."""
        return self.pending is not None and self.pending.done.is_set()

    def piggyback(self, tier: str, synchronous_background: bool, effective: int | None = None) -> list[str]:
        """Right after a clearing, which rewrote the payload from the history layers on: commit a
        compaction if one is ready now, so that the two share one cache miss. Nothing waits for the
        summarizer: with background compaction only a finished pre-compaction is taken; in line (a
        replay, `background_compaction=False`) one is made here. `effective`: the usable window, when the
        caller has measured it already (else it is measured here)."""
        if self.pending is None and synchronous_background:
            self.start_background(effective or self.host.usage().effective, True)
        return self.compact(tier, "with clearing", only_ready=True) if self._ready() else []

    def on_tier(self, tier: str, synchronous_background: bool, effective: int | None = None) -> list[str]:
        """warn: pre-compact in the background; compress: commit what is ready (start it if nothing
        is under way); hard: compact now, waiting for the background result first. `effective`: the
        usable window of the usage the tier came from (a second projection of the payload costs
        milliseconds a call once the history is long)."""
        self.calls += 1
        if TIERS.index(tier) < TIERS.index("warn"):
            return []
        effective = effective or self.host.usage().effective
        if tier == "warn":
            self.start_background(effective, synchronous_background)
            return []
        if tier == "compress":
            if self.calls - self.last_compaction_call <= REFILL_CALLS and not self.refill_skipped:
                self.refill_skipped = True
                self.host.log("skip", tier=tier, reason="rapid_refill")
                return ["context refilled right after a compaction; skipping one automatic compaction"]
            self.refill_skipped = False
            if self.pending is None:
                self.start_background(effective, synchronous_background)
            # nothing finished to commit: the lease (two writes, three reads) is not taken
            return self.compact(tier, "auto", only_ready=True) if self._ready() else []
        self.refill_skipped = False
        return self.compact(tier, "auto")


def _consecutive(segments: Sequence[Segment], at: list[int], ids: list[int]) -> bool:
    """Whether the segments at indices `at` are exactly `ids`, in order and side by side."""
    return bool(at) and [segments[i].id for i in at] == ids and at == list(range(at[0], at[0] + len(ids)))


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text[:120] + ("…" if len(text) > 120 else "")


def _newest_within(events: Sequence[Event], max_chars: int) -> list[Event]:
    """`events`, or when the compressor would read more than `max_chars` of them, the newest that
    fit, starting at a turn start (a call never without its result). Ranges the cold-range choice
    makes always fit; a fork's whole history may not."""
    if sum(seg.compressor_chars(e) for e in events) <= max_chars:
        return list(events)
    used, start = 0, len(events) - 1
    for i in range(len(events) - 1, -1, -1):
        used += seg.compressor_chars(events[i])
        if used > max_chars and i < len(events) - 1:
            break
        if events[i].turn_start:
            start = i
    return list(events[start:])
