"""Plain words in every user-facing string (issue 39 item 8): no `L1 segment … depth 3`, no negative
`provider count` row, no `tier warn`, no `embedder not loaded yet`, no JSON in the ledger view, no
backwards `#7–#6` range, no `[segment #71–85 segment …]` hit, no `1.6k → 1.6k`, and `%recall ""`
suggests the magic, not the model's tool."""

from __future__ import annotations

import re

from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.models.llm import Completion
from mfs_nb.recall.ranking import Hit
from mfs_nb.ui.context import ContextView
from mfs_nb.ui.data import context_data, ledger_data
from mfs_nb.ui.html import ledger_html
from mfs_nb.ui.ledger import LedgerView
from mfs_nb.window.tokens import message_tokens
from mfs_nb.window.usage import Usage

INTERNAL_TIER = re.compile(r"\btier\b|\b(warn|compress|hard)\b")


def test_layers_are_summaries_merged_n_times_not_levels_and_depths():
    layers = [{"kind": "segment", "label": "merged summary", "span": "uids 1–40", "tokens": 900, "level": 3,
               "degraded": False},
              {"kind": "segment", "label": "summary", "span": "uids 41–60", "tokens": 400, "level": 0,
               "degraded": False}]
    text = ContextView(data={"usage": {"line": "ctx 40%"}, "layers": layers, "gaps": [], "tools": []}).text()
    assert "merged 3×" in text and "depth" not in text and not re.search(r"\bL\d\b", text)


def test_the_provider_count_row_says_in_words_which_way_it_differs(store_dir):
    fake = FakeLLM()

    def answer(messages):  # a provider that counts a fifth fewer tokens than the estimate
        prompt = int(0.8 * sum(message_tokens(m) for m in messages))
        return Completion("noted", [], {"prompt_tokens": prompt, "completion_tokens": 3}, "primary", "fake")

    fake.script = [answer] * 4
    s = Session("words", store=store_dir, llm=fake)
    for i in range(3):
        s.chat(f"message {i}: the pool has 120 connections " * 5)
    data = context_data(s)
    (row,) = [x for x in data["layers"] if x["kind"] == "measured"]
    assert row["tokens"] < 0 and row["label"] == "provider's count" and row["span"] == "fewer than estimated" and row["span"] != "static"
    assert f"{-row['tokens']:,} tokens fewer" in row["text"] and "-" not in row["text"].split("tokens")[0]
    assert sum(x["tokens"] for x in data["layers"]) == data["usage"]["tokens"]  # the rows still add up
    head = re.search(r"<div><b>.*?</div>", ContextView(data=data).html()).group(0)
    assert "count of the last request plus estimates since" in head and "anchor+estimate" not in head


def test_tiers_are_words_in_the_status_line():
    for tier, words in (("warn", "clearing soon"), ("compress", "compacting"), ("hard", "compacting now")):
        line = Usage(900, 1200, 1000, tier, "anchor+estimate", "s").status_line()
        assert line.startswith("ctx 90% · 900 of 1k usable") and f"· {words} ·" in line and not INTERNAL_TIER.search(line)
    over = Usage(1100, 1200, 1000, "hard", "anchor+estimate", "s").status_line()
    assert "· over the window ·" in over  # only where it is true: at or past the usable window itself


def test_ledger_rows_read_as_words_not_json():
    rows = [{"seq": 3, "time": "12:00:01", "kind": "knowledge", "by": "user", "origin": {"own": 10, "upto": 20},
             "set": [{"key": "db", "tokens": 12}], "evicted": [f"key{i}" for i in range(12)], "accepted": True},
            {"seq": 4, "kind": "tier", "tier": "compress", "tokens": 3120, "effective": 3400}]
    data = ledger_data(rows, [], 3400)
    page = ledger_html(data)
    assert "your own words 10, up to 20" in page and "key db, tokens 12" in page and "(+4 more)" in page
    assert "accepted: yes" in page and ">compacting<" in page
    assert "{" not in page.split("<table", 1)[1] and "&quot;" not in page and "…" not in page
    text = LedgerView(data=data).text()
    assert "#4 tier · compacting: tokens: 3120" in text and "origin: your own words 10, up to 20" in text
    assert "{" not in text and '"' not in text
    assert data["cells"][0]["origin"] == "your own words 10, up to 20"


