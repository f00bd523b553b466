"""Each suite's headline: the figure a person reads first, in plain words, beside the bar it is held to.

A headline is read from the suite's own tables (by caption, row and column), never from its
metrics, so the same reading serves a fresh result and a section already on the page
(`parse_section`): the summary at the top of `docs/benchmarks.md` is rebuilt from whatever the page
holds, each row with the run it came from. Bars are the reference figures the design was drawn from
("seed" in the bar) and the issues' own bars; "—" where a suite has none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Tables = list[dict[str, Any]]


@dataclass(frozen=True)
class Headline:
    words: str  # what is measured, in plain words
    bar: str  # the bar it is held to
    read: Callable[[Tables], str]  # the figure, from the suite's tables ('—' where absent)


def _table(tables: Tables, caption: str) -> dict[str, Any] | None:
    return next((t for t in tables if str(t.get("caption", "")).startswith(caption)), None)


def _rows(tables: Tables, caption: str, **where: str) -> tuple[list[str], list[list[str]]]:
    """The columns of the table whose caption starts with `caption`, and its rows whose named
    columns (underscores for spaces) hold exactly the given values."""
    table = _table(tables, caption)
    if table is None:
        return [], []
    cols = [str(c) for c in table["columns"]]
    want = {k.replace("_", " "): v for k, v in where.items()}
    if any(k not in cols for k in want):
        return cols, []
    rows = [[str(c) for c in r] for r in table["rows"]]
    return cols, [r for r in rows if all(r[cols.index(k)] == v for k, v in want.items())]


def cell(caption: str, column: str, first: bool = False, **where: str) -> Callable[[Tables], str]:
    """The value in `column` of the last row that matches (`first`: the first; `where` empty: any row)."""
    def read(tables: Tables) -> str:
        cols, rows = _rows(tables, caption, **where)
        return rows[0 if first else -1][cols.index(column)] if rows and column in cols else "—"
    return read


def _turn_ratio(tables: Tables) -> str:
    cols, rows = _rows(tables, "Chat-turn time")
    if len(rows) < 2 or "p95 ms" not in cols:
        return "—"
    off, on = (float(r[cols.index("p95 ms")]) for r in rows[:2])
    return f"{on:.1f} ÷ {off:.1f} = {on / off:.2f} ×" if off else "—"  # the table's figures, not rounder ones


def _bulk_turn_ratio(tables: Tables) -> str:
    cols, rows = _rows(tables, "Chat-turn time")
    if len(rows) < 3 or "p95 ms" not in cols:
        return "—"
    off, bulk = (float(rows[i][cols.index("p95 ms")]) for i in (0, 2))
    return f"{bulk:.1f} ÷ {off:.1f} = {bulk / off:.2f} ×" if off else "—"


def _bulk_rate(backlog: str, column: str = "events a second") -> Callable[[Tables], str]:
    def read(tables: Tables) -> str:
        cols, rows = _rows(tables, "`mfs-nb index` on a backlog")
        row = next((r for r in rows if r[0].startswith(backlog)), None)
        if row is None or column not in cols:
            return "—"
        limit = row[cols.index("limit: events a second")]
        if column == "seconds":  # the limit in seconds: the same events at the limit's rate
            limit = f"{float(row[cols.index('events')].replace(',', '')) / float(limit):,.0f}"
        return f"{row[cols.index(column)]} (the machine's limit {limit})"
    return read


def _percent(value: str) -> float | None:
    m = re.match(r"\s*(-?[\d.]+)%", value)
    return float(m.group(1)) if m else None


def _at_least_best(tables: Tables) -> str:
    cols, rows = _rows(tables, "mfs_nb against the best baseline")
    if not rows or "ratio" not in cols:
        return "—"
    ratios = [r[cols.index("ratio")] for r in rows]
    won = sum(1 for x in ratios if x == "∞" or (x.endswith("×") and float(x[:-1]) >= 1.0))
    return f"{won} of {len(rows)} runs"


def _adversary(tables: Tables) -> str:
    cols, rows = _rows(tables, "mfs_nb against the best baseline")
    col = "adversarial (max)"
    read = [_percent(r[cols.index(col)]) for r in rows] if col in cols else []
    values = [v for v in read if v is not None]
    return f"{max(values):.1f}%" if values else "—"


def _production(tables: Tables) -> str:
    cols, rows = _rows(tables, "The production comparison against")
    col = "≥ 3 × (and ≥ 60 %)"
    if not rows or col not in cols:
        return "—"
    return f"{sum(r[cols.index(col)] == 'yes' for r in rows)} of {len(rows)} kinds"


def _cost_read(tables: Tables) -> str:
    """The lowest cache-read share of mfs_nb over the coding sessions at 128k, Anthropic's rules."""
    cols, rows = _rows(tables, "Dollars per session", window="128k", strategy="mfs_nb", rules="Anthropic")
    col = "input read from the cache"
    shares = [(_percent(r[cols.index(col)]), r[0]) for r in rows if r[0].startswith("coding")] if col in cols else []
    shares = [(v, name) for v, name in shares if v is not None]
    if not shares:
        return "—"
    low = min(shares)
    return f"{low[0]:.1f}% (lowest of {len(shares)} sessions)"


