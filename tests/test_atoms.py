"""The benchmarks' fact metric (`mfs_nb/bench/atoms.py`): independent of the engine, blind to any
strategy's markup, on word boundaries, in context — and not gameable by the adversarial strategies."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mfs_nb.bench import atoms, baselines, sidebyside


def _keys(text: str, **kw) -> set[tuple[str, str]]:
    return {(a.kind, a.key) for a, _, _ in atoms.extract(text, **kw)}


def test_the_metric_imports_nothing_from_the_engine():
    tree = ast.parse(Path(atoms.__file__).read_text(encoding="utf-8"))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "bisect", "json", "re", "collections", "collections.abc", "dataclasses",
                        "typing"}, imported


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
    assert not any(k == "path" for k, _ in _keys("and/or, n/a, km/h"))


def test_commands_from_tool_call_arguments():
    call = {"function": {"name": "Bash", "arguments": json.dumps(
        {"command": "cd /srv && mix test test/pool_test.exs --trace | tail -5", "description": "run tests"})}}
    text, command = atoms.call_text(call)
    assert "\\" not in text and "{" not in text  # JSON keys and escapes gone
    found = {(a.kind, a.key) for a, _, _ in atoms.extract(text, names=False, commands=command)}
    assert ("command", "mix test test/pool_test.exs --trace") in found
    assert ("command", "tail -5") in found
    assert not any(k == "command" and v.startswith("cd ") for k, v in found)


def test_strip_markup_removes_every_strategys_decoration():
    payload = ("[segment #1 · uids 123–234]\nEverything below is compressed; the originals are no longer in context. "
               "For exact numbers, paths or quotes, call recall_history with the uid range in the header.\n"
               "- [#412] we moved to 64 workers\n[tool result cleared: Bash output, 3,428 chars; recall_history(4, 4)]\n"
               "[summary of the earlier conversation]\n{\"cleared\": \"arguments of 9,120 chars; recall_history(7, 7)\"}")
    text = atoms.strip_markup(payload)
    for gone in ("123", "234", "412", "3,428", "9,120", "recall_history", "segment", "compressed"):
        assert gone not in text
    assert "we moved to 64 workers" in text


def _facts(messages):
    fs = atoms.fact_set(messages)
    return fs, list(fs.facts.values())


def test_word_boundaries_and_uid_tags_never_match():
    fs, facts = _facts([{"role": "user", "content": "The pool allows 120 connections on the staging cluster."}])
    assert [f.atom.key for f in facts] == ["120 connections"]
    for payload in ("[segment #1 · uids 120–240] staging cluster allows 1120 connections",
                    "uids 120 connections staging", "[#120] connections on the staging cluster"):
        assert atoms.score(facts, atoms.Payload([{"role": "user", "content": payload}], fs.excluded)).kept == 0
    hit = atoms.Payload([{"role": "user", "content": "- staging allows 120 connections"}], fs.excluded)
    assert atoms.score(facts, hit).kept == 1


def test_a_number_counts_only_beside_a_word_of_its_original_context():
    fs, facts = _facts([{"role": "user", "content": "Set the retry budget to 4500 milliseconds for the billing webhook."}])
    assert [f.atom.key for f in facts] == ["4500"]
    near = atoms.Payload([{"role": "user", "content": "billing: 4500"}], fs.excluded)
    elsewhere = atoms.Payload([{"role": "user", "content": "The weather report said 4500 people attended."}], fs.excluded)
    far = atoms.Payload([{"role": "user", "content": "billing " + "zebra " * 12 + "4500"}], fs.excluded)
    assert atoms.score(facts, near).kept == 1
    assert atoms.score(facts, elsewhere).kept == 0 and atoms.score(facts, elsewhere).present == 1
    assert atoms.score(facts, far).kept == 0


def _conversation(turns: int = 40) -> list[dict]:
    """A synthetic ops chat in which every turn states its own facts: numbers, paths, commands."""
    msgs: list[dict] = []
    for i in range(turns):
        msgs.append({"role": "user", "content": (
            f"Service {i} on host db{i}.internal allows {100 + i} connections and its config lives in "
            f"deploy/svc{i}/pool.yaml. Restart it with `kubectl rollout restart svc{i}` if latency passes "
            f"{300 + 7 * i} ms. " + "We discussed the tradeoffs of pooling at length. " * 6)})
        msgs.append({"role": "assistant", "content": (
            f"Noted for service {i}: the ceiling of {100 + i} connections stays, budget {2000 + i} requests per "
            f"minute, owner team Falcon{chr(65 + i % 26)}. " + "I will keep this in mind while we continue. " * 6)})
    return msgs


def test_adversarial_strategies_score_near_zero_and_a_full_payload_scores_high():
    msgs = _conversation()
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    fs = atoms.fact_set(msgs, last)
    older = fs.older(atoms.older_cut([len(m["content"]) for m in msgs], last))
    assert len(older) > 40
    bag = [f.atom.key for f in sorted(fs.facts.values(), key=lambda f: f.first)]
    for name in baselines.ADVERSARIAL:
        run = baselines.adversarial(name, msgs, 8_000, bag)
        sc = atoms.score(older, atoms.Payload(run.final, fs.excluded))
        assert sc.rate is not None and sc.rate <= 0.05, (name, sc.rate)
    bag_run = baselines.adversarial("bag-of-atoms", msgs, 8_000, bag)
    assert atoms.score(older, atoms.Payload(bag_run.final, fs.excluded)).presence > 0.5  # present, but out of context
    full = atoms.score(older, atoms.Payload(msgs[:last], fs.excluded))
    assert full.rate is not None and full.rate >= 0.95


@pytest.mark.parametrize("window", [8_000])
def test_measure_reports_every_strategy_at_equal_budget(window):
    msgs = _conversation(36)
    result = sidebyside.measure("synthetic", msgs, window, None)
    assert set(result) == {*baselines.STRATEGIES, "mfs_nb", *baselines.ADVERSARIAL}
    for name, row in result.items():
        assert row["over_window"] == 0
        assert row["final_tokens"] <= window
        for src in ("user", "assistant"):
            assert row[f"facts_{src}"] is not None
    for name in baselines.ADVERSARIAL:
        assert result[name]["facts"] <= 0.05
    assert result["last-n"]["facts"] <= 0.05  # two exchanges: nothing of the older two thirds
