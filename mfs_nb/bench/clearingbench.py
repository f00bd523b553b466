"""Suite `clearing` (S2): the coding-agent sessions replayed at a 64k window, with S2 and without.

Per session: peak payload, calls over the usable window, calls at or past the compress line (each
would have needed an LLM compaction), clearing events, tokens sent, orphaned tool pairs in any
payload, and whether every recall handle in the final payload returns the original bytes. Plus
the compressor digest's reduction and the time of one S2 pass at 1k and 10k events.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from ..commands.replay import normalise, replay
from ..events import Event, content_hash
from ..layers.clearing import Clearing
from ..layers.facts import tool_digest
from ..layers.view import project, unpaired
from .dataset import Data, to_openai

NAME = "clearing"
NEEDS = ("claude_code_sessions",)
WINDOW = 64_000
HANDLE = re.compile(r"recall_history\((\d+), (\d+)\)")


def _run(messages: list[Any], s2: bool) -> dict[str, Any]:
    stats: dict[str, Any] = {"calls": 0, "over": 0, "compress": 0, "unpaired": 0, "sent": 0, "peak": 0,
                             "handles": 0, "handles_ok": 0}

    def on_call(session: Any, plan: Any) -> None:
        stats["calls"] += 1
        tokens = sum(session.token_counts(plan.view))
        stats["sent"] += tokens
        stats["peak"] = max(stats["peak"], tokens)
        stats["over"] += tokens > plan.usage.effective
        stats["compress"] += plan.usage.tier in ("compress", "hard")
        stats["unpaired"] += unpaired(plan.view.messages)

    def keep(session: Any) -> None:
        originals = {e.uid: e for e in session.events}
        for m in session.send_view().messages:
            for a, b in HANDLE.findall(m.get("content") or "") + [
                    h for c in m.get("tool_calls") or () for h in HANDLE.findall((c.get("function") or {}).get("arguments", ""))]:
                stats["handles"] += 1
                got = session.recall(int(a), int(b))
                stats["handles_ok"] += len(got) == 1 and got[0].sha256 == content_hash(originals[int(a)].content)

    report = replay(messages, window=WINDOW, on_call=on_call, keep=keep, tool_clearing=s2, auto_compaction=False)
    stats["ledger"] = [r for r in report["ledger"] if r["kind"] == "clearing"]
    stats["lost"] = report["coverage"]["lost"]
    return stats


def _pass_time(n_events: int) -> float:
    events: list[Event] = []
    uid = 0
    while len(events) < n_events:
        uid += 1
        events.append(Event(uid, "b", uid, "user", f"step {uid}: build lib/app_{uid}.ex"))
        uid += 1
        events.append(Event(uid, "b", uid, "assistant", "", tool_calls=({"id": f"c{uid}", "type": "function",
                            "function": {"name": "Bash", "arguments": json.dumps({"command": "mix compile " * 30})}},)))
        uid += 1
        events.append(Event(uid, "b", uid, "tool", "Compiling 3 files (.ex)\n" * 200, tool_call_id=f"c{uid - 1}"))
    clearing = Clearing(trim_chars=7000, clear_before=uid - 30, prune_before=uid - 30)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        project(events, "system", clearing=clearing)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def run(data: Data, quick: bool) -> dict[str, Any]:
    sessions = [c for c in data.get("claude_code_sessions") if len(c["messages"]) > 100]
    if quick:
        sessions = sessions[:1]
    rows: list[list[Any]] = []
    metrics: dict[str, Any] = {"sessions": {}}
    for conv in sessions:
        messages = normalise(to_openai(conv["messages"]))
        with_s2, without = _run(messages, True), _run(messages, False)
        cleared = sum(r["cleared"] for r in with_s2["ledger"])
        saved = without["sent"] - with_s2["sent"]
        rows.append([conv["id"][:8], with_s2["calls"], f"{without['peak']:,} → {with_s2['peak']:,}",
                     f"{without['over']} → {with_s2['over']}", f"{without['compress']} → {with_s2['compress']}",
                     len(with_s2["ledger"]), cleared, f"{saved:,} ({saved / without['sent']:.0%})",
                     with_s2["unpaired"], f"{with_s2['handles_ok']}/{with_s2['handles']}"])
        metrics["sessions"][conv["id"]] = {"with_s2": {k: v for k, v in with_s2.items() if k != "ledger"},
                                           "without_s2": {k: v for k, v in without.items() if k != "ledger"},
                                           "clearing_events": len(with_s2["ledger"]), "results_cleared": cleared}
    results = [m["content"] for c in data.get("claude_code_sessions") for m in c["messages"] if m["role"] == "tool"]
    raw_chars = sum(len(t) for t in results)
    digest_chars = sum(len(tool_digest(t)) for t in results)
    metrics["digest"] = {"results": len(results), "chars": raw_chars, "digest_chars": digest_chars}
    timing = {n: _pass_time(n) for n in (1_000, 10_000)}
    metrics["s2_pass_ms"] = timing
    return {
        "title": "S2 tool-result clearing (coding-agent sessions, 64k window)",
        "tables": [
            {"caption": "Each session replayed without S2 → with S2 (the log is the same; only the send view differs)",
             "columns": ["session", "calls", "peak payload", "calls over window", "calls ≥ compress line",
                         "clearing events", "results cleared", "tokens sent saved", "orphaned pairs",
                         "handles that recall the original"],
             "rows": rows},
            {"caption": "Compressor digest and cost",
             "columns": ["measure", "value"],
             "rows": [[f"tool_digest over all {len(results)} tool results",
                       f"{raw_chars:,} → {digest_chars:,} chars ({digest_chars / max(raw_chars, 1):.0%})"],
                      ["one S2 projection pass, 1,000 events", f"{timing[1_000]:.1f} ms"],
                      ["one S2 projection pass, 10,000 events", f"{timing[10_000]:.1f} ms"]]},
        ],
        "notes": [
            "Seed reference: a 40-turn synthetic session, 72 results cleared and 8 pruned, 167,552 chars saved, "
            "compaction skipped; compressor digest 59,994 → 15,010 chars. S3 is off in both runs here, so the numbers are S2 alone.",
            "'calls ≥ compress line' counts the calls that, without S2, would have needed an LLM compaction "
            "first; S2 brings them to the number on the right with zero LLM calls.",
            "A projection pass includes pairing and S2 over every event; the pass is pure and is what "
            "runs before each model call.",
        ],
        "metrics": metrics,
    }
