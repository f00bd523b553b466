"""One budget for the whole window (docs/architecture.md, "One budget"): pure, no state.

For a usable window `effective` (`ContextProfile.effective`) and the session's settings, `plan`
gives the planned fill — the pressure every compaction ends at — and, as shares of that fill, the
ceiling of every standing layer (the segment block, the fact track, the user-verbatim track, the
knowledge slot) and the floor of the raw tail. Three rules:

- **A compaction ends at the planned fill** (`fill_share`): the `budget` setting's share of the
  usable window (`FILLS`: lean 40 %, balanced 55 %, rich 70 %), or `fill` when set. Every kind of
  compaction — manual, automatic, riding on a clearing, background — keeps raw what the layers
  leave under it, measured as the payload sends it, so the next compaction is the distance from
  the fill to the warn line of new content away. Below a 32k window the fill is a smaller part of
  that share (`window_factor`): at an 8k window about what the layers' room and the raw tail's floor
  take, so a compaction there keeps little more than the floor raw (each one re-sends the payload).
- **The layers are shares of the fill**: together they never pass `standing_share(effective)` of
  it — 6/11 at an 8k window, rising to 9/11 from a 32k window on (30 % and 45 % of the usable window
  at the balanced fill). A small window shrinks its layers first (fewer, denser lines), since
  everything above the raw tail is re-read after each compaction's cache miss.
- **Large windows cap the layers in absolute tokens** (`CAPS`, at the balanced fill; they scale
  with the fill too): a 1M window does not need a 150k fact track.

The settings' shares (`fact_share`, `verbatim_share`, `knowledge_share`) are each layer's claim, in
shares of the usable window at the balanced fill (a leaner or richer fill scales them alike).
What the user pinned and what the user wrote come first: the knowledge slot and the user-verbatim
track get their claims, within half of the standing share (`FIRST`; the track gives way at a small
window); the segment block and the fact track split what is left in proportion to their claims
(the block's is `BLOCK_CLAIM`). Turning a layer off leaves its room to the others, up to their claims.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BLOCK_CLAIM = 0.35  # the segment block's claim, beside the settings' shares of the other layers
STANDING_SMALL, STANDING_LARGE = 0.30, 0.45  # the standing layers' share at a small and a large window (balanced fill)
FIRST = 0.5  # the knowledge slot and the user-verbatim track take at most this part of the standing share
SMALL, LARGE = 6_000, 26_000  # usable windows (≈ 8k and ≈ 32k windows) where the share stops changing
FILLS = {"lean": 0.40, "balanced": 0.55, "rich": 0.70}  # the `budget` setting: where a compaction ends
BALANCED = FILLS["balanced"]  # the fill the layers' claims and caps are stated at
SMALL_FILL = 0.30 / 0.55  # at an 8k window a budget's fill is this part of its share (`window_factor`)
BELOW_WARN = 0.15  # a budget's fill stays this far under the warn line (a lowered warn_at lowers it)
FILL_BOUNDS = (0.2, 0.85)  # a planned fill outside these (exclusive) shares of the usable window is refused
TAIL_MIN = 0.10  # the raw tail a compaction keeps is never under this share (at the balanced fill)
CAPS = {"block": 40_000, "facts": 12_000, "verbatim": 16_000, "knowledge": 8_000}  # tokens, at the balanced fill


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


def fill_share(settings: Any = None, effective: int | None = None) -> float:
    """The planned fill, a share of the usable window: `fill` when set (the settings keep it under the warn
    line), else the `budget` setting's, at least `BELOW_WARN` under a lowered warn line and — given the
    usable window `effective` — lower at a small window (`window_factor`)."""
    explicit = float(getattr(settings, "fill", 0.0) or 0.0)
    if explicit:
        return explicit
    preset = FILLS.get(getattr(settings, "budget", "balanced"), BALANCED)
    if effective is not None:
        preset *= window_factor(effective)
    return min(preset, getattr(settings, "warn_at", 0.85) - BELOW_WARN)


def window_factor(effective: int) -> float:
    """The part of its share a budget's fill takes at a usable window of `effective` tokens: `SMALL_FILL` at
    an 8k window, rising with the logarithm of the window to all of it from 32k on. At a small window a
    compaction or a clearing comes every few calls, and each one sends the payload past the cache again,
    so a small window compacts deeper (at an 8k window the balanced fill is 30 %: at 55 % the shared coding
    sessions' prefix ratio fell from 96.0–96.3 % to 94.1–94.9 %; at 30 % it is 95.9–96.3 %, 2026-12-07)."""
    if effective <= SMALL:
        return SMALL_FILL
    if effective >= LARGE:
        return 1.0
    x = math.log(effective / SMALL) / math.log(LARGE / SMALL)
    return SMALL_FILL + x * (1.0 - SMALL_FILL)


def plan(effective: int, settings: Any = None) -> Plan:
    """The budget of a usable window of `effective` tokens under `settings` (defaults when None)."""
    ratio = fill_share(settings) / BALANCED  # the layers' claims are stated at the balanced fill: shares of the fill
    unit = effective * ratio  # the budget's, not scaled with the window: a small window's lower fill deepens the tail
    caps = {k: round(v * ratio) for k, v in CAPS.items()}
    fact = getattr(settings, "fact_share", 0.15)
    verbatim_claim = getattr(settings, "verbatim_share", 0.15)
    knowledge_claim = getattr(settings, "knowledge_share", 0.05)
    standing_cap = standing_share(effective) * unit
    knowledge = min(int(knowledge_claim * unit), caps["knowledge"])
    # the user's own words come first: their claim, within what leaves half the standing share to the block
    verbatim = max(0, min(int(verbatim_claim * unit), caps["verbatim"], int(FIRST * standing_cap) - knowledge))
    room = max(standing_cap - knowledge - verbatim, 0.0)
    claims = {"block": BLOCK_CLAIM, "facts": fact}
    total = sum(claims.values())
    scale = min(1.0, room / (total * unit)) if total else 0.0
    sizes = {k: min(int(c * scale * unit), caps[k]) for k, c in claims.items()}
    standing = sum(sizes.values()) + knowledge + verbatim
    target = int(fill_share(settings, effective) * effective)
    tail = max(int(TAIL_MIN * unit), target - standing)
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


LAYERS = {"segment": ("the segment block", "block"), "facts": ("the fact track", "facts"),
          "verbatim": ("the user-verbatim track", "verbatim"), "knowledge": ("the knowledge slot", "knowledge")}
ADVICE = {"knowledge": "%mfs unpin KEY removes a pinned value",
          "verbatim": "a long message of yours is kept whole there; verbatim_share=… lowers its room",
          "facts": "fact_share=… lowers its room", "block": "the next consolidation makes it smaller"}


def over_fill(p: Plan, layers: Sequence[Any]) -> str | None:
    """One line when the standing layers alone (everything but the system prompt and the raw tail) pass
    the planned fill, naming the layer furthest over its ceiling and by how much; None otherwise. No
    compaction can bring such a payload down to the fill, so the person is told once, not retried."""
    tokens: dict[str, int] = {}
    for layer in layers:
        if layer.kind in LAYERS:
            tokens[layer.kind] = tokens.get(layer.kind, 0) + layer.tokens
    standing = sum(tokens.values())
    if standing <= p.target or not tokens:
        return None
    ceiling = {kind: getattr(p, LAYERS[kind][1]) for kind in tokens}
    kind = max(tokens, key=lambda k: (tokens[k] - ceiling[k], tokens[k]))
    name, key = LAYERS[kind]
    over = tokens[kind] - ceiling[kind]
    return (f"the standing layers alone take {standing:,} tokens, over the planned fill of {p.target:,}: {name} holds "
            f"{tokens[kind]:,}" + (f", {over:,} over its share of {ceiling[kind]:,}" if over > 0 else "")
            + f"; {ADVICE[key]}, or budget=rich gives every layer more room")
