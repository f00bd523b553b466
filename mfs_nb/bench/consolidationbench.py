"""Suite `consolidation` (the compaction bench's consolidation section, issue 15): long sessions
replayed at 8k and 32k, eviction only (`consolidation=False`, the old behaviour) against
consolidation with the terminal chain.

Per run: compacted uids still represented by a segment map in the final payload (not only by the
one-line evicted-range note), facts of the older two thirds in context (`atoms.py`), prefix-cache
ratio over all calls and over ordinary calls, consolidations accepted and rejected by each gate,
LLM tokens spent, the deepest level and the most L0s seen in the block, lost uids and calls over
the window; and the block's shape over time for the first run.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from ..commands.replay import normalise, replay
from ..compaction.consolidation import labels
from . import atoms
from .dataset import Data, to_openai

NAME = "consolidation"
NEEDS = ("locomo", "kdconv", "claude_code_sessions")
WINDOWS = (8_000, 32_000)
MODES = (("eviction only", False), ("consolidation", True))
PAYBACK_BAR, SHRINK_BAR = 40.0, 0.35  # issue 15's gates, written here (not read from the engine it judges)


def _ratio(calls: list[dict[str, Any]], ordinary: bool) -> float | None:
    ratios = [c["shared_prefix_tokens"] / p["payload_tokens"] for p, c in zip(calls, calls[1:])
              if p["payload_tokens"] and not (ordinary and c["notices"])]
    return statistics.fmean(ratios) if ratios else None


def run_one(messages: list[Any], window: int, consolidation: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shapes: list[tuple[int, str]] = []
    seen = {"calls": 0, "deepest": 0, "most_l0": 0}

    def on_call(session: Any, plan: Any) -> None:
        levels = [x.level for x in session.compactor.segments]
        seen["deepest"] = max([seen["deepest"], *levels])
        seen["most_l0"] = max(seen["most_l0"], sum(1 for x in levels if x == 0))
        shape = " ".join(f"[{label}]" for label in labels(levels)) or "(none)"
        if not shapes or shapes[-1][1] != shape:
            shapes.append((seen["calls"], shape))
        seen["calls"] += 1

    def keep(session: Any) -> None:
        c = session.compactor
        covered = c.covered_to
        evicted = sum(b - a + 1 for a, b in c.evicted)
        events = list(session.events)
        history = [{"role": e.role, "content": e.content, "tool_calls": list(e.tool_calls or ())} for e in events]
        counts = [len(m["content"]) for m in history]  # the split needs proportions only
        facts = atoms.fact_set(history)
        cut = atoms.older_cut(counts, len(history))
        score = atoms.score(facts.older(cut), atoms.Payload(session.send_view().messages, facts))
        out.update(covered=covered, evicted=evicted, lost=session.coverage()["lost"], facts=score.rate,
                   n_facts=score.total)

    report = replay(messages, window=window, keep=keep, on_call=on_call, consolidation=consolidation)
    calls, ledger = report["calls"], report["ledger"]
    merges = [r for r in ledger if r["kind"] == "consolidation"]
    gates = Counter("accepted" if r.get("accepted") else (r.get("gate") or "error") for r in merges)
    return {
        "calls": len(calls), "over_window": sum(c["payload_tokens"] > window for c in calls),
        "compactions": sum(r["kind"] == "compaction" for r in ledger),
        "mapped": (out["covered"] - out["evicted"]) / out["covered"] if out.get("covered") else None,
        "evicted_only": out["evicted"] / out["covered"] if out.get("covered") else None,
        "facts": out.get("facts"), "n_facts": out.get("n_facts", 0), "lost": out.get("lost", 0),
        "prefix_all": _ratio(calls, False), "prefix_ordinary": _ratio(calls, True),
        "merges": dict(gates), "evictions": sum(r["kind"] == "eviction" for r in ledger),
        "evictions_over": sum(r["kind"] == "eviction" and not r.get("within") for r in ledger),
        "merges_ungated": sum(1 for r in merges if r.get("accepted") and r.get("tier") != "hard"
                              and r.get("merge") != "sink" and not (r.get("payback", 1e9) <= PAYBACK_BAR
                                                                   and r.get("shrink", 0) >= SHRINK_BAR)),
        "sinks": sum(1 for r in merges if r.get("merge") == "sink" and r.get("accepted")),
        "hard_merges": sum(1 for r in merges if r.get("accepted") and r.get("tier") == "hard"),
        "llm_tokens": sum(r.get("llm_tokens", 0) or 0 for r in ledger if r["kind"] in ("compaction", "consolidation")),
        "deepest": seen["deepest"], "most_l0": seen["most_l0"], "shapes": shapes,
        "gate_rows": [{k: r.get(k) for k in ("merge", "tier", "miss", "freed", "payback", "shrink", "accepted", "gate")}
                      for r in merges],
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def run(data: Data, quick: bool) -> dict[str, Any]:
    locomo = data.get("locomo")
    plan: list[tuple[str, list[dict[str, Any]], tuple[int, ...]]] = []
    if quick:
        plan.append((f"LoCoMo {locomo[0]['id']}", to_openai(locomo[0]["messages"]), (8_000,)))
    else:
        plan.append(("LoCoMo ×6 (one session)", [m for c in locomo for m in to_openai(c["messages"])], WINDOWS))
        plan.append(("KdConv ×60 (one session)",
                     [m for c in data.get("kdconv")[:60] for m in to_openai(c["messages"])], WINDOWS))
        for c in data.get("claude_code_sessions"):
            if len(c["messages"]) > 100:
                plan.append((f"coding {c['id'][:8]}", to_openai(c["messages"]), WINDOWS))
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    shape_rows: list[list[Any]] = []
    for name, msgs, windows in plan:
        for window in windows:
            for label, on in MODES:
                r = run_one(normalise(msgs), window, on)
                results[f"{name}@{window}:{label}"] = {k: v for k, v in r.items() if k != "shapes"}
                merges = ", ".join(f"{k} {v}" for k, v in sorted(r["merges"].items())) or "—"
                rows.append([name, f"{window // 1000}k", label, r["calls"], r["compactions"], _pct(r["mapped"]),
                             _pct(r["evicted_only"]), f"{_pct(r['facts'])} ({r['n_facts']})", _pct(r["prefix_all"]),
                             _pct(r["prefix_ordinary"]), merges, r["sinks"],
                             f"{r['evictions']} ({r['evictions_over']})", f"{r['llm_tokens']:,}",
                             r["deepest"], r["most_l0"], r["lost"], r["over_window"]])
                if on and not shape_rows:
                    shape_rows = [[f"{name} at {window // 1000}k", call, shape] for call, shape in r["shapes"]]
    return {
        "title": "Consolidation and the terminal chain against eviction only (replayed with the offline default)",
        "tables": [
            {"caption": "Runs. 'Mapped': compacted uids a segment map in the final payload still covers; 'evicted "
                        "only': those left with nothing but the one-line evicted-range note (recallable, not shown)",
             "columns": ["conversation", "window", "mode", "calls", "compactions", "compacted uids mapped",
                         "evicted only", "facts in context, older two thirds (n)", "prefix ratio, all calls",
                         "prefix ratio, ordinary calls", "consolidations by gate", "sinks",
                         "evictions (payload over 0.9 × window after)", "LLM tokens",
                         "deepest level", "most L0s", "lost uids", "calls over window"],
             "rows": rows},
            {"caption": "The block's shape over time in the first consolidation run (labels are positional: "
                        "consolidated maps L1, L2, … from the oldest, every unconsolidated one L0)",
             "columns": ["run", "from call", "block"],
             "rows": shape_rows},
        ],
        "notes": [
            "Consolidation starts when the segment block passes 80 % of its budget (35 % of the usable window); "
            "a merge is committed only when payback (tokens after the run's start ÷ tokens freed) ≤ 40 calls and "
            "it frees ≥ 35 % of the block — at the hard tier, when it is smaller at all. Gates and figures are "
            "ledger rows (`kind: consolidation`).",
            "Past `max_consolidations` (3) the terminal chain sinks the run through the coldest L0 into one "
            "zero-LLM map (prose lines cut to 120 characters, the newest kept within a third of the block), and "
            "only what still does not fit is evicted; after an eviction the payload must be ≤ 0.9 × the window "
            "(older maps leave too while it is not; the ledger row `kind: eviction` says whether it held).",
            f"Accepted consolidations below the hard tier that did not pass both gates (from the ledger rows): "
            f"{sum(r['merges_ungated'] for r in results.values())} over all runs.",
            "Facts in context: `atoms.py` (no engine code), the facts stated only in the older two thirds of the "
            "conversation, found in the final payload beside a word of their original context.",
        ],
        "metrics": results,
    }
