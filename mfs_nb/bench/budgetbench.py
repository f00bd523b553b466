"""Suite `budget` (issue 43): mfs_nb's one budget against `compact-90`, the production assistants'
way (at 90 % of the usable window everything before the current turn becomes one summary), on the
long shared sessions at 8k, 32k and 128k — and, at 16k, what the final payload holds against
truncation cut to the same size.

Per run, every figure from the harness's own reading of what each strategy sent (never from the
engine's counters): compactions and summarizer tokens (read + written) per 100k tokens of new
content, the prefix ratio over all calls (leading messages equal to the previous call's, as a share
of it: `sidebyside.prefix_ratio`), the final raw tail, the final payload, and the facts stated only
in the older two thirds still in the final payload (`atoms`). Both strategies summarize with the
same offline extractive summarizer, whose calls are counted by their size as a real model's would be.
"""

from __future__ import annotations

from typing import Any

from ..commands.replay import normalise, replay
from ..window.tokens import message_tokens
from . import atoms, baselines, onestep
from .dataset import Data, to_openai
from .sidebyside import Counter, evidence, prefix_ratio, shared_tokens

NAME = "budget"
NEEDS = ("locomo", "claude_code_sessions")
WINDOWS = (8_192, 32_768, 131_072)
EQUAL_AT = 16_384  # the window of the same-size comparison with truncation
PAYBACK_GATE = 40.0  # issue 15's consolidation gate, written here (not read from the engine it judges)
PER = 100_000  # figures per this many tokens of new content


def paybacks(payloads: list[list[dict[str, Any]]], count: Counter) -> list[float]:
    """Each call whose payload no longer starts with the whole previous one and is smaller than it
    (a compaction or a consolidation, read from the payloads): the calls it takes to pay its cache
    miss back, tokens after the shared prefix ÷ tokens freed — the gate consolidation uses. Freed is
    counted as the drop in payload size, less than what the call saved (its new message is in the
    new payload), so the figure errs high."""
    out = []
    for prev, cur in zip(payloads, payloads[1:]):
        shared = shared_tokens(prev, cur, count)
        before, after = sum(count(m) for m in prev), sum(count(m) for m in cur)
        if shared < min(before, after) and after < before:
            out.append((after - shared) / (before - after))
    return out


def run_mfs(messages: list[dict[str, Any]], window: int) -> dict[str, Any]:
    """mfs_nb through `replay`: its payloads, the summarizer's tokens and compactions (ledger), and
    the raw tail of its final payload."""
    payloads: list[list[dict[str, Any]]] = []
    raw: list[bool] = []
    seen: dict[str, Any] = {}

    def on_call(session: Any, plan: Any) -> None:
        payloads.append(plan.view.messages)
        raw[:] = [u is not None for u in plan.view.uids]

    def keep(session: Any) -> None:
        seen["ledger"] = session.ledger()

    replay(normalise(messages), window=window, on_call=on_call, keep=keep)
    ledger = seen["ledger"]
    final = payloads[-1] if payloads else []
    return {"payloads": payloads, "final": final,
            "compactions": sum(r["kind"] == "compaction" for r in ledger),
            "merges": sum(r["kind"] == "consolidation" and bool(r.get("accepted")) for r in ledger),
            "summarizer": sum(int(r.get("prompt_tokens", 0)) + int(r.get("completion_tokens", 0))
                              for r in ledger if r["kind"] == "summarizer"),
            "raw_tail": sum(message_tokens(m) for m, is_raw in zip(final, raw) if is_raw)}


def run_compact90(messages: list[dict[str, Any]], window: int) -> dict[str, Any]:
    run = baselines.simulate("compact-90", messages, window)
    return {"payloads": run.payloads, "final": run.final, "compactions": len(run.summaries), "merges": 0,
            "summarizer": sum(a + b for a, b in run.summaries),
            "raw_tail": sum(message_tokens(m) for m, i in zip(run.final, run.final_raw) if i is not None)}


def measure(messages: list[dict[str, Any]], window: int, conv: dict[str, Any] | None = None
            ) -> dict[str, dict[str, Any]]:
    content = sum(message_tokens(m) for m in messages)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    counts = [message_tokens(m) for m in messages]
    facts = atoms.fact_set(messages, last)
    cut = atoms.older_cut(counts, last)
    out: dict[str, dict[str, Any]] = {}
    for name, run in (("mfs_nb", run_mfs), ("compact-90", run_compact90)):
        r = run(messages, window)
        payloads = r.pop("payloads")
        count = Counter()
        final = r.pop("final")
        payload = atoms.Payload(final, facts)
        row = {**r, "calls": len(payloads), "content": content,
               "compactions_per": PER * r["compactions"] / content, "summarizer_per": PER * r["summarizer"] / content,
               "prefix": prefix_ratio(payloads, [False] * len(payloads), count),
               "payback": max(paybacks(payloads, count), default=None),
               "final_tokens": sum(count(m) for m in final),
               "facts": atoms.score(facts.older(cut), payload).rate}
        if conv is not None:
            row["answers"] = evidence(conv, payload, len(messages))["answers"]
        out[name] = row
    return out