def test_a_search_hit_on_a_summary_names_its_uid_range_once():
    hit = Hit(uid=71, role="segment", turn=12, score=0.5, snippet="pool size 30", kind="segment", uid_to=85)
    assert hit.line().startswith("[summary of uids 71–85 · turn 12 · 0.500] pool size")
    event = Hit(uid=7, role="user", turn=2, score=0.25, snippet="keep it under 30")
    assert event.line().startswith("[#7 user · turn 2 · 0.250] keep")


def test_a_before_and_after_that_would_read_alike_shows_exact_numbers():
    from mfs_nb.window.usage import human_pair

    assert human_pair(1612, 1598) == ("1,612", "1,598")
    assert human_pair(12_400, 3_100) == ("12.4k", "3.1k")
    assert human_pair(1600, 1600) == ("1.6k", "1.6k")


def test_status_and_an_empty_recall_speak_the_users_language(ip, capsys):
    ip.run_cell("%%chat\nOur DB allows 120 connections; keep the pool under 30.")
    capsys.readouterr()
    ip.run_line_magic("mfs", "status")
    out = capsys.readouterr().out
    assert "embedder" not in out and "pressure from" not in out and "anchor+estimate" not in out
    assert "search index: 2 messages; by words to uid" in out and "by meaning" in out
    ip.run_line_magic("recall", '""')
    err = capsys.readouterr().err
    assert '%recall "pool size"' in err and "recall_search(" not in err


def test_a_newcomer_reads_words_not_internals(ip, capsys, tmp_path):
    """Issue 71, item 5: one note above search results, a source for every setting, %context rows that
    line up, an export and a ledger in words."""
    ip.run_cell("%%chat\nOur DB allows 120 connections; keep the pool under 30.")
    ip.run_cell("%%chat\nAnd the config lives at /etc/app/pool.yaml")
    capsys.readouterr()
    ip.run_line_magic("recall", '"pool"')
    out = capsys.readouterr().out
    assert sum(line.startswith("note:") for line in out.splitlines()) <= 1, out
    assert "vectors cover" not in out and "indexed up to uid" not in out
    ip.run_line_magic("mfs", "config")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 20 and all(re.search(r"  \((the default|saved with this session|this notebook|the environment|"
                                             r"this session's own).*\)$", x) for x in lines), lines
    ip.run_line_magic("context", "")
    rows = [x for x in capsys.readouterr().out.splitlines() if x.endswith(" tokens")]
    assert len(rows) >= 3 and len({len(x) for x in rows}) == 1, rows  # the token column lines up
    assert not any("adjustment" in x for x in rows)
    ip.run_line_magic("mfs", f"export {tmp_path / 'out.md'}")
    head = (tmp_path / "out.md").read_text(encoding="utf-8").split("\n\n")[1]
    assert "declarations" not in head and "no summaries" in head
    ip.run_line_magic("mfs", "status")
    out = capsys.readouterr().out
    assert "endpoint primary" not in out and "answering: mfs-offline/default" in out


def test_the_origin_row_of_the_ledger_says_whose_words():
    rows = [{"seq": 2, "time": "10:00", "kind": "origin", "upto": 7, "own": 2, "quote": 1}]
    text = LedgerView(data=ledger_data(rows, [], 3400)).text()
    assert "your messages up to uid 7 sorted by who wrote them: 2 your own words, 1 pasted AI output" in text
    assert "own: 2" not in text and "up to: 7" not in text
    assert "sorted by who wrote them: 2 your own words" in ledger_html(ledger_data(rows, [], 3400))
