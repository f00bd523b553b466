"""`mfs-nb bench`: deterministic benchmarks on real conversations (`../shared/data` by default).

Each suite is a module with `NAME`, `NEEDS` (the loaders it uses) and `run(data, quick) -> dict`
returning `{"title", "tables": [{"columns", "rows"}], "notes": [...], "metrics": {...}}`.
Results are printed, optionally written as JSON, and their section of `docs/benchmarks.md` is
regenerated in place. A suite whose data is missing is skipped with a message. A suite with
`OPT_IN = True` (`qa`, which calls a real model) runs only when named.
"""

from __future__ import annotations

from . import budgetbench as budget
from . import (
          chatload,
          compaction,
          frontier,
          mcpbench,
          notebook,
          qa,
          recall_speed,
          sidebyside,
          storebench,
          ux,
          verbatim,
)
from . import clearingbench as clearing
from . import consolidationbench as consolidation
from . import costbench as cost
from . import recallbench as recall
from . import tokensbench as tokens

SUITES = {tokens.NAME: tokens, clearing.NAME: clearing, compaction.NAME: compaction,
          consolidation.NAME: consolidation,
          verbatim.NAME: verbatim, sidebyside.NAME: sidebyside, ux.NAME: ux,
          recall.NAME: recall, recall_speed.NAME: recall_speed, notebook.NAME: notebook, storebench.NAME: storebench,
          chatload.NAME: chatload, cost.NAME: cost, budget.NAME: budget, frontier.NAME: frontier, mcpbench.NAME: mcpbench,
          qa.NAME: qa}
