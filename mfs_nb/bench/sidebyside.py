"""Suite `baselines`: mfs_nb side by side with the strategies other tools use (`baselines.py`).

Same transcript, same window, same estimator and offline summarizer for every strategy. Per
conversation, window and strategy: tokens sent, prefix-cache ratio on ordinary calls, fact
survival, user-words survival, and for LoCoMo evidence survival. Plus the memory layer's own time
per call as history grows, and the production comparison on the coding sessions that recorded
Claude Code's own auto-compaction.

Fact survival: the *atoms* (numbers, paths, commands in backticks, error names) of the messages
that left a strategy's raw tail, minus atoms the raw tail itself still shows, and the share of
those present verbatim in the rest of its final payload. "Stated" counts user and assistant
messages (and tool-call arguments); "all" adds tool output.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

from ..facts import _NUMBER, _PATH
from ..replay import normalise, replay
from ..tokens import estimate_tokens, message_tokens
from ..usage import ContextProfile
from . import baselines
from .data import Data, to_openai

NAME = "baselines"
NEEDS = ("locomo", "claude_code_sessions", "kdconv")
WINDOWS = (8_000, 32_000, 128_000)
_ERROR_NAME = re.compile(r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b|\bexit (?:code|status) \d+")
_BACKTICK = re.compile(r"`([^`\s][^`\n]{1,78}[^`\s])`")
_RANGES = re.compile(r"uids ((?:\d+–\d+(?:, )?)+)")
_RANGE = re.compile(r"(\d+)–(\d+)")
_SINGLE = re.compile(r"\[#(\d+)\]|#(\d+)–#(\d+)")


def atoms(text: str) -> set[str]:
    """Exact items a model must not get wrong: numbers (two or more characters), paths and URLs,
    commands in backticks, error names."""
    found: set[str] = set()
    for m in _NUMBER.finditer(text):
        a = m.group(0).strip()
        if len(a) >= 2 and any(c.isdigit() for c in a):
            found.add(a)
    found.update(m.group(0).rstrip(".,:;)") for m in _PATH.finditer(text) if len(m.group(0)) >= 4)
    found.update(m.group(1) for m in _BACKTICK.finditer(text))
    found.update(m.group(0) for m in _ERROR_NAME.finditer(text))
    return found


def _text(m: dict[str, Any], with_args: bool = True) -> str:
    args = " ".join((c.get("function") or {}).get("arguments", "") for c in m.get("tool_calls") or ()) \
        if with_args else ""
    return (m.get("content") or "") + (" " + args if args else "")


def fact_survival(messages: list[dict[str, Any]], final: list[dict[str, Any]], raw: list[int | None],
                  upto: int) -> tuple[float | None, float | None, int]:
    """(stated, all, number of stated atoms) for one final payload; `raw[k]` is the transcript
    index of final[k] when it is a raw message, else None."""
    raw_set = {r for r in raw if r is not None}
    raw_text = "\n".join(_text(m) for m, r in zip(final, raw) if r is not None)
    rest = "\n".join(_text(m) for m, r in zip(final, raw) if r is None)
    out = []
    for roles, args in ((("user", "assistant"), False), (("user", "assistant", "tool"), True)):
        left: set[str] = set()
        for i in range(upto):
            if i not in raw_set and messages[i].get("role") in roles:
                left |= atoms(_text(messages[i], args))
        left = {a for a in left if a not in raw_text}
        out.append((sum(1 for a in left if a in rest) / len(left), len(left)) if left else (None, 0))
    return out[0][0], out[1][0], out[0][1]


def user_words(messages: list[dict[str, Any]], final: list[dict[str, Any]], upto: int) -> float:
    payload = "\n".join(m.get("content") or "" for m in final)
    users = [m["content"] for m in messages[:upto] if m.get("role") == "user" and (m.get("content") or "").strip()]
    total = sum(estimate_tokens(u) for u in users)
    return sum(estimate_tokens(u) for u in users if u in payload) / max(total, 1)


def named_uids(texts: list[str]) -> set[int]:
    """uids a payload names for recall: segment and evicted ranges, track entries."""
    named: set[int] = set()
    for t in texts:
        for group in _RANGES.findall(t):
            for a, b in _RANGE.findall(group):
                named.update(range(int(a), int(b) + 1))
        for m in _SINGLE.finditer(t):
            if m.group(1):
                named.add(int(m.group(1)))
            else:
                named.update(range(int(m.group(2)), int(m.group(3)) + 1))
    return named


def evidence(conv: dict[str, Any], messages: list[dict[str, Any]], final: list[dict[str, Any]],
             raw: list[int | None], uid_of: dict[int, int] | None) -> tuple[float, float, int]:
    """(answers present verbatim, evidence turns raw or recallable by a named uid range, questions)."""
    index = {m["id"]: i for i, m in enumerate(conv["messages"])}
    payload = "\n".join(m.get("content") or "" for m in final)
    raw_set = {r for r in raw if r is not None}
    named = named_uids([m.get("content") or "" for m, r in zip(final, raw) if r is None]) if uid_of else set()
    answers = reachable = n = 0
    for q in conv["questions"]:
        ev = [index[e] for e in q.get("evidence") or () if e in index]
        if not ev or q.get("answer") is None:
            continue
        n += 1
        answers += str(q["answer"]) in payload
        reachable += all(i in raw_set or (uid_of is not None and uid_of.get(i) in named) for i in ev)
    return answers / max(n, 1), reachable / max(n, 1), n


class Counter:
    """Token counts of payload messages, remembered by object: payloads share their messages."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[dict[str, Any], int]] = {}

    def __call__(self, m: dict[str, Any]) -> int:
        hit = self._seen.get(id(m))
        if hit is None or hit[0] is not m:
            hit = self._seen[id(m)] = (m, message_tokens(m))
        return hit[1]


