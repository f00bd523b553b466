"""One budget for the whole window (docs/architecture.md, "One budget"): pure, no state.

For a usable window `effective` (`ContextProfile.effective`) and the session's settings, `plan`
gives the ceiling of every standing layer — the segment block, the fact track, the user-verbatim
track, the knowledge slot — the floor of the raw tail a compaction keeps, and the pressure a
compaction brings the payload down to. Three rules:

- **The standing layers together never pass `standing_share(effective)`** of the usable window:
  30 % at an 8k window, rising to 45 % from a 32k window on. A small window shrinks its layers
  first (fewer, denser lines), since everything above the raw tail is re-read after each
  compaction's cache miss.
- **A compaction ends at `TARGET`** (55 % of the usable window): the layers at their ceilings
  plus the raw tail's floor add up to it, so the next compaction is at least the distance from
  the target to the warn line (30 % of the window) of new content away.
- **Large windows cap the layers in absolute tokens** (`CAPS`): a 1M window does not need a
  150k fact track.

The settings' shares (`fact_share`, `verbatim_share`, `knowledge_share`) are each layer's claim.
What the user pinned and what the user wrote come first: the knowledge slot and the user-verbatim
track get their claims, within half of the standing share (`FIRST`; the track gives way at a small
window); the segment block and the fact track split what is left in proportion to their claims
(the block's is `BLOCK_CLAIM`). Turning a layer off leaves its room to the others, up to their claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

BLOCK_CLAIM = 0.35  # the segment block's claim, beside the settings' shares of the other layers
STANDING_SMALL, STANDING_LARGE = 0.30, 0.45  # the standing layers' share at a small and a large window
FIRST = 0.5  # the knowledge slot and the user-verbatim track take at most this part of the standing share
SMALL, LARGE = 6_000, 26_000  # usable windows (≈ 8k and ≈ 32k windows) where the share stops changing
TARGET = 0.55  # a compaction goes on until the payload is under this share of the usable window
TAIL_MIN = 0.10  # the raw tail a compaction keeps is never under this share
CAPS = {"block": 40_000, "facts": 12_000, "verbatim": 16_000, "knowledge": 8_000}  # tokens, at any window


@dataclass(frozen=True)
class Plan:
    """Token ceilings of the standing layers, the raw tail's floor and the compaction target."""

    effective: int
    block: int
    facts: int
    verbatim: int
    knowledge: int
    tail: int
    target: int

    @property
    def standing(self) -> int:
        return self.block + self.facts + self.verbatim + self.knowledge

    def rows(self) -> list[tuple[str, int]]:
        return [("segment block", self.block), ("fact track", self.facts), ("user-verbatim track", self.verbatim),
                ("knowledge slot", self.knowledge), ("raw tail (floor)", self.tail),
                ("after a compaction (target)", self.target)]


def standing_share(effective: int) -> float:
    """The share of the usable window all standing layers may take together."""
    if effective <= SMALL:
        return STANDING_SMALL
    if effective >= LARGE:
        return STANDING_LARGE
    x = math.log(effective / SMALL) / math.log(LARGE / SMALL)
    return STANDING_SMALL + x * (STANDING_LARGE - STANDING_SMALL)


def plan(effective: int, settings: Any = None) -> Plan:
    """The budget of a usable window of `effective` tokens under `settings` (defaults when None)."""
    fact = getattr(settings, "fact_share", 0.15)
    verbatim_claim = getattr(settings, "verbatim_share", 0.15)
    knowledge_claim = getattr(settings, "knowledge_share", 0.05)
    standing_cap = standing_share(effective) * effective
    knowledge = min(int(knowledge_claim * effective), CAPS["knowledge"])
    # the user's own words come first: their claim, within what leaves half the standing share to the block
    verbatim = max(0, min(int(verbatim_claim * effective), CAPS["verbatim"], int(FIRST * standing_cap) - knowledge))
    room = max(standing_cap - knowledge - verbatim, 0.0)
    claims = {"block": BLOCK_CLAIM, "facts": fact}
    total = sum(claims.values())
    scale = min(1.0, room / (total * effective)) if total else 0.0
    sizes = {k: min(int(c * scale * effective), CAPS[k]) for k, c in claims.items()}
    standing = sum(sizes.values()) + knowledge + verbatim
    target = int(TARGET * effective)
    tail = max(int(TAIL_MIN * effective), target - standing)
    return Plan(effective, sizes["block"], sizes["facts"], verbatim, knowledge, tail, target)


def table(windows: tuple[int, ...] = (8_192, 16_384, 32_768, 131_072, 200_000, 1_000_000)) -> list[list[str]]:
    """The plan at a few windows under the default settings (docs/architecture.md shows it)."""
    from .usage import ContextProfile

    rows = []
    for window in windows:
        p = plan(ContextProfile(window).effective)
        rows.append([f"{window:,}", f"{p.effective:,}", *(f"{v:,}" for _, v in p.rows()),
                     f"{p.standing / p.effective:.0%}"])
    return rows
