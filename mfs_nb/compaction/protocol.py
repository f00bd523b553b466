"""The rows of the compaction protocol, written in one place (see the `compaction` package):

    started (under the lease) → summary_completed → declared (the only row the projection
    honours) → finished      — or aborted, with the reason.

`ProtocolRows` is the only writer of these rows; each phase is one call, and what a row holds is
decided here, not at the call sites. The store keeps a row's data as sorted JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..host import Host
    from ..layers.segments import Segment
    from .lease import Lease


class ProtocolRows:
    """One session's protocol rows, stamped with the lease they were written under."""

    def __init__(self, host: Host, lease: Lease):
        self.host = host
        self.lease = lease

    def _write(self, seq: int, phase: str, data: dict[str, Any]) -> None:
        self.host.store.append_compaction(self.host.name, seq, phase, data)

    def start(self, seq: int, **data: Any) -> None:
        """`started`: what the step is about (trigger, tier, range, …) and the lease that takes it."""
        self._write(seq, "started", {**data, "lease": self.lease.claim, "owner": self.lease.owner})

    def complete(self, seq: int, segment: Segment, info: dict[str, Any], **extra: Any) -> None:
        """`summary_completed`: the segment's text and coverage, the summarizer's envelope and error."""
        self._write(seq, "summary_completed", {
            "content": segment.prose, "covered": [segment.uid_from, segment.uid_to], "tokens": segment.tokens,
            **extra, "envelope": info.get("envelope"), "error": info.get("error")})

    def declare(self, seq: int, declaration: dict[str, Any]) -> None:
        """`declared`: the row the projection honours (a segment, a consolidation, an eviction, …)."""
        self._write(seq, "declared", declaration)

    def abort(self, seq: int, reason: str, **detail: Any) -> None:
        """`aborted`, with the reason (and what explains it)."""
        self._write(seq, "aborted", {"reason": reason, **detail})

    def finish(self, seq: int) -> None:
        self._write(seq, "finished", {})

    def recover(self, seq: int, declared: bool) -> None:
        """An interrupted step cleaned: finished when its declaration was written, else aborted."""
        self._write(seq, "finished" if declared else "aborted", {"recovered": True})
