"""Suite `frontier` (issue 67): dollars against answers, per window, for mfs_nb at several planned
fills and for the ways a person could do without it.

Two sessions of the shared data, each replayed whole at 8k, 32k and 128k:

- **LoCoMo ×6 as one chat**: the answer to a question counts as *within one step* when one of its
  evidence turns stands word for word in the final payload, or among the first `onestep.PAGE` hits of
  one search for the question (the model's tool, one call away). mfs_nb and compact-at-90 % + search
  use the same search: `recall_search` over the same log, full text only (`embedding_model=off`, so
  neither side waits on vectors), leaving out of the page what the payload shows word for word.
  Truncation + BM25 takes the BM25 top `onestep.BM25_K` over the log (`onestep.BM25`, the harness's
  own), beside the newest turns that fit the window.
- **the shared coding sessions** (mean over the three long ones): working-set facts — paths and
  commands that the user, the assistant or a tool call named — stated only in the older two thirds,
  in context in the final payload (`atoms`, which imports nothing from the engine).

Dollars: every call priced under Anthropic's caching rules as in `bench cost` (`cost.price_anthropic`,
the same marks), plus the summarizer's calls at the input and output rates, plus the recorded replies
at the output rate (the same for every strategy). Strategies: mfs_nb at each fill of `budget.FILLS`;
`compact-90` (at 90 % of the usable window everything before the current turn becomes one summary)
alone and with the search; `truncate` with BM25.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..commands.replay import normalise, replay
from ..window import budget
from ..window.tokens import message_tokens
from ..window.usage import ContextProfile
from . import atoms, baselines, onestep
from . import costbench as cost
from .dataset import Data, to_openai
from .sidebyside import Counter, prefix_ratio

NAME = "frontier"
NEEDS = ("locomo", "claude_code_sessions")
OPT_IN = True  # tens of minutes of replays: run by name (`mfs-nb bench frontier`)
WINDOWS = (8_192, 32_768, 131_072)
FILLS = tuple(budget.FILLS)  # lean, balanced, rich
IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
WORKING_KINDS = ("path", "command")


def _mfs(messages: list[dict[str, Any]], window: int, fill: str, questions: Sequence[tuple[str, set[int]]] = (),
         other_shown: set[int] | None = None) -> dict[str, Any]:
    """mfs_nb replayed at `window` under `budget=fill`: payloads and marks for pricing, the summarizer's
    calls, the final payload, the messages it shows word for word and — given `questions` — the search
    page (message indices) for each, less what that payload shows; with `other_shown` (another
    strategy's shown messages) also the page that strategy would get from the same search."""
    payloads: list[list[dict[str, Any]]] = []
    uids: list[list[int | None]] = []
    out: dict[str, Any] = {"summaries": [], "search": {}, "search_other": {}}

    def on_call(session: Any, plan: Any) -> None:
        payloads.append(plan.view.messages)
        uids.append(plan.view.uids)
        out["shown_uids"] = plan.view.shown_uids()

    def page(session: Any, question: str, shown_uids: set[int]) -> list[int]:
        return [h.uid - 1 for h in session.search(question, onestep.PAGE, shown=shown_uids) if h.kind == "event"]

    def keep(session: Any) -> None:
        if questions and [e.content for e in session.events] != [m.get("content") for m in messages]:
            raise AssertionError("the replay's events are not the messages one for one: uids cannot be mapped")
        out["summaries"] = [(int(r.get("prompt_tokens", 0)), int(r.get("completion_tokens", 0)))
                            for r in session.ledger() if r.get("kind") == "summarizer"]
        for q, _ in questions:
            out["search"][q] = page(session, q, out.get("shown_uids", set()))
            if other_shown is not None:
                out["search_other"][q] = page(session, q, {i + 1 for i in other_shown})

    report = replay(normalise(messages), window=window, on_call=on_call, keep=keep, budget=fill, embedding_model="off")
    out["payloads"], out["marks"] = payloads, [cost._marks(p, u) for p, u in zip(payloads, uids)]
    out["ends"], out["tail_share"] = _ends(report, window)
    out["final"] = payloads[-1] if payloads else []
    out["shown"] = {u - 1 for u in out.pop("shown_uids", set())}
    return out


def _ends(report: dict[str, Any], window: int) -> tuple[list[float], float]:
    """Where each compaction of a replay ended (its ledger's `tokens_after`, a share of the usable window)
    and the raw tail's share of the final payload (its layers as the payload sends them)."""
    effective = ContextProfile(window).effective
    ends = [r["tokens_after"] / effective for r in report["ledger"] if r.get("kind") == "compaction"]
    layers = report["final_view"]["layers"]
    total = sum(x["tokens"] for x in layers)
    return ends, sum(x["tokens"] for x in layers if x["kind"] == "raw") / max(total, 1)


def _baseline(name: str, messages: list[dict[str, Any]], window: int) -> dict[str, Any]:
    run = baselines.simulate(name, messages, window)
    shown = {i for i in run.final_raw if i is not None}
    return {"payloads": run.payloads, "marks": [cost._marks(p, None) for p in run.payloads],
            "summaries": run.summaries, "final": run.final, "shown": shown}


def _dollars(run: dict[str, Any], output: int, prices: dict[str, float]) -> float:
    chat = cost.dollars(cost.price_anthropic(run["payloads"], run["marks"]), prices, output)
    return chat + sum(i * prices["input"] + o * prices["output"] for i, o in run["summaries"])


def _answers(run: dict[str, Any], qs: Sequence[tuple[str, set[int]]], turns: Sequence[str],
             page: dict[str, list[int]] | None) -> float:
    """The share of questions whose evidence stands word for word in the final payload or, with `page`
    (question → message indices, the search's order), in the first hits not shown in that payload."""
    text = onestep.flat_text(run["final"])
    hits = 0
    for question, evidence in qs:
        found = onestep.held(text, turns, evidence)
        if not found and page is not None:
            found = bool(evidence & set([i for i in page[question] if i not in run["shown"]][:onestep.PAGE]))
        hits += found
    return hits / max(len(qs), 1)


def _working(run: dict[str, Any], messages: list[dict[str, Any]]) -> float:
    """Working-set paths and commands of the older two thirds, in context in the final payload."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    facts = atoms.fact_set(messages, last)
    older = [f for f in facts.older(atoms.older_cut([message_tokens(m) for m in messages], last))
             if f.source in atoms.WORKING and f.atom.kind in WORKING_KINDS]
    return atoms.score(older, atoms.Payload(run["final"], facts)).rate or 0.0


def _locomo(data: Data, quick: bool) -> tuple[list[dict[str, Any]], list[tuple[str, set[int]]], list[str]]:
    convs = data.get("locomo")[:1 if quick else None]
    messages: list[dict[str, Any]] = []
    qs: list[tuple[str, set[int]]] = []
    for conv in convs:
        offset = len(messages)
        messages += to_openai(conv["messages"])
        qs += [(q, {offset + i for i in ev}) for q, _, ev, _ in onestep.questions(conv)]
    return messages, qs, [" ".join((m.get("content") or "").split()) for m in messages]


def run(data: Data, quick: bool, **_: Any) -> dict[str, Any]:
    prices = cost._prices(cost.MODELS["Anthropic"])
    windows = WINDOWS[1:2] if quick else WINDOWS
    chat, qs, turns = _locomo(data, quick)
    bm25 = onestep.BM25([f"{m.get('role')}: {m.get('content')}" for m in chat])
    bm25_page = {q: bm25.top(q, onestep.BM25_K) for q, _ in qs}
    coding = [to_openai(c["messages"]) for c in data.get("claude_code_sessions") if len(c["messages"]) > 100]
    coding = coding[:1] if quick else coding
    out_chat = sum(message_tokens(m) for m in chat if m["role"] == "assistant")
    rows: list[list[Any]] = []
    end_rows: list[list[Any]] = []
    points: dict[int, dict[str, tuple[float, float, float, float]]] = {}
    metrics: dict[str, Any] = {}
    for window in windows:
        points[window] = {}
        c90 = _baseline("compact-90", chat, window)
        done: dict[str, tuple[dict[str, Any], float, list[dict[str, Any]]]] = {}
        for fill in FILLS:
            r = _mfs(chat, window, fill, qs, other_shown=c90["shown"] if fill == "balanced" else None)
            done[f"mfs_nb {fill}"] = (r, _answers(r, qs, turns, r["search"]), [_mfs(m, window, fill) for m in coding])
            if fill == "balanced":
                c90_search = r["search_other"]
        c90_coding = [_baseline("compact-90", m, window) for m in coding]
        done["compact-90"] = (c90, _answers(c90, qs, turns, None), c90_coding)
        done["compact-90 + search"] = (c90, _answers(c90, qs, turns, c90_search), c90_coding)
        tr = _baseline("truncate", chat, window)
        done["truncate + BM25"] = (tr, _answers(tr, qs, turns, bm25_page), [_baseline("truncate", m, window) for m in coding])
        for strategy, (r, answers, runs) in done.items():
            chat_dollars = _dollars(r, out_chat, prices)
            code_dollars = statistics.fmean(
                _dollars(x, sum(message_tokens(m) for m in msgs if m["role"] == "assistant"), prices)
                for x, msgs in zip(runs, coding))
            each = [_working(x, msgs) for x, msgs in zip(runs, coding)]
            working = statistics.fmean(each)
            points[window][strategy] = (chat_dollars, answers, code_dollars, working)
            metrics[f"{window}/{strategy}"] = {"chat_dollars": round(chat_dollars, 4), "answers": round(answers, 4),
                                               "coding_dollars": round(code_dollars, 4), "working": round(working, 4),
                                               "working_min": round(min(each), 4)}
            rows.append([f"{window // 1024}k", strategy, f"${chat_dollars:.2f}", f"{answers:.1%}",
                         f"${code_dollars:.2f}", f"{working:.1%}", f"{min(each):.1%}"])
            if strategy.startswith("mfs_nb"):
                ends = [e for x in runs for e in x["ends"]]
                tail = min(x["tail_share"] for x in runs)
                count = Counter()
                prefix = [prefix_ratio(x["payloads"], [False] * len(x["payloads"]), count) or 0.0 for x in (r, *runs)]
                metrics[f"{window}/{strategy}"].update(
                    {"coding_end_min": round(min(ends), 4) if ends else None, "coding_tail_min": round(tail, 4),
                     "prefix_chat": round(prefix[0], 5), "prefix_coding_min": round(min(prefix[1:]), 5)})
                end_rows.append([f"{window // 1024}k", strategy, len(ends),
                                 f"{min(ends):.0%}" if ends else "—",
                                 f"{statistics.median(ends):.0%}" if ends else "—", f"{tail:.0%}",
                                 f"{prefix[0]:.2%}", f"{min(prefix[1:]):.2%}"])
    plots = [_plot(window, pts) for window, pts in points.items()] if not quick else []
    if not quick and coding:
        plots.append(_payload_figure(coding[0]))
    return {
        "title": "The frontier: dollars against answers, mfs_nb's fills against compact-at-90 % and truncation",
        "tables": [{"caption": "Per window and strategy: dollars for LoCoMo ×6 as one chat and the share of its "
                               "questions answered within one step; mean dollars per shared coding session and the "
                               "working-set paths and commands of its older two thirds in the final payload",
                    "columns": ["window", "strategy", "LoCoMo ×6 $", "answers within one step", "coding $ (mean)",
                                "working set, older two thirds (mean)", "working set (lowest session)"],
                    "rows": rows},
                   {"caption": "Where mfs_nb's compactions end on the shared coding sessions (each compaction's "
                               "ledger row, a share of the usable window) and the raw tail's share of the final "
                               "payload (lowest of the sessions); the prefix ratio over all calls "
                               "(`sidebyside.prefix_ratio`, the harness's reading of the payloads)",
                    "columns": ["window", "strategy", "compactions", "lowest end", "median end",
                                "raw tail of the final payload (lowest)", "prefix ratio, all calls, LoCoMo ×6",
                                "prefix ratio, all calls, coding (lowest)"],
                    "rows": end_rows}],
        "notes": [f"fills: {', '.join(f'{k} {v:.0%}' for k, v in budget.FILLS.items())} of the usable window (the "
                  "`budget` setting); dollars under Anthropic's caching rules at "
                  f"{cost.MODELS['Anthropic']}'s prices (`bench cost`), summarizer and replies included",
                  "search for mfs_nb and for compact-90 + search: recall_search over the same log, full text only "
                  "(embedding_model=off), its first page less what the payload shows word for word; truncate + "
                  f"BM25: the harness's BM25 top {onestep.BM25_K}",
                  "answers: an evidence turn's whole text in the markup-free final payload or in the page "
                  "(`bench/onestep.py`); working set: `bench/atoms.py`, paths and commands named by the user, the "
                  "assistant or a tool call"]
                 + [f"plot: ![{Path(p).stem}](../img/{Path(p).name})" for p in plots if p]
                 + (["quick run: the first LoCoMo conversation and the smallest coding session at 32k"] if quick else []),
        "metrics": metrics,
    }


def _plot(window: int, pts: dict[str, tuple[float, float, float, float]]) -> str | None:
    """docs/img/frontier-<window>k.png: dollars (x) against answers (y) for LoCoMo ×6; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    mine = [(pts[f"mfs_nb {f}"][0], pts[f"mfs_nb {f}"][1], f) for f in FILLS]
    ax.plot([x for x, _, _ in mine], [y for _, y, _ in mine], "o-", label="mfs_nb (lean, balanced, rich)")
    for x, y, f in mine:
        ax.annotate(f, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for name, marker in (("compact-90", "s"), ("compact-90 + search", "D"), ("truncate + BM25", "^")):
        ax.plot([pts[name][0]], [pts[name][1]], marker, label=name)
    ax.set_xlabel("dollars, LoCoMo ×6 as one chat (Anthropic rules, summarizer included)")
    ax.set_ylabel("answers within one step")
    ax.set_title(f"{window // 1024}k window")
    ax.legend(fontsize=8)
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / f"frontier-{window // 1024}k.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _payload_figure(messages: list[dict[str, Any]]) -> str | None:
    """docs/img/fill-over-calls.png: the payload of every call of one coding session replayed at 8k, 32k
    and 128k (balanced fill), as a share of the usable window, with the fill, the clearing's target and
    the warn line drawn; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from ..layers.clearing import HEADROOM
    from ..settings import Settings

    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for ax, window in zip(axes, WINDOWS):
        shares: list[float] = []
        effective = ContextProfile(window).effective
        replay(normalise(messages), window=window,
               on_call=lambda session, plan, shares=shares: shares.append(plan.usage.tokens / plan.usage.effective))
        ax.plot(range(1, len(shares) + 1), shares, lw=1, label="payload")
        warn = Settings().warn_at
        fill = budget.fill_share(Settings(), effective)
        lines = [(fill, "--", "planned fill (balanced)"), (warn - HEADROOM, ":", "a clearing's target"),
                 (warn, "-.", "warn line")]
        if abs(fill - (warn - HEADROOM)) < 0.01:  # one line, one label
            lines = [(fill, "--", "planned fill (balanced) = a clearing's target"), lines[2]]
        for y, style, label in lines:
            ax.axhline(y, ls=style, lw=0.8, color="grey")
            ax.annotate(label, (1, y), textcoords="offset points", xytext=(2, 2), fontsize=7, color="grey")
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"{window // 1024}k ({effective:,} usable)")
    axes[-1].set_xlabel("call")
    axes[0].set_title("payload as a share of the usable window, every call of one coding session")
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / "fill-over-calls.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
