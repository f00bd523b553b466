"""Consolidation (docs/architecture.md, "Consolidation and the terminal chain"): pure policy, no storage.

When the segment block passes ≈ 80 % of its budget, the oldest run of segments is merged into one
segment one level deeper that covers the union of their uid ranges; old history stays in the
payload as a few coarser layers instead of being evicted.

- **Levels.** A segment's stored `level` is its merge depth (0: made from originals). It alone
  drives the merge criteria; the labels `%context` shows are positional (see `labels`). Using
  positions as criteria would break the recursion: a position changes whenever a layer is added.
- **Run** (`choose_run`): from the oldest segment still below `max_depth`, consecutive segments
  below `max_depth`, never the newest one (it stays L0 for the next turns' cache), the merge
  input capped at 120k characters with the cut on a segment boundary. `eager`: the oldest two
  adjacent segments of the same level (the eager tier) — off by default: it consolidates far more
  often, each time a prefix-cache miss for everything after the run, and summaries of summaries
  drift further from the originals.
- **Gates** (`gates`), computed and logged every time: `miss` = tokens after the run's start (the
  part of the payload that misses the prefix cache), `freed` = block tokens before − after;
  payback `miss ÷ freed ≤ 40` calls and shrink `freed ≥ 0.35 × block before`. At the hard tier
  only "really smaller" is asked. Where the chat model's cache prices are known (`cost.miss_weight`),
  the payback is counted in money: a missed token is re-written at the write rate where it would
  have been read at the read rate, a freed one saves a read on every later call, so the token
  payback is multiplied by (write − read) ÷ read (11.5 for Claude, 1 for GPT-4o); the ledger row
  keeps both and says which decided.
- **Merge**: the fact list is the working set of the union range (every member's lines,
  collapsed, within the fact budget); the prose comes from the summarizer given the members'
  prose — the only summary of summaries the design allows, hence the depth cap.
- **Terminal chain** once depth is exhausted: `terminal.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..layers.segments import Segment, language_line
from ..window.tokens import estimate_tokens

CONSOLIDATE_AT = 0.8  # share of the block budget at which the oldest run is consolidated (the default tier)
PAYBACK_MAX = 40.0  # calls a consolidation's cache miss may take to pay back
SHRINK_MIN = 0.35  # share of the block a consolidation must free
MERGE_INPUT_CHARS = 120_000


@dataclass(frozen=True)
class Gates:
    """The economic gates of one consolidation, as logged."""

    miss: int
    freed: int
    block_before: int
    payback: float  # calls to pay the miss back: in money where the prices are known, else in tokens
    shrink: float
    passed: bool
    failed: str = ""  # "payback", "shrink" or "not_smaller"
    payback_tokens: float = 0.0  # the same in tokens, always
    basis: str = "tokens"  # what `payback` counts: "price" or "tokens"

    def to_json(self) -> dict[str, Any]:
        return {"miss": self.miss, "freed": self.freed, "block_before": self.block_before,
                "payback": round(self.payback, 2), "payback_tokens": round(self.payback_tokens, 2),
                "payback_basis": self.basis, "shrink": round(self.shrink, 3), "accepted": self.passed,
                "gate": self.failed}



def block_tokens(segments: Sequence[Segment]) -> int:
    return sum(x.tokens for x in segments)


def over_trigger(segments: Sequence[Segment], budget: float) -> bool:
    return len(segments) > 1 and block_tokens(segments) > CONSOLIDATE_AT * budget


def choose_run(segments: Sequence[Segment], max_depth: int, eager: bool = False) -> list[int]:
    """Indices of the segments to merge (at least two, consecutive), or [] when none qualify."""
    if eager:
        for i in range(len(segments) - 2):  # never the newest
            a, b = segments[i], segments[i + 1]
            if a.level == b.level < max_depth:
                return [i, i + 1]
        return []
    start = next((i for i, x in enumerate(segments[:-1]) if x.level < max_depth), None)
    if start is None:
        return []
    run: list[int] = []
    chars = 0
    for i in range(start, len(segments) - 1):
        x = segments[i]
        if x.level >= max_depth or (run and chars + len(x.prose) + len(x.facts) > MERGE_INPUT_CHARS):
            break
        run.append(i)
        chars += len(x.prose) + len(x.facts)
    return run if len(run) >= 2 else []


def gates(miss: int, block_before: int, block_after: int, hard: bool, miss_weight: float | None = None) -> Gates:
    """The gates of one consolidation; `miss_weight` (`cost.miss_weight`) counts the payback in money."""
    freed = block_before - block_after
    tokens = miss / freed if freed > 0 else float("inf")
    payback = tokens * miss_weight if miss_weight is not None and freed > 0 else tokens
    shrink = freed / block_before if block_before else 0.0
    basis = "price" if miss_weight is not None else "tokens"

    def verdict(passed: bool, failed: str = "") -> Gates:
        return Gates(miss, freed, block_before, payback, shrink, passed, failed, tokens, basis)

    if freed <= 0:
        return verdict(False, "not_smaller")
    if hard:
        return verdict(True)
    if shrink < SHRINK_MIN:
        return verdict(False, "shrink")
    if payback > PAYBACK_MAX:
        return verdict(False, "payback")
    return verdict(True)


def merge_target(members: Sequence[Segment]) -> int:
    """The merged prose's size: a third of the members' prose, at least 200 tokens."""
    return max(200, sum(estimate_tokens(x.prose) for x in members) // 3)


def merge_messages(members: Sequence[Segment], target: int, language: str | None = None) -> list[dict[str, Any]]:
    """What the summarizer reads: each member's guide as a message, then the instruction (which
    keeps the conversation's language, `segments.language_line`)."""
    out: list[dict[str, Any]] = [
        {"role": "user", "content": f"[guide to uids {x.uid_from}–{x.uid_to}]\n{x.prose.strip()}"} for x in members]
    text = resources.files("mfs_nb").joinpath("prompts/consolidate.md").read_text(encoding="utf-8")
    out.append({"role": "user", "content": text.format(uid_from=members[0].uid_from, uid_to=members[-1].uid_to,
                                                       target=target).strip() + "\n" + language_line(language)})
    return out


def labels(levels: Sequence[int | None]) -> list[str]:
    """Positional labels for `%context`: consolidated segments L1, L2, … from the oldest; every
    unconsolidated segment L0. Display only: the stored level is what merges are decided on."""
    out, n = [], 0
    for level in levels:
        if level:
            n += 1
            out.append(f"L{n}")
        else:
            out.append("L0")
    return out
