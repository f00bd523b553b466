"""Background pre-compaction: at the warn line a segment is made from a snapshot, off the turn, and
committed at the next turn that finds it ready."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..layers.segments import Segment

if TYPE_CHECKING:
    pass

from .block import BlockWork
from .state import Pending


class Background(BlockWork):
    """The pre-compaction under way, and its commit."""

    # -- background pre-compaction -----------------------------------------------------------
    def start_background(self, effective: int, synchronous: bool, now: bool = False) -> bool:
        """At the warn line: compress cold history into an L0 segment from a snapshot, off the turn.
        `now`: it is to be committed right away (riding on a clearing), so its range ends at the fill
        as the payload stands (`CompactorState.keep_tail`)."""
        if self.pending is not None or self.breaker.open:
            return False
        if not self.choose(effective, now=now)[0]:  # nothing cold: the lease (two writes, three reads) is not taken
            return False
        if self._acquire(0.0):
            return False
        events, _ = self.choose(effective, now=now)  # again: the lease brought what other kernels declared
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