def same_size(messages: list[dict[str, Any]], conv: dict[str, Any], window: int) -> dict[str, Any]:
    """mfs_nb's final payload at `window` against the newest messages that fit the same number of
    tokens (truncation at equal size): the share of questions whose answer each holds."""
    facts = atoms.fact_set(messages, len(messages) - 1)
    r = run_mfs(messages, window)
    size = sum(message_tokens(m) for m in r["final"])
    truncated = onestep.truncated(messages, size)
    used = sum(message_tokens(m) for m in truncated)
    ours = evidence(conv, atoms.Payload(r["final"], facts), len(messages))
    theirs = evidence(conv, atoms.Payload(truncated, facts), len(messages))
    return {"size": size, "truncated": used, "mfs_nb": ours["answers"], "truncate": theirs["answers"],
            "questions": ours["questions"], "raw_tail": r["raw_tail"]}


def _joined(convs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """LoCoMo conversations as one session, with one conversation record whose message ids (and
    the questions' evidence ids) are made unique by the conversation's id."""
    messages, records, questions = [], [], []
    for c in convs:
        messages += to_openai(c["messages"])
        records += [{**m, "id": f"{c['id']}/{m['id']}"} for m in c["messages"]]
        questions += [{**q, "evidence": [f"{c['id']}/{e}" for e in q.get("evidence") or ()]} for q in c["questions"]]
    return messages, {"messages": records, "questions": questions}


def _calls(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def run(data: Data, quick: bool) -> dict[str, Any]:
    locomo = data.get("locomo")
    coding = sorted((c for c in data.get("claude_code_sessions") if len(c["messages"]) > 100),
                    key=lambda c: len(c["messages"]))
    joined, record = _joined(locomo[:1] if quick else locomo)
    plan: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None, tuple[int, ...]]] = [
        (f"LoCoMo {locomo[0]['id']}" if quick else "LoCoMo ×6 (one session)", joined, record,
         (8_192,) if quick else WINDOWS)]
    plan += [(f"coding {c['id'][:8]}", to_openai(c["messages"]), None, (32_768,) if quick else WINDOWS)
             for c in (coding[:1] if quick else coding)]
    rows: list[list[Any]] = []
    metrics: dict[str, Any] = {}
    for label, messages, conv, windows in plan:
        for window in windows:
            for name, r in measure(messages, window, conv).items():
                metrics[f"{label}@{window}/{name}"] = r
                rows.append([label, f"{window // 1024}k", name, r["calls"], f"{r['compactions_per']:.2f}",
                             f"{r['summarizer_per']:,.0f}", _pct(r["prefix"]), f"{r['raw_tail']:,}",
                             _calls(r["payback"]), f"{r['final_tokens']:,}", _pct(r["facts"]),
                             _pct(r.get("answers"))])
    equal = same_size(joined, record, EQUAL_AT)
    metrics["same_size"] = equal
    return {
        "title": "One budget: mfs_nb against compact-at-90 % on the long sessions",
        "tables": [
            {"caption": "Runs, per 100k tokens of new content (the transcript's tokens)",
             "columns": ["session", "window", "strategy", "calls", "compactions", "summarizer tokens (in + out)",
                         "prefix ratio, all calls", "final raw tail", "payback, worst (calls)", "final payload", "facts in context, older two "
                         "thirds", "LoCoMo answers in the final payload"],
             "rows": rows},
            {"caption": f"At {EQUAL_AT // 1024}k, the final payload against truncation to the same size: LoCoMo "
                        "questions whose answer it holds",
             "columns": ["session", "payload tokens", "mfs_nb", "truncate (same size)", "questions", "mfs_nb raw tail"],
             "rows": [[plan[0][0], f"{equal['size']:,}", _pct(equal["mfs_nb"]), _pct(equal["truncate"]),
                       equal["questions"], f"{equal['raw_tail']:,}"]]},
        ],
        "notes": [
            "compactions: mfs_nb's compaction events (the ledger's `compaction` rows; consolidations are counted "
            "in the metrics as `merges`), compact-90's summaries; summarizer tokens: every summarizer call's input and "
            "output (mfs_nb: the ledger's `summarizer` rows, consolidations included; compact-90: the payload it "
            "reads and the summary it writes)",
            "prefix ratio, all calls: the leading messages a call shares with the previous one, as a share of the "
            "previous payload's tokens, averaged over every call (compactions included)",
            "payback, worst: over the calls whose payload shrank and no longer starts with the whole previous one "
            f"(compactions, consolidations), the largest tokens after the shared prefix ÷ tokens freed, in calls "
            f"(consolidation's gate is {PAYBACK_GATE:.0f}); freed is the drop in payload size, so the figure errs high",
            "answers: a LoCoMo question (not category 5) counts when its answer stands in the markup-free "
            "payload on word boundaries (`sidebyside.evidence`)",
        ] + (["quick run: the first LoCoMo conversation at 8k and the smallest coding session at 32k"]
             if quick else []),
        "metrics": metrics,
    }
