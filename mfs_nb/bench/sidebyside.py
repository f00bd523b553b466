"""Suite `baselines`: mfs_nb side by side with the strategies other tools use (`baselines.py`).

Same transcript, same window, same payload budget (the usable window), same estimator and offline
summarizer for every strategy; three adversarial strategies (a bag of atoms, atoms with filler, a bare uid map) run
beside them so that a metric which rewards keeping nothing useful shows at once.

The headline is **facts in context** (`atoms.py`, which shares no code with the engine): the
facts stated only in the older two thirds of the conversation (by tokens, never restated later),
and the share of them the final payload still holds — markup stripped, on word boundaries, and
with a content word of their original neighbourhood beside them. Reported by speaker (user,
assistant, tool calls, tool results) and by kind; bare presence (no context) is a secondary
column.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..commands.replay import normalise, replay
from ..window.tokens import estimate_tokens, message_tokens
from ..window.usage import ContextProfile
from . import atoms, baselines, extraction
from .dataset import Data, to_openai

NAME = "baselines"
NEEDS = ("locomo", "claude_code_sessions", "kdconv")
WINDOWS = (8_000, 32_000, 64_000, 128_000)
WORK_KINDS = ("path", "command", "number", "error")  # the working set's kinds (issue 14)
TAU_TASKS = 30  # τ-bench airline trajectories replayed as one session


def _flat(text: str) -> str:
    return " ".join(text.split())


def user_words(messages: list[dict[str, Any]], final: list[dict[str, Any]], upto: int) -> float:
    """Share of the user's tokens (messages before `upto`) whose whole message stands verbatim in
    the markup-free payload."""
    payload = _flat(extraction.payload_text(final))
    users = [m["content"] for m in messages[:upto] if m.get("role") == "user" and (m.get("content") or "").strip()]
    total = sum(estimate_tokens(u) for u in users)
    return sum(estimate_tokens(u) for u in users if _flat(u) in payload) / max(total, 1)


def evidence(conv: dict[str, Any], payload: atoms.Payload, older_than: int) -> dict[str, Any]:
    """LoCoMo questions whose evidence turns all lie before message `older_than`: the share whose
    answer stands in the payload on word boundaries, and the share whose evidence turns all stand
    in it verbatim (markup-blind). Retrieval by the engine's own search is not built yet: n/a."""
    index = {m["id"]: i for i, m in enumerate(conv["messages"])}
    answers = verbatim = n = 0
    for q in conv["questions"]:
        ev = [index[e] for e in q.get("evidence") or () if e in index]
        if not ev or q.get("answer") is None or max(ev) >= older_than or q.get("category") == 5:
            continue
        n += 1
        answers += payload.present(str(q["answer"]))
        verbatim += all(_flat(conv["messages"][i]["content"]) in payload.flat for i in ev)
    return {"answers": answers / n if n else None, "evidence_verbatim": verbatim / n if n else None,
            "evidence_search": None, "questions": n}


