"""Which history a compaction covers, and how long its guide may be (docs/architecture.md,
"Segments (S3)"): pure policy, no storage; `compaction.Compactor` carries it out under the protocol.

- **The cold range** (`choose`): the oldest raw events, cut at turn starts, keeping the recent
  tail raw (`keep` tokens, whole turns: the room the standing layers leave under the budget's
  target, never under its tail floor — `budget.plan`) and skipping a range too small to be worth a
  cache miss. At the hard line with nothing else left (`emergency`) and for a manual `%compact`
  (`small_ok`) only the current turn is kept and any size goes.
- **The target** (`target`): the guide's size, half the range, within an eighth to a quarter of the
  segment block's budget (so the block holds a few guides before it consolidates) and 1,000–16,000
  tokens (a small window gets denser guides).
- A compaction event goes on, range after range, until pressure is under the plan's target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..events import Event
from ..layers import segments as seg


def choose(raw: Sequence[Event], effective: int, keep: int, emergency: bool = False,
           small_ok: bool = False, sent: Callable[[Event], int] = seg.event_tokens) -> tuple[list[Event], str]:
    """The cold range of `raw` (the events no segment covers), or ([], why not). `keep`: the raw
    tail to keep, in tokens as the payload sends them (`sent`; `CompactorState.keep_tail`)."""
    target_lo = min(seg.TARGET_MIN, int(0.1 * effective))
    min_tokens = 1 if emergency or small_ok else int(min(max(2_000, 2 * target_lo), 0.2 * effective))
    choice = seg.select_range(raw, 0 if emergency or small_ok else keep, min_tokens, sent=sent)
    if choice.start == choice.end:
        return [], choice.reason
    return list(raw[choice.start:choice.end]), ""


def target(events: Sequence[Event], block: int) -> int:
    """Tokens the guide of `events` should take, for a segment block of `block` tokens (`budget.plan`)."""
    tokens = sum(seg.event_tokens(e) for e in events)
    lo, hi = guide_bounds(block)
    return max(lo, min(hi, tokens // 2))


def guide_bounds(block: int) -> tuple[int, int]:
    """The least and the most tokens one guide may take in a segment block of `block` tokens."""
    return min(seg.TARGET_MIN, block // 8), min(seg.TARGET_MAX, block // 4)