def prefix_ratio(payloads: list[list[dict[str, Any]]], events: list[bool], count: Counter | None = None
                 ) -> float | None:
    count = count or Counter()
    ratios = []
    for prev, cur, ev in zip(payloads, payloads[1:], events[1:]):
        if ev:
            continue
        shared = 0
        for a, b in zip(prev, cur):
            if a is not b and a != b:
                break
            shared += count(a)
        total = sum(count(m) for m in prev)
        ratios.append(shared / max(total, 1))
    return statistics.fmean(ratios) if ratios else None


def run_mfs(messages: list[dict[str, Any]], window: int) -> tuple[baselines.Run, dict[int, int], dict[str, Any]]:
    run = baselines.Run()

    def on_call(session: Any, plan: Any) -> None:
        run.payloads.append(plan.view.messages)
        run.events.append(bool(plan.notices))

    report = replay(normalise(messages), window=window, on_call=on_call)
    uid_of = {int(k): v for k, v in report["uids"].items()}
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=0)
    # the final payload is the one of the last call (before the last assistant message)
    final = run.payloads[-1] if run.payloads else []
    run.final = final
    run.final_raw = _raw_of(final, messages, last)
    return run, uid_of, report


def _raw_of(final: list[dict[str, Any]], messages: list[dict[str, Any]], last: int) -> list[int | None]:
    """Transcript indices of the raw messages of an mfs payload: the raw tail is the suffix of
    the transcript before `last` that lines up with the payload's last messages. A tool result
    that S2 cleared or trimmed holds its place but is not raw (its atoms count as having left)."""
    raw: list[int | None] = [None] * len(final)
    k, i = len(final) - 1, last - 1
    while k >= 0 and i >= 0:
        m, t = final[k], messages[i]
        if m.get("role") == t.get("role") and (m.get("tool_calls") is not None) == bool(t.get("tool_calls")) and \
                m.get("role") != "system" and _same(m, t):
            raw[k] = i
            k, i = k - 1, i - 1
            continue
        if m.get("role") == "tool" and t.get("role") == "tool":  # a cleared or trimmed result stands for it
            k, i = k - 1, i - 1
            continue
        break
    return raw


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("content") or "") == (b.get("content") or "") or bool(a.get("tool_calls"))


