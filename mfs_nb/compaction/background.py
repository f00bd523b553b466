"""Background pre-compaction: at the warn line a segment is made from a snapshot, off the turn, and
committed at the next turn that finds it ready."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..layers.segments import Segment
from .state import Pending

if TYPE_CHECKING:
    from .making import SegmentMaking
    from .state import CompactorState


class Background:
    """The pre-compaction under way (`state.pending`), and its commit."""

    def __init__(self, state: CompactorState, making: SegmentMaking):
        self.state, self.making = state, making
        self.host = state.host

    # -- background pre-compaction -----------------------------------------------------------
    def start_background(self, effective: int, synchronous: bool, now: bool = False) -> bool:
        """At the warn line: compress cold history into an L0 segment from a snapshot, off the turn.
        `now`: it is to be committed right away (riding on a clearing), so its range ends at the fill
        as the payload stands (`CompactorState.keep_tail`)."""
        if self.state.pending is not None or self.state.breaker.open:
            return False
        if not self.state.choose(effective, now=now)[0]:  # nothing cold: the lease (two writes, three reads) is not taken
            return False
        if self.state.acquire(0.0):
            return False
        events, _ = self.state.choose(effective, now=now)  # again: the lease brought what other kernels declared
        if not events:
            self.state.release()
            return False
        seq = self.state.next_seq()
        self.state.rows.start(seq, trigger="background", tier="warn", uid_from=events[0].uid, uid_to=events[-1].uid)
        pending = Pending(seq, list(events), self.state.lease.claim)
        self.state.pending = pending

        def work() -> None:
            try:
                pending.segment, pending.info = self.making.make(seq, pending.events, effective)
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
        pending = self.state.pending
        if pending is None or (not pending.done.is_set() and not wait):
            return None
        pending.done.wait()
        self.state.pending = None
        if not self.state.lease.held or self.state.lease.claim != pending.claim:  # the lease lapsed meanwhile: stale
            self.state.rows.abort(pending.seq, "lease lost")
            return None
        if pending.segment is None:
            self.state.rows.abort(pending.seq, pending.info.get("error", "no result"))
            return None
        now, then = self.state.payload_with(pending.segment)
        rejected = self.state.commit(pending.segment) if then < now else f"would not make the payload smaller ({now} → {then} tokens)"
        if rejected:
            self.state.rows.abort(pending.seq, rejected)
            self.host.log("commit_rejected", tier="compress", reason=rejected, uid_from=pending.segment.uid_from,
                        uid_to=pending.segment.uid_to)
            return None
        self.state.rows.finish(pending.seq)
        return pending.segment, pending.info

    # -- the tier hook -----------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether a background pre-compaction has finished and waits to be committed."""
        return self.state.pending is not None and self.state.pending.done.is_set()
