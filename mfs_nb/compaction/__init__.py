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

The protocol is `state` (what is in force, the lease, the commit check), `making` (one segment),
`block` (consolidation, the sink, eviction), `background` and `compactor` (the entry points); the
policies it carries out are each a module of their own:
`coldrange` (what a compaction covers), `consolidation` (when and what to merge, the gates) and
`terminal` (the sink and eviction once depth is exhausted); the circuit breaker is `breaker`. The
session is reached only through `host.Host`.
"""

from __future__ import annotations

from .compactor import Compactor
from .state import Pending

__all__ = ["Compactor", "Pending"]