def measure(name: str, conv_messages: list[dict[str, Any]], window: int, conv: dict[str, Any] | None
            ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    last = max(i for i, m in enumerate(conv_messages) if m["role"] == "assistant")
    for strategy in (*baselines.STRATEGIES, "mfs_nb"):
        started = time.perf_counter()
        uid_of = None
        if strategy == "mfs_nb":
            run, uid_of, _ = run_mfs(conv_messages, window)
        else:
            run = baselines.simulate(strategy, conv_messages, window)
        count = Counter()
        tokens = [sum(count(m) for m in p) for p in run.payloads]
        stated, every, n_atoms = fact_survival(conv_messages, run.final, run.final_raw, last)
        row: dict[str, Any] = {
            "calls": len(tokens), "tokens_total": sum(tokens), "tokens_per_call": statistics.fmean(tokens),
            "over_window": sum(t > window for t in tokens), "prefix": prefix_ratio(run.payloads, run.events, count),
            "facts_stated": stated, "facts_all": every, "atoms": n_atoms,
            "user_words": user_words(conv_messages, run.final, last),
            "seconds": round(time.perf_counter() - started, 1)}
        if conv is not None:
            row["answers"], row["evidence"], row["questions"] = evidence(conv, conv_messages, run.final,
                                                                         run.final_raw, uid_of)
        out[strategy] = row
    return out


def import_events(store_dir: str, name: str, messages: list[dict[str, Any]]) -> None:
    """Write a transcript into a store in a few batches, exactly as `Session.record` would have
    (uids, turns, turn starts, tool pairing), without paying one write per event."""
    from ..events import Event
    from ..store import Store, now_iso

    store = Store(store_dir)
    events: list[Event] = []
    turn = 0
    for i, m in enumerate(normalise(messages)):
        start = m.role == "user" or (m.role == "assistant" and bool(events) and events[-1].role == "tool") or not events
        turn += start
        events.append(Event(i + 1, name, turn, m.role, m.content, m.role, tuple(m.tool_calls), m.tool_call_id, m.name,
                            start, now_iso()))
    for k in range(0, len(events), 2_000):
        store.append_events(events[k:k + 2_000], "import")


def overhead(messages: list[dict[str, Any]], marks: tuple[int, ...], window: int = 32_000,
             turns: int = 30) -> dict[int, dict[str, float]]:
    """The memory layer's own ms per call (no LLM: the offline model) with `mark` events of history:
    the history is imported, the session opened (its first call compacts what does not fit), then
    `turns` more turns are timed. Compaction calls (with the offline summarizer) are reported apart."""
    import shutil
    import tempfile

    from ..session import Session

    out: dict[int, dict[str, float]] = {}
    for mark in marks:
        folder = tempfile.mkdtemp(prefix="mfs-overhead-")
        try:
            import_events(folder, "overhead", messages[:mark])
            s = Session("overhead", store=folder, window_tokens=window, background_compaction=False)
            s.prepare_call()  # catch up: compacts the imported history once
            ordinary: list[float] = []
            events: list[float] = []
            for t in range(turns):
                s.record("user", f"turn {t}: what did we decide about item {t}?", new_turn=True)
                started = time.perf_counter()
                plan = s.prepare_call()
                ms = (time.perf_counter() - started) * 1000
                (events if plan.notices else ordinary).append(ms)
                s.record("assistant", f"We decided {t * 7} units for item {t}. " + "Details follow. " * 30)
            out[mark] = {"ordinary_p50": statistics.median(ordinary) if ordinary else 0.0,
                         "ordinary_p95": sorted(ordinary)[int(0.95 * (len(ordinary) - 1))] if ordinary else 0.0,
                         "calls": len(ordinary) + len(events), "events_max": max(events, default=0.0),
                         "events": len(s.events)}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def production(data: Data) -> list[dict[str, Any]]:
    """Each coding session with a recorded auto-compaction: mfs_nb's payload at that point (200k
    window, the replay of everything before it) against Claude Code's own summary, atom by atom."""
    rows = []
    for c in data.get("claude_code_sessions"):
        if not c.get("compact_at") or not c.get("compact_summary"):
            continue
        before = to_openai(c["messages"][:c["compact_at"]])
        while before and before[-1]["role"] != "assistant":
            before.pop()
        window = 200_000
        run, _, _ = run_mfs(before, window)
        payload = "\n".join(_text(m) for m in run.final)
        summary = c["compact_summary"]
        for roles, label in ((("user", "assistant"), "stated"), (("user", "assistant", "tool"), "all")):
            items = set().union(*(atoms(_text(m, label == "all")) for m in before if m["role"] in roles))
            both = sum(1 for a in items if a in payload and a in summary)
            mfs_only = sum(1 for a in items if a in payload and a not in summary)
            prod_only = sum(1 for a in items if a not in payload and a in summary)
            rows.append({"session": c["id"][:8], "facts": label, "items": len(items), "both": both,
                         "mfs_only": mfs_only, "production_only": prod_only,
                         "neither": len(items) - both - mfs_only - prod_only,
                         "mfs": (both + mfs_only) / max(len(items), 1), "production": (both + prod_only) / max(len(items), 1),
                         "pre_tokens": c.get("pre_tokens"),
                         "mfs_payload_tokens": sum(message_tokens(m) for m in run.final),
                         "summary_tokens": estimate_tokens(summary)})
    return rows


def _concat(convs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [m for c in convs for m in to_openai(c)]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def run(data: Data, quick: bool) -> dict[str, Any]:
    locomo = data.get("locomo")
    coding = [c for c in data.get("claude_code_sessions") if len(c["messages"]) > 100]
    plan: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, tuple[int, ...]]] = []
    if quick:
        plan.append((f"LoCoMo {locomo[0]['id']}", to_openai(locomo[0]["messages"]), locomo[0], (8_000,)))
        plan.append((f"coding {coding[-1]['id'][:8]}", to_openai(coding[-1]["messages"]), None, (32_000,)))
    else:
        for c in locomo:
            plan.append((f"LoCoMo {c['id']}", to_openai(c["messages"]), c, (8_000,)))
        plan.append(("LoCoMo ×6 (one session)", _concat([c["messages"] for c in locomo]), None, WINDOWS))
        for c in coding:
            plan.append((f"coding {c['id'][:8]}", to_openai(c["messages"]), None, WINDOWS))
        plan.append(("KdConv ×60 (one session)", _concat([c["messages"] for c in data.get("kdconv")[:60]]), None,
                     (8_000, 32_000)))
        plan = [(n, m, c, w if not n.startswith("LoCoMo ×6") else (32_000, 128_000)) for n, m, c, w in plan]
    rows: list[list[Any]] = []
    metrics: dict[str, Any] = {}
    for name, msgs, conv, windows in plan:
        total = sum(message_tokens(m) for m in msgs)
        for window in windows:
            if window > 8_000 and total < ContextProfile(window).effective:
                continue  # the conversation fits: nothing would ever leave the window
            result = measure(name, msgs, window, conv)
            metrics[f"{name}@{window}"] = result
            for strategy, r in result.items():
                rows.append([name, f"{window // 1000}k", strategy, f"{r['tokens_per_call']:,.0f}", r["over_window"],
                             _pct(r["prefix"]), _pct(r["facts_stated"]), _pct(r["facts_all"]),
                             _pct(r["user_words"]),
                             f"{_pct(r['answers'])} / {_pct(r['evidence'])}" if "answers" in r else "—"])
    marks = (100, 1_000) if quick else (100, 1_000, 10_000)
    long = _concat([c["messages"] for c in locomo])
    if not quick:
        long += _concat([c["messages"] for c in data.get("kdconv")[:600]])
    over = overhead(long, marks)
    metrics["overhead"] = over
    prod = [] if quick else production(data)
    metrics["production"] = prod
    at32 = {k: v for k, v in metrics.items() if k.endswith("@32000")}
    summary_rows = []
    for key, result in at32.items():
        best = max((result[s]["facts_stated"] or 0.0) for s in baselines.STRATEGIES)
        mfs = result["mfs_nb"]["facts_stated"]
        ratio = "—" if mfs is None else (f"{mfs / best:.1f}×" if best else "∞")
        summary_rows.append([key.rsplit("@", 1)[0], _pct(mfs), _pct(best), ratio, _pct(result["mfs_nb"]["prefix"])])
    tables = [
        {"caption": "Side by side (final payload of each replay; 'ordinary' calls have no memory event)",
         "columns": ["conversation", "window", "strategy", "tokens / call", "calls over window",
                     "prefix-cache ratio, ordinary calls", "fact survival, stated", "fact survival, all",
                     "user words kept", "LoCoMo answers / evidence reachable"],
         "rows": rows},
        {"caption": "At 32k: mfs_nb against the best baseline (stated facts; — where nothing left mfs_nb's raw tail)",
         "columns": ["conversation", "mfs_nb", "best baseline", "ratio", "mfs_nb prefix ratio"],
         "rows": summary_rows},
        {"caption": "Memory layer time per call as history grows (32k window, ms)",
         "columns": ["events of history", "ordinary p50", "ordinary p95", "calls timed", "slowest compaction call"],
         "rows": [[f"{m:,}", f"{v['ordinary_p50']:.1f}", f"{v['ordinary_p95']:.1f}", v["calls"],
                   f"{v['events_max']:.0f}"] for m, v in over.items()]},
    ]
    if prod:
        tables.append({"caption": "Production comparison: mfs_nb's payload vs Claude Code's own summary at its "
                                  "recorded auto-compaction (200k window)",
                       "columns": ["session", "facts", "items", "in both", "mfs_nb only", "summary only", "neither",
                                   "mfs_nb", "production summary", "mfs_nb payload tokens", "summary tokens"],
                       "rows": [[r["session"], r["facts"], r["items"], r["both"], r["mfs_only"], r["production_only"],
                                 r["neither"], _pct(r["mfs"]), _pct(r["production"]),
                                 f"{r['mfs_payload_tokens']:,}", f"{r['summary_tokens']:,}"] for r in prod]})
    return {
        "title": "Side by side: mfs_nb against last-N, truncate-to-fit, rolling summary and user-messages + summary",
        "tables": tables,
        "notes": [
            "Every strategy gets the same transcript, window, estimator and offline extractive summarizer; a call "
            "happens before each recorded assistant message.",
            "Fact survival counts atoms (numbers, paths, commands in backticks, error names) of the messages that left "
            "a strategy's raw tail and that its raw tail does not show, present verbatim elsewhere in its final "
            "payload. 'Stated' is what user and assistant messages say; 'all' adds tool-call arguments and tool output.",
            "Evidence reachable: every evidence turn of a LoCoMo question is raw in the final payload, or (mfs_nb "
            "only, since only it names uids) inside a uid range the payload names for recall_history.",
            "Overhead: the first 100, 1,000 and 10,000 messages of one long session (LoCoMo ×6 then KdConv) are "
            "imported, the session opened and caught up, then 30 more turns timed: prepare_call, the whole memory "
            "layer before a model call. Compaction calls include the offline summarizer and are shown apart.",
            "LoCoMo ×6 runs at 32k and 128k only; at 8k each LoCoMo conversation runs on its own (with its questions).",
        ],
        "metrics": metrics,
    }