class Counter:
    """Token counts of payload messages, remembered by object: payloads share their messages."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[dict[str, Any], int]] = {}

    def __call__(self, m: dict[str, Any]) -> int:
        hit = self._seen.get(id(m))
        if hit is None or hit[0] is not m:
            hit = self._seen[id(m)] = (m, message_tokens(m))
        return hit[1]


def shared_tokens(prev: list[dict[str, Any]], cur: list[dict[str, Any]], count: Counter) -> int:
    """Tokens of the leading messages `cur` repeats from `prev` (what a prefix cache can reuse)."""
    shared = 0
    for a, b in zip(prev, cur):
        if a is not b and a != b:
            break
        shared += count(a)
    return shared


def prefix_ratio(payloads: list[list[dict[str, Any]]], events: list[bool], count: Counter | None = None
                 ) -> float | None:
    count = count or Counter()
    ratios = []
    for prev, cur, ev in zip(payloads, payloads[1:], events[1:]):
        if ev:
            continue
        shared = shared_tokens(prev, cur, count)
        total = sum(count(m) for m in prev)
        ratios.append(shared / max(total, 1))
    return statistics.fmean(ratios) if ratios else None


def run_mfs(messages: list[dict[str, Any]], window: int) -> tuple[baselines.Run, list[bool], dict[str, Any]]:
    """mfs_nb through `replay`: its run, and which messages of the final payload are memory layers
    (neither the system prompt nor a raw event: segments, tracks, notes)."""
    run = baselines.Run()
    uids: list[list[int | None]] = []

    def on_call(session: Any, plan: Any) -> None:
        run.payloads.append(plan.view.messages)
        run.events.append(bool(plan.notices))
        uids.append(plan.view.uids)

    report = replay(normalise(messages), window=window, on_call=on_call)
    run.final = run.payloads[-1] if run.payloads else []
    memory = [k > 0 and u is None for k, u in enumerate(uids[-1])] if uids else []
    return run, memory, report


def measure(name: str, conv_messages: list[dict[str, Any]], window: int, conv: dict[str, Any] | None
            ) -> dict[str, dict[str, Any]]:
    """Every strategy (the adversarial ones too) on one transcript at one window: tokens, prefix
    ratio, facts in context by speaker and kind, user words, and LoCoMo evidence."""
    out: dict[str, dict[str, Any]] = {}
    last = max(i for i, m in enumerate(conv_messages) if m["role"] == "assistant")
    counts = [message_tokens(m) for m in conv_messages]
    facts = atoms.fact_set(conv_messages, last)
    cut = atoms.older_cut(counts, last)
    older = facts.older(cut)
    bag = [f.atom.key for f in sorted(facts.facts.values(), key=lambda f: f.first)]
    for strategy in (*baselines.STRATEGIES, "mfs_nb", *baselines.ADVERSARIAL):
        started = time.perf_counter()
        if strategy == "mfs_nb":
            run, _, _ = run_mfs(conv_messages, window)
        elif strategy in baselines.ADVERSARIAL:
            run = baselines.adversarial(strategy, conv_messages, window, bag, [u for u, _ in facts.df.most_common(3)])
        else:
            run = baselines.simulate(strategy, conv_messages, window)
        count = Counter()
        tokens = [sum(count(m) for m in p) for p in run.payloads]
        payload = atoms.Payload(run.final, facts)
        sc = atoms.score(older, payload)
        row: dict[str, Any] = {
            "calls": len(tokens), "tokens_total": sum(tokens), "tokens_per_call": statistics.fmean(tokens),
            "final_tokens": tokens[-1] if tokens else 0, "over_window": sum(t > window for t in tokens),
            "prefix": None if strategy in baselines.ADVERSARIAL else prefix_ratio(run.payloads, run.events, count),
            "facts": sc.rate, "facts_stated": sc.stated(), "presence": sc.presence, "n_facts": sc.total,
            "n_stated": sc.stated_counts()[1], "n_no_context": sum(f.first < cut for f in facts.no_context.values()),
            **{f"facts_{src}": sc.of("source", src) for src in atoms.SOURCES},
            **{f"n_{src}": sc.by_source.get(src, (0, 0))[1] for src in atoms.SOURCES},
            **{f"kind_{k}": sc.of("kind", k) for k in atoms.KINDS},
            **{f"wkind_{k}": sc.of("working", k) for k in atoms.KINDS},
            **{f"n_wkind_{k}": sc.by_kind_working.get(k, (0, 0))[1] for k in atoms.KINDS},
            "user_words": user_words(conv_messages, run.final, last),
            "seconds": round(time.perf_counter() - started, 1)}
        if conv is not None:
            row.update(evidence(conv, payload, cut))
        out[strategy] = row
    return out


def import_events(store_dir: str, name: str, messages: list[dict[str, Any]]) -> None:
    """Write a transcript into a store in a few batches, exactly as `Session.record` would have
    (uids, turns, turn starts, tool pairing), without paying one write per event."""
    from ..events import Event, now_iso
    from ..store import Store

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


PRODUCTION_WINDOW = 32_000


def head_within(messages: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The messages cut to `budget` tokens in all: each keeps the head of its content, in
    proportion to its size (so no layer is favoured)."""
    sizes = [estimate_tokens(m.get("content") or "") for m in messages]
    total = sum(sizes)
    if total <= budget:
        return list(messages)
    out = []
    for m, size in zip(messages, sizes):
        share = budget * size // max(total, 1)
        text = m.get("content") or ""
        text = text[:max(0, len(text) * share // max(size, 1))]
        while text and estimate_tokens(text) > share:
            text = text[:int(len(text) * 0.95)]
        if text:
            out.append({**m, "content": text})
    return out


def production(data: Data, window: int = PRODUCTION_WINDOW) -> list[dict[str, Any]]:
    """Each coding session with a recorded auto-compaction: the history before it replayed through
    mfs_nb at 32k, its memory layers (everything but the raw tail) cut to the production summary's
    own token size, against Claude Code's own summary of that history; plus, labelled, mfs_nb's
    memory layers whole and its full payload. Facts: those stated only in the older two thirds."""
    rows = []
    for c in data.get("claude_code_sessions"):
        if not c.get("compact_at") or not c.get("compact_summary"):
            continue
        before = to_openai(c["messages"][:c["compact_at"]])
        while before and before[-1]["role"] != "assistant":
            before.pop()
        last = len(before) - 1
        facts = atoms.fact_set(before, last)
        older = facts.older(atoms.older_cut([message_tokens(m) for m in before], last))
        run, memory, _ = run_mfs(before, window)
        summary = c["compact_summary"]
        size = estimate_tokens(summary)
        layers = [m for m, is_memory in zip(run.final, memory) if is_memory]
        for label, msgs in (("production summary", [{"role": "user", "content": summary}]),
                            ("mfs_nb memory layers, cut to the summary's size", head_within(layers, size)),
                            ("mfs_nb memory layers, whole", layers),
                            (f"mfs_nb full payload at {window // 1000}k", run.final)):
            sc = atoms.score(older, atoms.Payload(msgs, facts))
            rows.append({"session": c["id"][:8], "payload": label,
                         "tokens": sum(estimate_tokens(m.get("content") or "") for m in msgs),
                         "facts": sc.rate, "stated": sc.stated(), "n_facts": sc.total,
                         **{f"kind_{k}": sc.of("kind", k) for k in atoms.KINDS},
                         **{f"n_kind_{k}": sc.by_kind.get(k, (0, 0))[1] for k in atoms.KINDS},
                         **{f"wkind_{k}": sc.of("working", k) for k in atoms.KINDS},
                         **{f"n_wkind_{k}": sc.by_kind_working.get(k, (0, 0))[1] for k in atoms.KINDS},
                         **{f"facts_{src}": sc.of("source", src) for src in atoms.SOURCES},
                         "presence": sc.presence})
    return rows


def bars(prod: list[dict[str, Any]]) -> list[list[Any]]:
    """Issue 14's bars, per session and working-set kind that the history states."""
    out = []
    for session in dict.fromkeys(r["session"] for r in prod):
        mine = [r for r in prod if r["session"] == session]
        summary, cut, _, full = mine  # the order `production` writes them in
        for k in WORK_KINDS:
            n = summary[f"n_wkind_{k}"]
            if not n:
                continue
            p, f, c = summary[f"wkind_{k}"] or 0.0, full[f"wkind_{k}"] or 0.0, cut[f"wkind_{k}"] or 0.0
            floor = 0.6 if k in ("path", "command") else 0.0
            out.append([session, k, n, _pct(p), _pct(f), "yes" if f >= 3 * p and f >= floor else "NO", _pct(c),
                        "yes" if c >= p else "NO"])
    return out


def _concat(convs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [m for c in convs for m in to_openai(c)]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "—"
    return f"{a / b:.1f}×" if b else ("∞" if a else "—")


ALL = (*baselines.STRATEGIES, "mfs_nb", *baselines.ADVERSARIAL)


def run(data: Data, quick: bool) -> dict[str, Any]:
    locomo = data.get("locomo")
    coding = [c for c in data.get("claude_code_sessions") if len(c["messages"]) > 100]
    plan: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, tuple[int, ...]]] = []
    if quick:
        plan.append((f"LoCoMo {locomo[0]['id']}", to_openai(locomo[0]["messages"]), locomo[0], (8_000,)))
        small = min(coding, key=lambda c: len(c["messages"]))
        plan.append((f"coding {small['id'][:8]}", to_openai(small["messages"]), None, (32_000,)))
    else:
        for c in locomo:
            plan.append((f"LoCoMo {c['id']}", to_openai(c["messages"]), c, (8_000,)))
        plan.append(("LoCoMo ×6 (one session)", _concat([c["messages"] for c in locomo]), None, (32_000, 128_000)))
        for c in coding:
            plan.append((f"coding {c['id'][:8]}", to_openai(c["messages"]), None, WINDOWS))
        plan.append(("KdConv ×60 (one session)", _concat([c["messages"] for c in data.get("kdconv")[:60]]), None,
                     (8_000, 32_000)))
        tau = [m for c in data.get("taubench_airline")[:TAU_TASKS] for m in to_openai(c["messages"])
               if m["role"] != "system"]  # one policy prompt per task would be the same text thirty times
        plan.append((f"τ-bench airline ×{TAU_TASKS} (one session)", tau, None, (32_000, 64_000)))
    rows: list[list[Any]] = []
    kinds: list[list[Any]] = []
    working: list[list[Any]] = []
    metrics: dict[str, Any] = {}
    for name, msgs, conv, windows in plan:
        total = sum(message_tokens(m) for m in msgs)
        for window in windows:
            if window > 8_000 and total < ContextProfile(window).effective:
                continue  # the conversation fits: nothing would ever leave the window
            result = measure(name, msgs, window, conv)
            metrics[f"{name}@{window}"] = result
            for strategy, r in result.items():
                rows.append([name, f"{window // 1000}k", strategy, f"{r['tokens_per_call']:,.0f}",
                             f"{r['final_tokens']:,}", r["over_window"], _pct(r["prefix"]),
                             f"{_pct(r['facts'])} ({r['n_facts']})",
                             *(f"{_pct(r[f'facts_{src}'])} ({r[f'n_{src}']})" for src in atoms.SOURCES),
                             _pct(r["presence"]),
                             _pct(r["user_words"]),
                             (f"{_pct(r['answers'])} / {_pct(r['evidence_verbatim'])} / n/a"
                              if "answers" in r else "—")])
                kinds.append([name, f"{window // 1000}k", strategy, f"{r['final_tokens']:,}",
                              *(_pct(r[f"kind_{k}"]) for k in atoms.KINDS)])
                if name.startswith(("coding", "τ-bench")) and strategy in (*baselines.STRATEGIES, "mfs_nb"):
                    working.append([name, f"{window // 1000}k", strategy, f"{r['final_tokens']:,}",
                                    *(f"{_pct(r[f'wkind_{k}'])} ({r[f'n_wkind_{k}']})" for k in WORK_KINDS),
                                    _pct(r["facts_tool_result"])])
    marks = (100, 1_000) if quick else (100, 1_000, 10_000)
    long = _concat([c["messages"] for c in locomo])
    if not quick:
        long += _concat([c["messages"] for c in data.get("kdconv")[:600]])
    over = overhead(long, marks)
    metrics["overhead"] = over
    prod = [] if quick else production(data)
    metrics["production"] = prod
    summary_rows = []
    for key, result in metrics.items():
        if "@" not in key:
            continue
        best_name = max(baselines.STRATEGIES, key=lambda s: result[s]["facts_stated"] or 0.0)
        best = result[best_name]["facts_stated"]
        mfs = result["mfs_nb"]["facts_stated"]
        worst_adv = max(max(result[s]["facts"] or 0.0, result[s]["facts_stated"] or 0.0)
                        for s in baselines.ADVERSARIAL)
        conv_name, at = key.rsplit("@", 1)
        summary_rows.append([conv_name, f"{int(at) // 1000}k", f"{_pct(mfs)} ({result['mfs_nb']['n_stated']})",
                             f"{_pct(best)} ({best_name})",
                             _ratio(mfs, best), _pct(worst_adv), f"{result['mfs_nb']['final_tokens']:,}",
                             f"{result[best_name]['final_tokens']:,}", _pct(result["mfs_nb"]["prefix"])])
    source_cols = ["user", "assistant", "tool calls", "tool-call content", "tool results"]
    tables = [
        {"caption": "Facts in context, the headline, at equal budgets (every strategy may use the same usable "
                    "window; what each uses is shown). Counts the facts stated only in the older two thirds of the "
                    "conversation that the final payload holds beside a word of their original context; does not "
                    "count a fact that is merely present (next column but three) or recallable; n in brackets",
         "columns": ["conversation", "window", "strategy", "tokens / call", "final payload tokens",
                     "calls over window", "prefix-cache ratio, ordinary calls", "facts in context, all",
                     *(f"facts in context, {c}" for c in source_cols), "atoms present, no context (secondary)",
                     "user words kept", "LoCoMo answers present / evidence verbatim / evidence by search"],
         "rows": rows},
        {"caption": "mfs_nb against the best baseline on stated facts in context (user, assistant, tool-call "
                    "and tool-call content facts; n in brackets); the adversarial column is the highest any adversarial strategy scores, "
                    "on all facts or stated facts, and must stay near zero",
         "columns": ["conversation", "window", "mfs_nb", "best baseline", "ratio", "adversarial (max)",
                     "mfs_nb final tokens", "best baseline final tokens", "mfs_nb prefix ratio"],
         "rows": summary_rows},
        {"caption": "Facts in context by kind (all speakers). Counts facts of the older two thirds by the "
                    "extractor's kind; — where the conversation states none of that kind",
         "columns": ["conversation", "window", "strategy", "final payload tokens", *atoms.KINDS],
         "rows": kinds},
        {"caption": "The working set by kind: facts of the older two thirds that the user or the assistant stated or "
                    "that a tool call acted on (its file, command, pattern — not the text it carried), in context; "
                    "n in brackets; tool-result facts (what tools printed) for reference",
         "columns": ["conversation", "window", "strategy", "final payload tokens",
                     *(f"working set: {k}s" for k in WORK_KINDS), "tool results"],
         "rows": working},
        {"caption": "Memory layer time per call as history grows (32k window, ms). Counts prepare_call, the whole "
                    "memory layer before a model call; not the store writes of the turn",
         "columns": ["events of history", "ordinary p50", "ordinary p95", "calls timed", "slowest compaction call"],
         "rows": [[f"{m:,}", f"{v['ordinary_p50']:.1f}", f"{v['ordinary_p95']:.1f}", v["calls"],
                   f"{v['events_max']:.0f}"] for m, v in over.items()]},
    ]
    if prod:
        tables.append({
            "caption": "Production comparison: Claude Code's own summary at its recorded auto-compaction against "
                       "mfs_nb on the same history replayed at 32k — first at equal size (mfs_nb's memory layers cut "
                       "to the summary's tokens), then, labelled, its whole memory layers and its full payload. "
                       "Counts facts stated only in the older two thirds of that history, in context; by kind, the "
                       "working set (what was said, and what the tool calls acted on), n in brackets",
            "columns": ["session", "payload", "tokens", "facts in context, all", "stated (user, assistant, tool calls)",
                        *(f"working set: {k}s" for k in (*WORK_KINDS, "ident")), "facts (n)"],
            "rows": [[r["session"], r["payload"], f"{r['tokens']:,}", _pct(r["facts"]), _pct(r["stated"]),
                      *(f"{_pct(r[f'wkind_{k}'])} ({r[f'n_wkind_{k}']})" for k in (*WORK_KINDS, "ident")),
                      r["n_facts"]] for r in prod]})
        tables.append({
            "caption": "The production comparison against issue 14's bars, per working-set kind: mfs_nb's full payload "
                       "at least 3 × the production summary, and at least 60 % for files and commands; its memory "
                       "layers cut to the summary's size at least the summary",
            "columns": ["session", "kind", "n", "production summary", "mfs_nb full payload", "≥ 3 × (and ≥ 60 %)",
                        "mfs_nb memory layers at the summary's size", "≥ summary"],
            "rows": bars(prod)})
    return {
        "title": "Side by side: mfs_nb against last-N, truncate-to-fit, rolling summary, user-messages + summary, "
                 "and three adversarial strategies",
        "tables": tables,
        "notes": [
            "Every strategy gets the same transcript, window, payload budget (the usable window), estimator and "
            "offline extractive summarizer; a call happens before each recorded assistant message. bag-of-atoms "
            "(every atom of the history, no context) and uid-map (segment headers, no prose) keep the same raw tail "
            "as the rolling summary and fill the rest of the budget; their tokens are those of the final payload.",
            "Facts come from `mfs_nb/bench/atoms.py`, which imports nothing from the engine: paths (last two "
            "components), shell commands (first four words of each sub-command), numbers of three or more digits or "
            "with a unit, error class names, identifiers, proper names. Every payload goes through one strip_markup "
            "(uid tags and ranges, segment headers, recall handles, cleared stubs, captions) before matching.",
            "In context: an atom counts only where a content word that stood within 8 words of it on its line in the "
            "original stands within 8 words of it on its line in the payload, that word stood beside at most half of "
            "the conversation's facts, and in the payload it stands beside at most twice as many facts as in the "
            "conversation (so filler repeated after every atom vouches for none). Facts with no such word anywhere "
            "in the conversation (a path read by a bare Read call, say) are left out for every strategy; their "
            "count is in the JSON metrics (n_no_context). The whole history verbatim scores 89–100 % on this data.",
            "Adversarial strategies: bag-of-atoms (every atom, no context), atoms+filler (every atom followed by the "
            "three words most common around facts in this conversation) and uid-map (segment headers, no prose); "
            "tests/test_atoms.py asserts they stay at or under 5 %.",
            "Older two thirds: messages before the point where the newest third of the conversation's tokens begins; "
            "a fact restated after it is not counted (the raw tail would carry it). The set is the same for every "
            "strategy. Source: who stated a fact first (user, assistant prose, an assistant's tool call — its name "
            "and its short single-line arguments: the file, command or pattern it acts on —, the content a tool "
            "call carries — longer or multi-line arguments: a file's new text, a prompt —, a tool result). The "
            "working set (issue 14) is user, assistant and tool-call facts.",
            "LoCoMo (each conversation at 8k, with its questions of categories 1–4 whose evidence lies in the older "
            "two thirds): answers present on word boundaries, evidence turns present verbatim (markup-blind); "
            "evidence retrieved by the engine's own search is n/a until semantic recall exists.",
            "Redefined on 2026-11-30: the earlier 'fact survival' matched the engine's own regexes as substrings "
            "(an atom inside a uid counted) and 'evidence reachable' counted any uid inside a named range; both are "
            "gone. mfs_nb's numbers fell accordingly.",
            "Redefined again on 2026-11-30 (issue 14): tool-call facts are split into what a call acts on and the "
            "content it carries, reported separately; 'stated' counts both, the working-set tables the first. A "
            "path inside a test file the agent wrote is content, not a file it touched.",
        ],
        "metrics": metrics,
    }
