"""The CLI: demo end to end, replay of a 500-message transcript, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

from mfs_nb.commands.cli import main


def synthetic_transcript(n: int = 500) -> list[dict]:
    """Users, assistants, tool calls and results, with numbers and paths — made here, not copied."""
    msgs: list[dict] = [{"role": "system", "content": "You are a data assistant."}]
    i = 0
    while len(msgs) < n:
        i += 1
        msgs.append({"role": "user", "content": f"Step {i}: load data/run_{i}.csv and report rows > {i * 10}"})
        if i % 3 == 0:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": "cell_output", "arguments": json.dumps({"n": i})}}]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"rows={i * 137}\n" * 20})
        msgs.append({"role": "assistant", "content": f"Run {i} has {i * 137} rows; threshold {i * 10} exceeded."})
    return msgs[:n]


def test_demo_exits_zero_offline():
    out = subprocess.run([sys.executable, "-m", "mfs_nb", "demo"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "No model is configured" in out.stdout
    assert "resumed: 6 events, last uid 6" in out.stdout
    assert "context compacted:" in out.stdout and "segment    uids 1-8" in out.stdout
    assert "raw        uids 9-10" in out.stdout and "Facts (verbatim):" in out.stdout
    assert "every user message recalled byte-identical: yes" in out.stdout


def test_replay_maps_every_line_and_loses_nothing(tmp_path, capsys):
    msgs = synthetic_transcript(500)
    src = tmp_path / "t.jsonl"
    src.write_text("\n".join(json.dumps(m) for m in msgs) + "\n")
    report_path = tmp_path / "r.json"
    payloads = tmp_path / "payloads"
    assert main(["replay", str(src), "--window", "200000", "--json", str(report_path), "--payloads", str(payloads)]) == 0
    report = json.loads(report_path.read_text())
    assert set(report["uids"]) == {str(i) for i in range(500)}
    assert sorted(report["uids"].values()) == list(range(1, 501))
    assert report["coverage"] == {"uids_total": 500, "raw": 500, "in_segments": 0, "asked_again": 0, "lost": 0}
    n_assistant = sum(m["role"] == "assistant" for m in msgs)
    assert len(report["calls"]) == n_assistant
    calls = report["calls"]
    assert calls[0]["call"] == 1 and calls[0]["shared_prefix_tokens"] == 0
    assert all(c["shared_prefix_tokens"] <= c["payload_tokens"] for c in calls)
    assert all(b["payload_tokens"] > a["payload_tokens"] for a, b in zip(calls, calls[1:]))
    assert all(c["tier"] == "ok" and c["notices"] == [] for c in calls)
    first = json.loads((payloads / "call-00001.json").read_text())
    assert first["messages"][0]["role"] == "system" and first["messages"][2]["content"] == msgs[1]["content"]
    assert len(list(payloads.glob("call-*.json"))) == n_assistant
    last = json.loads((payloads / f"call-{n_assistant:05d}.json").read_text())
    assert [m["content"] for m in last["messages"][1:]] == [m["content"] or "" for m in msgs[:len(last["messages"]) - 1]]
    assert report["final_view"]["layers"][-1] == {"kind": "raw", "uid_from": 1, "uid_to": 500,
                                                  "tokens": report["final_view"]["layers"][-1]["tokens"],
                                                  "level": None, "degraded": False, "messages": 500}


def test_replay_accepts_a_json_list_and_tool_calls_without_ids(tmp_path):
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "lookup", "arguments": {"id": "ABC123"}}]},
            {"role": "tool", "name": "lookup", "content": "found ABC123"},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    src = tmp_path / "t.json"
    src.write_text(json.dumps(msgs))
    out = tmp_path / "r.json"
    assert main(["replay", str(src), "--json", str(out)]) == 0
    view = json.loads(out.read_text())["final_view"]["messages"]
    assert view[2]["tool_calls"][0]["function"]["arguments"] == '{"id": "ABC123"}'
    assert view[3]["role"] == "tool" and view[3]["tool_call_id"] == view[2]["tool_calls"][0]["id"]
    assert view[4]["content"] == "done"


def test_replay_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "ok"}\n{"role": "robot", "content": "?"}\n')
    assert main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "role must be one of" in err and err.count("\n") == 1
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    assert main(["replay", str(tmp_path / "bin.jsonl")]) == 2
    assert "not UTF-8" in capsys.readouterr().err