def _cost_against(tables: Tables) -> str:
    """mfs_nb's total dollars against compact-90's, the longest session at 32k, Anthropic's rules."""
    out = []
    for strategy in ("mfs_nb", "compact-90"):
        cols, rows = _rows(tables, "Dollars per session", window="32k", strategy=strategy, rules="Anthropic")
        rows = [r for r in rows if r[0].startswith("LoCoMo")]
        if not rows or "total $" not in cols:
            return "—"
        out.append(rows[-1][cols.index("total $")])
    return " vs ".join(out)


def _against(column: str, window: str) -> Callable[[Tables], str]:
    """mfs_nb's figure in `column` against compact-90's, the LoCoMo session at `window` (the budget suite)."""
    def read(tables: Tables) -> str:
        out = []
        for strategy in ("mfs_nb", "compact-90"):
            cols, rows = _rows(tables, "Runs, per 100k", window=window, strategy=strategy)
            rows = [r for r in rows if r[0].startswith("LoCoMo")]
            if not rows or column not in cols:
                return "—"
            out.append(rows[-1][cols.index(column)])
        return " vs ".join(out)
    return read


def _frontier(tables: Tables, window: str, strategy: str, column: str, caption: str = "Per window") -> str | None:
    """One cell of the frontier suite's tables: `column` of `strategy`'s row at `window`."""
    cols, rows = _rows(tables, caption, window=window, strategy=strategy)
    return rows[-1][cols.index(column)] if rows and column in cols else None


def _money(text: str | None) -> float | None:
    try:
        return float(str(text).lstrip("$").replace(",", ""))
    except ValueError:
        return None


def _matched_answers(tables: Tables) -> str:
    """At 32k, mfs_nb's answers within one step at the fill whose LoCoMo dollars are nearest compact-90's
    (within 5 % or not, said), against compact-90 + search's."""
    theirs = _money(_frontier(tables, "32k", "compact-90", "LoCoMo ×6 $"))
    searched = _frontier(tables, "32k", "compact-90 + search", "answers within one step")
    fills = [(name, _money(_frontier(tables, "32k", name, "LoCoMo ×6 $")),
              _frontier(tables, "32k", name, "answers within one step"))
             for name in ("mfs_nb lean", "mfs_nb balanced", "mfs_nb rich")]
    fills = [(n, d, a) for n, d, a in fills if d is not None and a is not None]
    if not theirs or not fills or searched is None:
        return "—"
    name, dollars, answers = min(fills, key=lambda f: abs(f[1] - theirs))
    within = "within 5 %" if abs(dollars - theirs) <= 0.05 * theirs else f"{dollars / theirs - 1:+.0%} of its dollars"
    return f"{answers} ({name.split()[-1]}, {within}) vs {searched}"


def _frontier_pair(window: str, column: str, caption: str = "Per window",
                   strategies: tuple[str, str] = ("mfs_nb balanced", "compact-90")) -> Callable[[Tables], str]:
    def read(tables: Tables) -> str:
        out = [_frontier(tables, window, x, column, caption) for x in strategies]
        return " vs ".join(x for x in out if x) if all(out) else "—"
    return read


def _frontier_cells(column: str, windows: tuple[str, ...], caption: str) -> Callable[[Tables], str]:
    def read(tables: Tables) -> str:
        out = [_frontier(tables, w, "mfs_nb balanced", column, caption) for w in windows]
        return " / ".join(f"{x} ({w})" for x, w in zip(out, windows) if x) or "—"
    return read


