"""The segment block after a compaction: consolidation (gates permitting), the terminal chain's sink,
and the eviction of the oldest maps, each through the protocol."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..layers import segments as seg
from ..layers.segments import Segment
from ..window.tokens import estimate_tokens
from ..window.usage import human
from . import consolidation as con
from . import terminal
from .state import consecutive

if TYPE_CHECKING:
    from .making import SegmentMaking
    from .state import CompactorState


class BlockWork:
    """What keeps the segment block within its share of the window: merges through `making`, the
    protocol and the segments in force through `state`."""

    def __init__(self, state: CompactorState, making: SegmentMaking):
        self.state, self.making = state, making
        self.host = state.host

    # -- consolidation and the terminal chain (policies: consolidation.py, terminal.py) -------
    def settle_block(self, effective: int, tier: str) -> tuple[list[str], list[Segment]]:
        """After a compaction: past ≈ 80 % of its budget, the block's oldest run is consolidated
        (gates permitting); when no run can be merged the deterministic sink absorbs the coldest L0;
        only what is still over the budget is evicted. `consolidation=False`: eviction only."""
        st = self.host.settings()
        budget = self.state.plan(effective).block
        notices: list[str] = []
        for _ in range(2 * st.max_consolidations + 2):  # each pass commits one merge or stops
            if not st.consolidation or not con.over_trigger(self.state.segments, budget):
                break
            run = con.choose_run(self.state.segments, st.max_consolidations, st.eager_merge)
            note = self.merge(run, effective, tier) if run else None
            if note is None and con.block_tokens(self.state.segments) > budget:
                # the chain's end: no run left, or a run the gates turned down (at the depth limit,
                # or at 8k, where two small maps merged free too little of the block): the sink comes
                # before any eviction (issue 15, terminal chain)
                sink = terminal.sink_run(self.state.segments)
                note = self.merge(sink, effective, tier, sink=True) if sink else None
            if note is None:
                break
            notices.append(note)
        return notices, self.evict_if_needed(effective)

    def merge(self, run: list[int], effective: int, tier: str, sink: bool = False) -> str | None:
        """One consolidation (or, `sink`, the terminal chain's zero-LLM merge) through the same
        protocol as a compaction: started → summary_completed → declared → finished, or aborted
        with the gate or the reason. Returns the notice, or None when nothing was committed."""
        s, st = self.host, self.host.settings()
        members = [self.state.segments[i] for i in run]
        ids = [x.id for x in members]
        events = [e for e in s.events() if members[0].uid_from <= e.uid <= members[-1].uid_to]
        seq = self.state.next_seq()
        kind = "sink" if sink else "consolidate"
        self.state.rows.start(seq, trigger=kind, tier=tier, segment_ids=ids, uid_from=members[0].uid_from,
                        uid_to=members[-1].uid_to)
        info: dict[str, Any] = {"llm_tokens": 0}
        if sink:
            prose: str | None = terminal.sink_prose(members)
        else:
            prose, info = self.making.merge_prose(members, effective)
            if prose is None and tier == "hard":  # only at the hard tier: a deterministic merge instead
                prose, info["degraded"] = terminal.sink_prose(members), True
        level = st.max_consolidations if sink else min(max(x.level for x in members) + 1, st.max_consolidations)
        row = {"merge": kind, "tier": tier, "segments": ids, "uid_from": members[0].uid_from,
               "uid_to": members[-1].uid_to, "llm_tokens": info.get("llm_tokens", 0), "level": level}
        if prose is None:
            self.state.rows.abort(seq, info.get("error", "no summary"))
            s.log("consolidation", accepted=False, gate="", error=info.get("error", "no summary"), **row)
            return None
        merged = seg.merged(seq, members, events, prose, level, self.state.plan(effective).block)
        if sink:  # the chain's end stays bounded: the whole map within SINK_SHARE of the block budget
            room = int(self.state.plan(effective).block * terminal.SINK_SHARE) - (merged.tokens - estimate_tokens(merged.prose))
            merged = seg.with_prose(merged, terminal.bounded(prose, max(room, 60), members[-1].language))
        self.state.rows.complete(seq, merged, info, segment_ids=ids)
        view = s.view()
        first = next((i for i, x in enumerate(view.layers) if x.kind == "segment" and x.uid_from == members[0].uid_from), 1)
        miss = sum(x.tokens for x in view.layers[first:])
        before = con.block_tokens(self.state.segments)
        after = before - sum(x.tokens for x in members) + merged.tokens
        gates = con.gates(miss, before, after, hard=sink or tier == "hard", miss_weight=s.miss_weight())
        if not gates.passed:
            self.state.rows.abort(seq, f"gate: {gates.failed}", **gates.to_json())
            s.log("consolidation", **row, **gates.to_json())
            return None
        rejected = self._check_members(ids, members)
        if rejected:
            self.state.rows.abort(seq, rejected)
            s.log("consolidation", **row, **{**gates.to_json(), "accepted": False, "gate": "commit"}, reason=rejected)
            return None
        declaration = {"type": "consolidate", "segment_ids": ids, "segment": merged.to_json()}
        self.state.rows.declare(seq, declaration)
        self.state.honour(declaration, seq)
        self.state.rows.finish(seq)
        s.log("consolidation", **row, **gates.to_json(), degraded=bool(info.get("degraded")))  # `miss`: the cache miss it caused
        what = "folded" if sink else "merged"
        return (f"{what} {len(ids)} summaries ({', '.join(f'#{i}' for i in ids)}; uids {merged.uid_from}–"
                f"{merged.uid_to}) into one (−{human(gates.freed)} tokens"
                + (", without a model call" if sink or info.get("degraded") else "") + ")")

    def _check_members(self, ids: list[int], members: list[Segment]) -> str | None:
        """The atomic check of a consolidation: we still hold the lease, and the members are still
        in force, consecutive and unchanged as committed by any kernel."""
        if not self.state.lease.valid():
            return "the compaction lock expired or was taken over before the commit"
        self.state.refresh()
        now = {x.id: x for x in self.state.segments}
        if not consecutive(self.state.segments, [i for i, x in enumerate(self.state.segments) if x.id in ids], ids):
            return "the segments to merge are no longer in force"
        if any(now[x.id].covered_hash != x.covered_hash for x in members):
            return "a segment to merge changed since it was read"
        return None

    @contextmanager
    def _evicting(self) -> Iterator[list[Segment]]:
        """The maps evicted inside the block (`_evict_oldest`) are declared as one protocol entry at its
        end, under the caller's lease, so a restart agrees; on any failure this kernel's view goes back
        to what the store declares and the error goes on."""
        saved = (list(self.state.segments), list(self.state.evicted))
        gone: list[Segment] = []
        try:
            yield gone
            seq = self.state.next_seq()
            ids = [x.id for x in gone]
            self.state.rows.start(seq, trigger="evict", segment_ids=ids)
            self.state.rows.declare(seq, {"type": "evict", "segment_ids": ids})
        except Exception:
            self.state.segments, self.state.evicted = saved
            raise
        self.state.rows.finish(seq)

    def _evict_oldest(self, gone: list[Segment]) -> None:
        gone.append(self.state.segments[0])
        self.state.honour({"type": "evict", "segment_ids": [self.state.segments[0].id]})

    def evict_if_needed(self, effective: int) -> list[Segment]:
        """(b) of the terminal chain (`terminal.py`): the oldest maps leave the payload while the
        block is over its share, then while the payload is over 0.9 × the window — but only when
        leaving can get it there (a payload that is mostly raw is the hard tier's work, not a reason
        to drop every map). Declared like a segment (its own protocol entry), under the lease, so a
        restart agrees; the ledger row says whether the check held. Nothing changes on failure."""
        n = terminal.evictions(self.state.segments, self.state.plan(effective).block)
        if not n or not self.state.lease.valid():
            return []
        block_before = con.block_tokens(self.state.segments)
        with self._evicting() as gone:
            for _ in range(n):
                self._evict_oldest(gone)
            usage = self.host.usage()
            limit = terminal.EVICT_CHECK * usage.window
            if usage.tokens - con.block_tokens(self.state.segments[:-1]) <= limit:
                while usage.tokens > limit and len(self.state.segments) > 1:
                    self._evict_oldest(gone)
                    usage = self.host.usage()
        ids = [x.id for x in gone]
        self.host.log("eviction", segments=ids, uid_from=gone[0].uid_from, uid_to=gone[-1].uid_to,
                   block_before=block_before, block_after=con.block_tokens(self.state.segments),
                   payload_after=usage.tokens, window=usage.window, within=usage.tokens <= limit)
        return gone

    def to_window(self, effective: int, tier: str) -> tuple[list[str], list[Segment]]:
        """The terminal chain to its end, for a payload still at the hard line after a summary that was
        not smaller: the deterministic sink (when it makes the block smaller), then the oldest maps
        leave — the newest too, if need be — until the payload is under the hard line (so below the
        usable window, `effective`, with room for the reply) or no map is left. Returns (the sink's
        notices, the segments evicted). Their uids stay recallable."""
        notices: list[str] = []
        run = terminal.sink_run(self.state.segments)
        note = self.merge(run, effective, tier, sink=True) if run else None
        if note:
            notices.append(note)
        if self.host.usage().tier != "hard" or not self.state.segments or not self.state.lease.valid():
            return notices, []
        block_before = con.block_tokens(self.state.segments)
        with self._evicting() as gone:
            usage = self.host.usage()
            while usage.tier == "hard" and self.state.segments:
                self._evict_oldest(gone)
                usage = self.host.usage()
        ids = [x.id for x in gone]
        self.host.log("eviction", segments=ids, uid_from=gone[0].uid_from, uid_to=gone[-1].uid_to,
                   block_before=block_before, block_after=con.block_tokens(self.state.segments),
                   payload_after=usage.tokens, window=usage.window, within=usage.tokens < effective,
                   reason="over_window")
        return notices, gone
