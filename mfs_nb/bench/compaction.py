"""Suite `compaction` (S3): LoCoMo and the coding-agent sessions replayed at 8k, 32k and 128k.

Per run: compactions, tokens sent per call, the prefix-cache ratio on ordinary calls (calls with
no memory-layer event: the share of the previous payload that the new one repeats byte for byte,
i.e. what a provider's prefix cache can serve), coverage, payloads over the window, fact lines of
compacted ranges still verbatim in the final payload or in the committed segments, and the
memory layer's own time per call. Plus the coverage check at 3,000 segments and a determinism
check (the same transcript replayed twice).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..facts import extract
from ..replay import normalise, replay
from ..segments import uncovered
from .data import Data, to_openai

NAME = "compaction"
NEEDS = ("locomo", "claude_code_sessions")
WINDOWS = (8_000, 32_000, 128_000)


def prefix_ratio(calls: list[dict[str, Any]]) -> float | None:
    ratios = [c["shared_prefix_tokens"] / p["payload_tokens"] for p, c in zip(calls, calls[1:])
              if not c["notices"] and p["payload_tokens"]]
    return statistics.fmean(ratios) if ratios else None


def run_one(messages: list[Any], window: int) -> dict[str, Any]:
    kept: dict[str, Any] = {}

    def keep(session: Any) -> None:
        payload = "\n".join(m.get("content") or "" for m in session.send_view().messages)
        committed = [r["segment"] for r in session.store.load_compactions(session.name)
                     if r["phase"] == "declared" and "segment" in r]
        texts = payload + "\n" + "\n".join(s["prose"] + "\n" + s["facts"] for s in committed)
        in_budget, all_facts = [], []
        events = {e.uid: e for e in session.events}
        for s in committed:
            lines = [ln[2:].rsplit(" [#", 1)[0] for ln in s["facts"].splitlines() if ln.startswith("- ") and " [#" in ln]
            in_budget += [ln in texts for ln in lines]
            for uid in range(s["uid_from"], s["uid_to"] + 1):
                all_facts += [f.text in payload for f in extract(events[uid].content)] if uid in events else []
        kept.update(in_budget=in_budget, all_facts=all_facts, segments=len(committed))

    report = replay(messages, window=window, keep=keep)
    calls = report["calls"]
    eff = int(window * 0.835)
    return {
        "calls": len(calls),
        "compactions": sum(r["kind"] == "compaction" for r in report["ledger"]),
        "clearings": sum(r["kind"] == "clearing" for r in report["ledger"]),
        "segments": kept["segments"],
        "tokens_per_call": statistics.fmean(c["payload_tokens"] for c in calls) if calls else 0,
        "peak": max((c["payload_tokens"] for c in calls), default=0),
        "over_window": sum(c["payload_tokens"] > window for c in calls),
        "over_effective": sum(c["payload_tokens"] > eff for c in calls),
        "prefix_ratio": prefix_ratio(calls),
        "lost": report["coverage"]["lost"],
        "facts_in_budget": (sum(kept["in_budget"]) / len(kept["in_budget"])) if kept["in_budget"] else None,
        "facts_all_in_payload": (sum(kept["all_facts"]) / len(kept["all_facts"])) if kept["all_facts"] else None,
        "ms_per_call": statistics.fmean(c["prepare_ms"] for c in calls) if calls else 0,
        "segments_json": report["segments"],
        "final": report["final_view"],
    }


def coverage_check_ms(n_segments: int = 3_000) -> float:
    spans = [(i * 10 + 1, i * 10 + 10) for i in range(n_segments)]
    uids = list(range(1, n_segments * 10 + 200))
    raw = set(range(n_segments * 10 + 1, n_segments * 10 + 200))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        assert not uncovered(uids, raw, spans)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def run(data: Data, quick: bool) -> dict[str, Any]:
    convs = [(f"LoCoMo {c['id']}", c["messages"]) for c in data.get("locomo")]
    convs += [(f"coding {c['id'][:8]}", c["messages"]) for c in data.get("claude_code_sessions")
              if len(c["messages"]) > 100]
    plan = [(name, msgs, w) for name, msgs in convs for w in WINDOWS]
    if quick:
        plan = [(convs[0][0], convs[0][1], 8_000), (convs[-1][0], convs[-1][1], 32_000)]
    rows, results = [], {}
    for name, msgs, window in plan:
        r = run_one(normalise(to_openai(msgs)), window)
        results[f"{name}@{window}"] = {k: v for k, v in r.items() if k not in ("segments_json", "final")}
        rows.append([name, f"{window // 1000}k", r["calls"], r["compactions"], r["clearings"],
                     f"{r['tokens_per_call']:,.0f}", f"{r['peak']:,}", r["over_window"], _pct(r["prefix_ratio"]),
                     r["lost"], _pct(r["facts_in_budget"]), _pct(r["facts_all_in_payload"]), f"{r['ms_per_call']:.1f}"])
    name, msgs, window = plan[0]
    a = run_one(normalise(to_openai(msgs)), window)
    b = run_one(normalise(to_openai(msgs)), window)
    deterministic = a["segments_json"] == b["segments_json"] and a["final"] == b["final"]
    cov_ms = coverage_check_ms()
    return {
        "title": "S3 segment compaction (replayed with the offline default summarizer)",
        "tables": [
            {"caption": "Replays",
             "columns": ["conversation", "window", "calls", "compactions", "S2 clearings", "tokens / call", "peak",
                         "calls over window", "prefix-cache ratio, ordinary calls", "lost uids",
                         "fact lines kept (within budget)", "all fact lines of compacted ranges still in payload",
                         "memory layer ms / call"],
             "rows": rows},
            {"caption": "Checks", "columns": ["check", "result"],
             "rows": [["coverage check, 3,000 segments", f"{cov_ms:.2f} ms"],
                      [f"determinism ({name} at {window // 1000}k, replayed twice)",
                       "identical segments and final payload" if deterministic else "DIFFERENT"]]},
        ],
        "notes": [
            "Seed references: prefix-cache hit 99.3 % on ordinary turns; coverage check 3,000 segments in 3.6 ms; "
            "100 % of removed messages covered.",
            "'Fact lines kept' is the share of each segment's fact list (the budgeted verbatim lines) present in the "
            "final payload or the committed segments; the last fact column counts every fact line of every "
            "compacted range against the final payload alone (what the model still sees without a recall).",
            "The offline summarizer is extractive; a real model changes the prose, not the fact track.",
        ],
        "metrics": {"runs": results, "coverage_ms_3000": cov_ms, "deterministic": deterministic},
    }
