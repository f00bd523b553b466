"""The benchmarks' fact metric (`mfs_nb/bench/atoms.py`): independent of the engine, blind to any
strategy's markup, on word boundaries, in context — and not gameable by the adversarial strategies."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mfs_nb.bench import atom_text, atoms, baselines, extraction, sidebyside


def _keys(text: str, source: str = "user", command: str | None = None) -> set[tuple[str, str]]:
    return {(a.kind, a.key) for a, _, _ in extraction.extract(text, source, command)}


def test_the_metric_imports_nothing_from_the_engine():
    imported = set()
    for name in ("atoms.py", "extraction.py", "atom_text.py"):  # the metric, its extraction, its reading of text
        tree = ast.parse((Path(atoms.__file__).parent / name).read_text(encoding="utf-8"))
        imported |= {("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "bisect", "json", "re", "collections", "collections.abc", "dataclasses",
                        "typing", ".atom_text", ".extraction"}, imported


def test_extractor_kinds():
    found = _keys("Our DB allows 120 connections, keep it under 30. See /home/u/app/lib/spotter/pool.ex:42; "
                  "the run raised ** (CompileError) and a TimeoutError. Cost $40, disk 2.5 GB, "
                  "call `Pool.checkout` or `mix test --trace`. Caroline flew to Sweden in 2023. "
                  "才2900万美元的小成本制作。《恋恋笔记本》")
    assert {("number", "120 connections"), ("path", "spotter/pool.ex"), ("error", "CompileError"),
            ("error", "TimeoutError"), ("number", "$40"), ("number", "2.5 GB"), ("ident", "Pool.checkout"),
            ("command", "mix test --trace"), ("name", "Sweden"), ("number", "2023"), ("number", "2900万美元"),
            ("name", "恋恋笔记本")} <= found
    assert ("number", "30") not in found  # two digits and no unit: too common to be a fact
    assert not any(k == "path" for k, _ in _keys("and/or, n/a, km/h, Grep/Read, .ex/.exs"))
    assert not any(k == "ident" for k, _ in _keys("set it to `true` or `nil` in `source`"))
    assert _keys("line 439 of the log, pid 50199023", source="tool_result") == set()  # bare numbers in tool output
    assert ("number", "439") in _keys("line 439 of the log")
    assert ("number", "2019年04月08日") in _keys("上映日期是2019年04月08日。")


def test_commands_from_tool_call_arguments():
    call = {"function": {"name": "Bash", "arguments": json.dumps(
        {"command": "cd /srv && mix test test/pool_test.exs --trace | tail -5", "description": "run tests"})}}
    text, carried, command = extraction.call_text(call)
    assert "\\" not in text and "{" not in text and not carried  # JSON keys and escapes gone
    found = _keys(text, "tool_call", command)
    assert ("command", "mix test test/pool_test.exs --trace") in found
    assert ("command", "tail -5") in found
    assert not any(k == "command" and v.startswith("cd ") for k, v in found)


def test_a_call_names_its_target_and_carries_its_content():
    call = {"function": {"name": "Write", "arguments": json.dumps(
        {"file_path": "/app/lib/pool.ex", "content": "defmodule Pool do\n  @size 120\n  # see lib/other.ex\nend\n"})}}
    target, carried, command = extraction.call_text(call)
    assert target == "Write /app/lib/pool.ex" and "lib/other.ex" in carried and command is None
    sources = {source: text for source, text, _ in extraction.parts({"role": "assistant", "content": "", "tool_calls": [call]})}
    assert set(sources) == {"tool_call", "tool_content"}
    facts = atoms.fact_set([{"role": "assistant", "content": "", "tool_calls": [call]}])
    by_key = {f.atom.key: f.source for f in (*facts.facts.values(), *facts.no_context.values())}
    assert by_key.get("lib/pool.ex") == "tool_call" and by_key.get("lib/other.ex") == "tool_content"


def test_working_set_markup_is_stripped():
    payload = ("[working set and fact lines of the history up to #412, verbatim (compacted, or cleared from this "
               "payload); recall_history gives their context]\nerrors seen:\n- boom [#17]\ncommands run:\n"
               "- Bash: mix test — run the tests → exit 1 [#120 #131 #140 +2]\nfiles touched:\n"
               "said (user and assistant):\n- user: keep 64 workers [#9]")
    text = atom_text.strip_markup(payload)
    for gone in ("412", "120", "131", "errors seen", "commands run", "files touched", "said (user"):
        assert gone not in text
    assert "keep 64 workers" in text and "mix test" in text


def test_strip_markup_keeps_what_a_person_wrote():
    text = "Fixed in PR #4521 [segment 3 of the Q3 report: revenue 4500 USD]; step #2 of the 2024 rollout"
    assert atom_text.strip_markup(text) == text


def test_cjk_beside_a_number_is_a_boundary():
    fs, facts = _facts([{"role": "user", "content": "他1990年出生于北京，这部电影票房2900万美元，非常成功。"}])
    assert {f.atom.key for f in facts} >= {"1990年", "2900万美元"}
    same = atoms.score(facts, atoms.Payload([{"role": "user", "content": "他1990年出生于北京，这部电影票房2900万美元，非常成功。"}],
                                            fs))
    assert same.kept == same.total


def test_a_number_with_a_unit_matches_without_the_space():
    fs, facts = _facts([{"role": "user", "content": "The request timeout for the billing webhook is 30 s now."}])
    assert [f.atom.key for f in facts] == ["30 s"]
    assert atoms.score(facts, atoms.Payload([{"role": "user", "content": "billing webhook timeout: 30s"}],
                                            fs)).kept == 1


def test_strip_markup_removes_every_strategys_decoration():
    payload = ("[segment #1 · uids 123–234]\nEverything below is compressed; the originals are no longer in context. "
               "For exact numbers, paths or quotes, call recall_history with the uid range in the header.\n"
               "- [#412] we moved to 64 workers\n[tool result cleared: Bash output, 3,428 chars; recall_history(4, 4)]\n"
               "[summary of the earlier conversation]")
    text = atom_text.strip_markup(payload)
    for gone in ("123", "234", "412", "3,428", "recall_history", "segment", "compressed"):
        assert gone not in text
    assert "we moved to 64 workers" in text
    pruned = {"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "Write", "arguments": json.dumps({"cleared": "arguments of 9,120 chars; recall_history(7, 7)"})}}]}
    assert "9,120" not in extraction.payload_text([pruned])  # the stub as a payload holds it: decoded JSON


def _facts(messages):
    fs = atoms.fact_set(messages)
    return fs, list(fs.facts.values())


def test_word_boundaries_and_uid_tags_never_match():
    fs, facts = _facts([{"role": "user", "content": "The pool allows 120 connections on the staging cluster."}])
    assert [f.atom.key for f in facts] == ["120 connections"]
    for payload in ("[segment #1 · uids 120–240]\nstaging cluster allows 1120 connections",
                    "[earlier history, uids 120–131, was compressed and its summaries no longer fit here; "
                    "recall_history returns the originals]\nconnections on the staging cluster",
                    "[#120] connections on the staging cluster"):
        assert atoms.score(facts, atoms.Payload([{"role": "user", "content": payload}], fs)).kept == 0
    hit = atoms.Payload([{"role": "user", "content": "- staging allows 120 connections"}], fs)
    assert atoms.score(facts, hit).kept == 1


def test_a_number_counts_only_beside_a_word_of_its_original_context():
    fs, facts = _facts([{"role": "user", "content": "Set the retry budget to 4500 milliseconds for the billing webhook."}])
    assert [f.atom.key for f in facts] == ["4500"]
    near = atoms.Payload([{"role": "user", "content": "billing: 4500"}], fs)
    elsewhere = atoms.Payload([{"role": "user", "content": "The weather report said 4500 people attended."}], fs)
    far = atoms.Payload([{"role": "user", "content": "billing " + "zebra " * 12 + "4500"}], fs)
    assert atoms.score(facts, near).kept == 1
    assert atoms.score(facts, elsewhere).kept == 0 and atoms.score(facts, elsewhere).present == 1
    assert atoms.score(facts, far).kept == 0


_TOPICS = ("billing ledger", "search indexer", "payments gateway", "image resizer", "email relay", "audit trail",
           "session cache", "report builder", "geo lookup", "feature flags", "pdf renderer", "webhook router",
           "token minter", "invoice archive", "chat presence", "quota keeper", "backup mover", "price oracle",
           "avatar store", "metrics rollup")


def _conversation(turns: int = 40) -> list[dict]:
    """A synthetic ops chat in which every turn states its own facts about its own subject."""
    msgs: list[dict] = []
    for i in range(turns):
        topic = f"{_TOPICS[i % len(_TOPICS)]} {'north' if i < len(_TOPICS) else 'south'}"
        msgs.append({"role": "user", "content": (
            f"The {topic} allows {100 + i} connections and its config lives in deploy/svc{i}/pool.yaml.\n"
            f"Restart the {topic} with `kubectl rollout restart svc{i}` when latency of the {topic} passes "
            f"{300 + 7 * i} ms.\n" + "We discussed the tradeoffs of pooling at length. " * 6)})
        msgs.append({"role": "assistant", "content": (
            f"Noted: the {topic} keeps its ceiling of {100 + i} connections.\nThe {topic} gets {2000 + i} requests "
            f"per minute at most.\n" + "I will keep this in mind while we continue. " * 6)})
    return msgs


def test_adversarial_strategies_score_near_zero_and_a_full_payload_scores_high():
    msgs = _conversation()
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    fs = atoms.fact_set(msgs, last)
    older = fs.older(atoms.older_cut([len(m["content"]) for m in msgs], last))
    assert len(older) > 40
    bag = [f.atom.key for f in sorted(fs.facts.values(), key=lambda f: f.first)]
    filler = [u for u, _ in fs.df.most_common(3)]  # the words most often beside a fact
    assert len(filler) == 3
    for name in baselines.ADVERSARIAL:
        run = baselines.adversarial(name, msgs, 8_000, bag, filler)
        sc = atoms.score(older, atoms.Payload(run.final, fs))
        assert sc.rate is not None and sc.rate <= 0.05, (name, sc.rate)
        assert (sc.stated() or 0.0) <= 0.05, (name, sc.stated())
    bag_run = baselines.adversarial("bag-of-atoms", msgs, 8_000, bag)
    assert atoms.score(older, atoms.Payload(bag_run.final, fs)).presence > 0.5  # present, but out of context
    full = atoms.score(older, atoms.Payload(msgs[:last], fs))
    assert full.rate is not None and full.rate >= 0.95


@pytest.mark.parametrize("window", [8_000])
def test_measure_reports_every_strategy_at_equal_budget(window):
    msgs = _conversation(36)
    result = sidebyside.measure("synthetic", msgs, window, None)
    assert set(result) == {*baselines.STRATEGIES, "mfs_nb", *baselines.ADVERSARIAL}
    for row in result.values():
        assert row["over_window"] == 0
        assert row["final_tokens"] <= window
        for src in ("user", "assistant"):
            assert row[f"facts_{src}"] is not None
    for name in baselines.ADVERSARIAL:
        assert result[name]["facts"] <= 0.05 and result[name]["facts_stated"] <= 0.05
    assert result["last-n"]["facts"] <= 0.05  # two exchanges: nothing of the older two thirds
