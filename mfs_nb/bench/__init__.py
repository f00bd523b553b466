"""`mfs-nb bench`: deterministic benchmarks on real conversations (`../shared/data` by default).

Each suite is a module with `NAME`, `NEEDS` (the loaders it uses) and `run(data, quick) -> dict`
returning `{"title", "tables": [{"columns", "rows"}], "notes": [...], "metrics": {...}}`.
Results are printed, optionally written as JSON, and their section of `docs/benchmarks.md` is
regenerated in place. A suite whose data is missing is skipped with a message.
"""

from __future__ import annotations

from . import clearing, compaction, recall, recall_speed, sidebyside, tokens, verbatim

SUITES = {tokens.NAME: tokens, clearing.NAME: clearing, compaction.NAME: compaction,
          verbatim.NAME: verbatim, sidebyside.NAME: sidebyside,
          recall.NAME: recall, recall_speed.NAME: recall_speed}
