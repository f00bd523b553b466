"""The terminal chain (docs/architecture.md, "Consolidation and the terminal chain"): what happens
to a block still over its budget once no run can be merged (the depth limit reached, or the gates
turned the run down). Pure policy, no storage; `compaction.Compactor` commits it.

(a) **Sink**, zero LLM (`sink_run`, `sink_prose`, `bounded`): the run from the oldest segment
through the coldest L0 becomes one map — the union of the members' fact lines and each prose
line cut to 120 characters, the newest lines kept within a third of the block budget.
(b) Only then **eviction** (`evictions`): the oldest maps leave the payload while the block is
over its budget (their uids stay recallable; one line in the payload names the range). It is
exempt from the economic gates, with the single check (`EVICT_CHECK`) that afterwards the payload
is at most 0.9 × the window; while it is not, further old maps leave too, and the ledger row
says whether the check held.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import lang
from ..layers.segments import Segment
from ..window.tokens import estimate_tokens

SINK_LINE = 120  # characters each prose line keeps in the deterministic sink
EVICT_CHECK = 0.9  # after an eviction the payload must be within this share of the window
SINK_SHARE = 1 / 3  # the sunk map, fact list included, within this share of the block budget


def sink_run(segments: Sequence[Segment]) -> list[int]:
    """The terminal chain's run: from the oldest segment through the coldest L0 (level 0), at least
    the oldest two (no L0 but the newest, or the oldest map an L0 itself); never the newest."""
    coldest = next((i for i, x in enumerate(segments[:-1]) if x.level == 0), None)
    end = max(1, coldest or 0)
    return list(range(end + 1)) if end < len(segments) - 1 else []


def sink_prose(members: Sequence[Segment]) -> str:
    """(a) of the terminal chain: every prose line of the members, cut to 120 characters."""
    lines = []
    for x in members:
        for line in x.prose.splitlines():
            line = " ".join(line.split())
            if line:
                lines.append(line if len(line) <= SINK_LINE else line[:SINK_LINE - 1] + "…")
    return "\n".join(lines)


def bounded(prose: str, max_tokens: int, language: str | None = None) -> str:
    """The sink's prose within `max_tokens`: its newest lines, and one line (in the conversation's
    `language`) saying that older ones left (the map still covers their uids; recall_history returns
    the originals)."""
    lines = prose.splitlines()
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        cost = estimate_tokens(line) + 1
        if used + cost > max_tokens:
            break
        kept.append(line)
        used += cost
    if len(kept) == len(lines):
        return prose
    return "\n".join([lang.text("guide_dropped", language, n=len(lines) - len(kept)), *reversed(kept)])


def evictions(segments: Sequence[Segment], budget: float) -> int:
    """How many of the oldest maps leave for the block to fit `budget` (the newest always stays)."""
    n, tokens = 0, sum(x.tokens for x in segments)
    while len(segments) - n > 1 and tokens > budget:
        tokens -= segments[n].tokens
        n += 1
    return n