HEADLINES: dict[str, list[Headline]] = {
    "frontier": [
        Headline("answers within one step, LoCoMo ×6 as one chat at 32k: mfs_nb at the fill nearest compact-at-90 %'s "
                 "dollars vs compact-at-90 % + the same search", "≥ compact-90 + search + 5 points, within 5 % of its "
                 "dollars (issue 67)", _matched_answers),
        Headline("dollars per shared coding session at 32k (mean), mfs_nb balanced vs compact-at-90 %",
                 "≤ compact-90 (issue 67)", _frontier_pair("32k", "coding $ (mean)")),
        Headline("working-set paths and commands of the older two thirds in the payload at 32k, lowest coding "
                 "session, mfs_nb balanced vs compact-at-90 %", "≥ 80 % (issue 67)",
                 _frontier_pair("32k", "working set (lowest session)")),
        Headline("where compactions end on the coding sessions, lowest (mfs_nb balanced)", "≥ 40 % at 32k and 128k "
                 "(issue 67)", _frontier_cells("lowest end", ("32k", "128k"), "Where mfs_nb")),
        Headline("prefix-cache ratio over all calls, lowest coding session (mfs_nb balanced)",
                 "≥ 96 % at 8k, ≥ 99 % at 32k and 128k (issue 67)",
                 _frontier_cells("prefix ratio, all calls, coding (lowest)", ("8k", "32k", "128k"), "Where mfs_nb")),
    ],
    "budget": [
        Headline("prefix-cache ratio over all calls, LoCoMo ×6 as one session at 32k, mfs_nb vs compact-at-90 %",
                 "≥ 99 % (issue 67 withdrew ≥ compact-90)", _against("prefix ratio, all calls", "32k")),
        Headline("summarizer tokens per 100k tokens of new content, same run, mfs_nb vs compact-at-90 %",
                 "— (issue 67 withdrew ≤ compact-90)", _against("summarizer tokens (in + out)", "32k")),
        Headline("LoCoMo answers in the final payload at 16k, mfs_nb vs truncation to the same size",
                 "≥ truncation (issue 43)",
                 lambda t: " vs ".join(cell("At 16k", c)(t) for c in ("mfs_nb", "truncate (same size)"))),
    ],
    "mcp": [
        Headline("importing the three shared coding sessions (`mfs-nb import`, seconds)", "< 60 s (issue 45)",
                 cell("import of the shared coding sessions", "import s")),
        Headline("recall_search through MCP over stdio, p95 ms (right after the import)", "≤ 200 ms (issue 45)",
                 cell("recall_search through", "p95", when="after import")),
    ],
    "tokens": [
        Headline("token estimate vs the provider's count, held-out English chat (mean error per message)",
                 "MAE 8.3 % (the seed's, on fixtures)",
                 cell("Message-level", "MAE vs o200k_base", set="held out",
                      text_class="English chat (tau-bench airline)")),
        Headline("the meter vs the provider's count before each call at 8k (mean error)", "—",
                 cell("Pressure shown", "mean |error|", window="8k")),
    ],
    "clearing": [
        Headline("tokens sent that clearing old tool results saves, first coding session", "—",
                 cell("Each session replayed", "tokens sent saved", session="258c7280")),
        Headline("calls over the window without → with clearing, same session", "0 with clearing",
                 cell("Each session replayed", "calls over window", session="258c7280")),
    ],
    "compaction": [
        Headline("prefix-cache ratio of ordinary calls, LoCoMo conv-26 compacted at 8k", "≥ 99 % (seed 99.3 %)",
                 cell("Replays", "prefix-cache ratio, ordinary calls", conversation="LoCoMo conv-26", window="8k")),
        Headline("coverage check of 3,000 segments", "3.6 ms (seed)",
                 cell("Checks", "result", check="coverage check, 3,000 segments")),
    ],
    "consolidation": [
        Headline("compacted messages a summary in the payload still covers, longest conversation at 32k", "—",
                 cell("Runs.", "compacted uids mapped", first=True, window="32k", mode="consolidation")),
        Headline("prefix-cache ratio over all calls, same run", "≥ 97 % (issue 43)",
                 cell("Runs.", "prefix ratio, all calls", first=True, window="32k", mode="consolidation")),
    ],
    "verbatim": [
        Headline("your own words kept word for word after compaction (mean over runs)", "~90 % (seed; < 30 % before)",
                 cell("Own-words survival", "mfs: compacted own words kept")),
        Headline("own words taken for a quote, English probe set", "≤ 5 % (else quote detection turns off)",
                 cell("Probe set", "own words mislabelled", language="EN")),
    ],
    "baselines": [
        Headline("runs where mfs_nb keeps at least as many stated facts in context as the best baseline, "
                 "at equal budget", "every run", _at_least_best),
        Headline("the best adversarial strategy (a bag of facts, a bare uid map) on the same measure",
                 "≤ 5 %", _adversary),
        Headline("working-set kinds where mfs_nb's payload keeps ≥ 3 × what Claude Code's own summary keeps",
                 "every kind (issue 14)", _production),
    ],
    "ux": [
        Headline("`%load_ext mfs_nb`", "≤ 0.2 s", cell("targets", "median", step="`%load_ext mfs_nb`")),
        Headline("the first offline `%%chat` the instant `%load_ext` returns", "≤ 2 s",
                 cell("targets", "median", step="first offline `%%chat` sent the instant `%load_ext` returns "
                                                 "(waits for the warm-up's import of the store libraries)")),
    ],
    "recall": [
        Headline("LoCoMo questions with an evidence turn in search's top 10", "85 % (issue 44)",
                 cell("LoCoMo evidence", "hit@10", category="all", method="hybrid")),
        Headline("share of evidence turns in the top 10 (r@10)", "≈ 0.48 for plain embeddings (published)",
                 cell("LoCoMo evidence", "r@10", category="all", method="hybrid")),
        Headline("multi-hop questions with an evidence turn in the top 10", "≥ 0.60 (issue 44)",
                 cell("LoCoMo evidence", "hit@10", category="multi-hop", method="hybrid")),
        Headline("open-domain questions with an evidence turn in the top 10", "≥ 0.55 (issue 44)",
                 cell("LoCoMo evidence", "hit@10", category="open-domain", method="hybrid")),
        Headline("LoCoMo questions within one step (an evidence turn in the 16k payload or in one search's first page)",
                 "≥ 85 % and ≥ truncate + BM25 + 10 points (issue 44)",
                 lambda t: f"{cell('Answers within one step', 'mfs_nb', category='all')(t)} vs "
                           f"{cell('Answers within one step', 'truncate + BM25 top 10', category='all')(t)} "
                           f"({cell('Answers within one step', 'truncate + BM25 top 10 of what it does not show', category='all')(t)}"
                           " with its top 10 of what truncation does not show)"),
    ],
    "recall_speed": [
        Headline("search p95 at the largest size measured (ms)", "≤ 100 (issue 44)", cell("Search latency", "search p95 ms")),
        Headline("chat turn p95 with the background indexer on ÷ off (ms)", "≤ 1.1 × (issue 44)", _turn_ratio),
        Headline("index throughput against the recipe before 2026-12-05 (same run)", "≥ 3 × (issue 44)",
                 cell("Index throughput", "events a second", recipe="gain")),
        Headline("`mfs-nb index`, short chat turns (events a second)", "≥ 50 (issue 70)", _bulk_rate("short")),
        Headline("`mfs-nb index`, the three coding sessions (seconds)", "≤ 300 (issue 70)",
                 _bulk_rate("long", "seconds")),
        Headline("chat turn p95 while `mfs-nb index` runs ÷ indexing off (ms)", "≤ 1.2 × (issue 70)", _bulk_turn_ratio),
    ],
    "notebook": [
        Headline("prefix-cache ratio of ordinary calls with the budget note on, 8k", "≥ 99 % (seed 99.3 %)",
                 cell("Prefix-cache ratio", "prefix ratio", window="8k", mode="note on")),
    ],
    "store": [
        Headline("write per turn at the largest local log measured, p95 (ms)", "—",
                 cell("One session", "write/turn p95 ms", store="local")),
        Headline("events lost or duplicated by 4 writers at once on object storage", "0",
                 lambda t: "/".join(cell("Several writers", c, store="S3 (loopback)")(t) for c in ("lost", "duplicated"))),
    ],
    "cost": [
        Headline("input tokens read from the prompt cache, mfs_nb over a coding session at 128k (Anthropic's rules)",
                 "≥ 85 % (issue 42)", _cost_read),
        Headline("dollars for LoCoMo ×6 as one session at 32k, mfs_nb vs compact-at-90 % (Anthropic's rules, "
                 "summarizer included)", "—", _cost_against),
    ],
    "chats": [
        Headline("median chat, last 100 ÷ chats 1,001–1,100 (compaction cycling)", "≤ 1.2 (issue 43)",
                 cell("The bars", "this run", bar="≤ 1.2")),
        Headline("memory growth after the first 100 chats", "≤ 200 MB", cell("The bars", "this run", bar="≤ 200 MB")),
        Headline("slowest chat", "≤ 2,000 ms", cell("The bars", "this run", bar="≤ 2,000 ms")),
    ],
}


def headline_rows(name: str, tables: Tables) -> list[list[str]]:
    """[measure, this run, bar] for each of the suite's headlines."""
    return [[h.words, h.read(tables), h.bar] for h in HEADLINES.get(name, [])]


def _unescape(cell_text: str) -> str:
    return cell_text.replace("\\|", "|").strip()


def parse_section(markdown: str) -> dict[str, Any]:
    """The title, run line and tables of a section `render_markdown` wrote (the inverse of it, for
    the tables: caption, columns, rows)."""
    title = re.search(r"^## (.+)$", markdown, re.M)
    run = re.search(r"^_`mfs-nb bench .+_$", markdown, re.M)
    tables: Tables = []
    caption = ""
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("**") and line.endswith("**"):
            caption = line[2:-2]
        elif line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            split = re.compile(r"(?<!\\)\|")
            cols = [_unescape(c) for c in split.split(line)[1:-1]]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([_unescape(c) for c in split.split(lines[i])[1:-1]])
                i += 1
            tables.append({"caption": caption, "columns": cols, "rows": rows})
            caption = ""
            continue
        i += 1
    return {"title": title.group(1) if title else "", "run": run.group(0) if run else "", "tables": tables}
