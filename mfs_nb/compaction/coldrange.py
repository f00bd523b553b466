"""Which history a compaction covers, and how long its guide may be (docs/architecture.md,
"Segments (S3)"): pure policy, no storage; `compaction.Compactor` carries it out under the protocol.

- **The cold range** (`choose`): the oldest raw events, cut at turn starts, keeping the recent
  tail raw (`KEEP_TAIL` of the usable window, whole turns) and skipping a range too small to be
  worth a cache miss. At the hard line with nothing else left (`emergency`) and for a manual
  `%compact` (`small_ok`) only the current turn is kept and any size goes.
- **The target** (`target`): the guide's size, half the range, within 10–20 % of the usable window
  and 1,000–16,000 tokens.
- A compaction event goes on, range after range, until pressure is under `TARGET_AFTER`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import segments as seg
from ..events import Event

KEEP_TAIL = 0.25  # share of the usable window kept raw as the recent tail
TARGET_AFTER = 0.55  # a compaction event goes on until pressure is under this share


def choose(raw: Sequence[Event], effective: int, emergency: bool = False,
           small_ok: bool = False) -> tuple[list[Event], str]:
    """The cold range of `raw` (the events no segment covers), or ([], why not)."""
    target_lo = min(seg.TARGET_MIN, int(0.1 * effective))
    min_tokens = 1 if emergency or small_ok else int(min(max(2_000, 2 * target_lo), 0.2 * effective))
    keep = 0 if emergency or small_ok else int(KEEP_TAIL * effective)
    choice = seg.select_range(raw, keep, min_tokens)
    if choice.start == choice.end:
        return [], choice.reason
    return list(raw[choice.start:choice.end]), ""


def target(events: Sequence[Event], effective: int) -> int:
    """Tokens the guide of `events` should take."""
    tokens = sum(seg.event_tokens(e) for e in events)
    lo, hi = min(seg.TARGET_MIN, int(0.1 * effective)), min(seg.TARGET_MAX, int(0.2 * effective))
    return max(lo, min(hi, tokens // 2))
