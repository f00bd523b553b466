"""`mfs-nb bench qa` end to end, offline: a scripted OpenAI-compatible server on 127.0.0.1 answers
the questions (calling recall_history when it is offered) and judges them."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from fake_provider import FakeProvider

from mfs_nb.bench import qa
from mfs_nb.commands.cli import main

LOADERS = textwrap.dedent('''
    def locomo():
        msgs = []
        for i in range(90):
            if i == 2:
                text = "By the way, my sister Lorna moved to Tromso last spring and loves the northern lights."
            else:
                text = f"Day {i}: we talked about gardening, the weather and the book club meeting. " * 4
            msgs.append({"id": f"D1:{i}", "role": "user" if i % 2 == 0 else "assistant", "content": text})
        questions = [{"question": "Where did Lorna move?", "answer": "Tromso", "category": 4, "evidence": ["D1:2"]},
                     {"question": "Who plays the cello?", "answer": "Ingrid", "category": 1, "evidence": ["D1:4"]},
                     {"question": "Is this adversarial?", "answer": None, "category": 5, "evidence": []}]
        return [{"id": "conv-x", "speakers": ["A", "B"], "messages": msgs, "questions": questions}]
''')


class ScriptedModel(FakeProvider):
    """Answers with the gold answer when the request holds it; with tools offered and no tool result
    yet, first recalls the oldest segment's range; as a judge, says CORRECT when the gold answer is
    in the graded answer."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def handle(self, h, body):  # type: ignore[override]
        self.requests.append(body)
        msgs = body.get("messages") or []
        last = msgs[-1].get("content") or ""
        text = "\n".join(str(m.get("content") or "") for m in msgs)
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if last.startswith("You grade answers"):
            gold = re.search(r"Gold answer: (.*)", last).group(1)
            given = re.search(r"Answer to grade: (.*)", last).group(1)
            message["content"] = "CORRECT" if gold.lower() in given.lower() else "WRONG"
        elif body.get("tools") and not any(m.get("role") == "tool" for m in msgs):
            span = re.search(r"uids (\d+)–(\d+)", text)
            a, b = span.groups() if span else ("1", "5")
            message["tool_calls"] = [{"id": "c1", "type": "function", "function": {
                "name": "recall_history", "arguments": json.dumps({"uid_from": int(a), "uid_to": min(int(b), int(a) + 9)})}}]
        else:
            message["content"] = "Tromso" if "Tromso" in text else "not mentioned"
        usage = {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102}
        self._json(h, 200, {"id": "x", "object": "chat.completion", "created": 1, "model": body.get("model"),
                            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage})


def test_qa_suite_end_to_end_with_a_local_openai_compatible_server(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "loaders.py").write_text(LOADERS)
    out = tmp_path / "qa.json"
    server = ScriptedModel()
    monkeypatch.setenv("MFS_API_KEY", "sk-local-test")
    try:
        rc = main(["bench", "qa", "--data", str(data), "--model", "openai/scripted", "--api-base", server.url,
                   "--window", "8000", "--docs", "", "--json", str(out)])
    finally:
        server.close()
    assert rc == 0
    results = json.loads(out.read_text())["suites"]["qa"]["metrics"]
    assert set(results) == {"last-n", "truncate", "rolling", "user+summary", "mfs_nb"}
    mfs = [x for c in results["mfs_nb"].values() for x in c]
    assert len(mfs) == 2  # categories 1 and 4; the adversarial category 5 is left out
    assert all(x["tool_calls"] >= 1 for x in mfs)  # the tool loop ran against the replayed store
    tool_results = [m["content"] for r in server.requests for m in r["messages"] if m.get("role") == "tool"]
    assert tool_results and all(t.startswith("[#") for t in tool_results)
    lorna = {s: next(x for x in results[s]["4"]) for s in results}
    assert lorna["mfs_nb"]["correct"] is True and lorna["mfs_nb"]["f1"] == 1.0  # recalled from a compacted range
    assert lorna["last-n"]["correct"] is False and lorna["last-n"]["f1"] == 0.0
    assert all(x["correct"] is False for s in results for x in results[s]["1"])  # nobody knows Ingrid
    assert any(r.get("tools") for r in server.requests) and not any(
        r.get("tools") for r in server.requests if "Answer to grade" in r["messages"][-1]["content"])
    assert "judge: correct" in capsys.readouterr().out


def test_qa_needs_a_model_and_is_not_in_the_default_run(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "loaders.py").write_text(LOADERS)
    assert main(["bench", "qa", "--data", str(data), "--docs", ""]) == 2
    assert "needs a model" in capsys.readouterr().err
    from mfs_nb.bench import SUITES
    assert SUITES["qa"].OPT_IN


def test_token_f1_and_verdicts():
    assert qa.token_f1("The Tromso harbour", "tromso") == 2 * (1 / 2) * 1 / (1 / 2 + 1)
    assert qa.token_f1("", "x") == 0.0 and qa.token_f1("7 May 2023", "7 May, 2023") == 1.0
    assert qa.parse_verdict("CORRECT") is True and qa.parse_verdict("wrong.") is False
    assert qa.parse_verdict("correct or wrong?") is None and qa.parse_verdict("maybe") is None
