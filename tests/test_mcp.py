"""`mfs-nb import` and `mfs-nb mcp`: other assistants' transcripts brought in word for word, and the store
served to agents through the MCP SDK's own client, over stdio, streamable HTTP and in process."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mfs_nb import Session
from mfs_nb.commands import transcripts
from mfs_nb.commands.cli import main
from mfs_nb.commands.mcp_server import Memory, build
from mfs_nb.store import Store

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra (it is in the test extra)")
from mcp import Client, StdioServerParameters  # noqa: E402

KEY = "sk-live1234567890abcdefXYZ"
CC = "11112222-3333-4444-5555-666677778888"


def _lines(rows: list[object]) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"


def claude_code(path: Path, extra: list[object] = ()) -> Path:
    def row(kind: str, n: int, message: dict, **more: object) -> dict:
        return {"type": kind, "sessionId": CC, "uuid": f"u{n}", "parentUuid": f"u{n - 1}",
                "timestamp": f"2026-03-01T10:0{n}:00.000Z", "message": message, **more}

    rows: list[object] = [
        {"type": "file-history-snapshot", "messageId": "x", "snapshot": {}},
        row("user", 1, {"role": "user", "content": f"The deploy fails on host build-07 with exit code 137; key {KEY}"}),
        row("assistant", 2, {"id": "msg_1", "role": "assistant", "content": [{"type": "thinking", "thinking": ""}]}),
        row("assistant", 3, {"id": "msg_1", "role": "assistant", "content": [{"type": "text", "text": "Let me look."}]}),
        row("assistant", 4, {"id": "msg_1", "role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "tail -n 50 /var/log/deploy.log"}}]}),
        {"type": "progress", "data": {"type": "hook_progress"}, "sessionId": CC},
        row("user", 5, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "OOMKilled: container memory limit 512Mi exceeded"}]}),
        "this line is broken {",
        row("assistant", 6, {"id": "msg_2", "role": "assistant", "content": [
            {"type": "text", "text": "The container ran out of memory: raise the limit to 1Gi in deploy/values.yaml."}]}),
        row("user", 7, {"role": "user", "content": "ok, we decided on 1Gi and keep the retry count at 3"}),
        *extra,
    ]
    path.write_text(_lines(rows), encoding="utf-8")
    return path


def codex(path: Path) -> Path:
    t = "2026-03-02T09:00:0{}Z"
    rows = [
        {"timestamp": t.format(0), "type": "session_meta", "payload": {"id": "c0dex999-aaaa", "cwd": "/repo"}},
        {"timestamp": t.format(1), "type": "response_item", "payload": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "rename the flag --fast to --quick in cli.py"}]}},
        {"timestamp": t.format(1), "type": "event_msg", "payload": {"type": "user_message", "message": "rename the flag"}},
        {"timestamp": t.format(2), "type": "response_item", "payload": {"type": "reasoning", "summary": []}},
        {"timestamp": t.format(3), "type": "response_item", "payload": {
            "type": "function_call", "name": "shell", "arguments": '{"command": ["grep", "-n", "fast", "cli.py"]}',
            "call_id": "call_9"}},
        {"timestamp": t.format(4), "type": "response_item", "payload": {
            "type": "function_call_output", "call_id": "call_9", "output": "42: parser.add_argument('--fast')"}},
        {"timestamp": t.format(5), "type": "response_item", "payload": {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Renamed --fast to --quick on line 42 of cli.py."}]}},
    ]
    path.write_text(_lines(rows), encoding="utf-8")
    return path


def test_transcripts_are_read_as_conversations(tmp_path: Path) -> None:
    cc = transcripts.read(claude_code(tmp_path / "cc.jsonl"))
    assert cc.format == "claude-code" and cc.suggested_name() == "claude-11112222"
    assert [m.role for m in cc.messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert cc.bad_lines == [8]  # named by line number; the good lines around it are read
    call = cc.messages[1]  # the streamed assistant lines are one message; the empty thinking block is gone
    assert call.content == "Let me look." and call.tool_calls[0]["id"] == "toolu_1"
    assert json.loads(call.tool_calls[0]["function"]["arguments"]) == {"command": "tail -n 50 /var/log/deploy.log"}
    assert cc.messages[2].tool_call_id == "toolu_1" and cc.messages[2].created_at == "2026-03-01T10:05:00.000Z"

    cx = transcripts.read(codex(tmp_path / "rollout.jsonl"))
    assert cx.format == "codex" and cx.suggested_name() == "codex-c0dex999"
    assert [m.role for m in cx.messages] == ["user", "assistant", "tool", "assistant"]  # event_msg, reasoning left out
    assert cx.messages[1].tool_calls[0]["id"] == cx.messages[2].tool_call_id == "call_9"

    plain = tmp_path / "chat.jsonl"
    plain.write_text(_lines([{"role": "user", "content": "hi"}, {"role": "wizard", "content": "?"},
                             {"role": "assistant", "content": "hello"}]), encoding="utf-8")
    op = transcripts.read(plain)
    assert op.format == "openai" and [m.role for m in op.messages] == ["user", "assistant"] and op.bad_lines == [2]

    junk = tmp_path / "notes.jsonl"
    junk.write_text("not json\nnor this\n", encoding="utf-8")
    with pytest.raises(Exception, match="no openai messages found .2 unreadable"):
        transcripts.read(junk)


def test_import_is_verbatim_idempotent_and_refuses_what_it_cannot_do(tmp_path: Path, capsys, monkeypatch) -> None:
    store = tmp_path / "store"
    cc = claude_code(tmp_path / "cc.jsonl")
    assert main(["import", str(cc), str(codex(tmp_path / "r.jsonl")), "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "claude-11112222: 5 messages imported as uids 1–5; 1 unreadable line(s) skipped: 8" in out
    assert "codex-c0dex999: 4 messages imported as uids 1–4" in out
    events = Store(store).load_events("claude-11112222")
    assert [e.created_at for e in events][:2] == ["2026-03-01T10:01:00.000Z", "2026-03-01T10:03:00.000Z"]
    assert events[2].content == "OOMKilled: container memory limit 512Mi exceeded"  # word for word
    assert events[1].tool_calls[0]["id"] == events[2].tool_call_id == "toolu_1"
    assert all(KEY not in e.content for e in events) and "sk-live1" in events[0].content  # the key is redacted
    full_text = [i for i in Store(store)._recall_text(create=False).list_indices() if i.index_type == "FTS"]
    assert full_text and all(i.num_indexed_rows > 0 and i.num_unindexed_rows == 0 for i in full_text)  # folded
    # the import ran without the background indexer, and did not save that: the next opener builds the vectors
    assert "recall_index" not in (Store(store).load_meta("claude-11112222").get("settings") or {})
    monkeypatch.setenv("MFS_RECALL_INDEX", "true")  # the person's setting (the tests' default is off)
    monkeypatch.delenv("MFS_EMBEDDING_MODEL")
    opened = Session("claude-11112222", store=str(store))
    try:
        assert opened.settings.recall_index and opened.indexer.enabled
        assert opened.indexer.wait(60) and opened.store.recall_state("claude-11112222", opened.indexer.model().model_id)[0] == 5
    finally:
        opened.close()
    monkeypatch.setenv("MFS_RECALL_INDEX", "false")

    assert main(["import", str(cc), "--store", str(store)]) == 0  # twice: nothing added
    assert "claude-11112222: nothing new (5 messages already imported)" in capsys.readouterr().out
    assert len(Store(store).load_events("claude-11112222")) == 5

    more = {"type": "user", "sessionId": CC, "uuid": "u9", "timestamp": "2026-03-01T11:00:00.000Z",
            "message": {"role": "user", "content": "and the canary goes to 10 %"}}
    claude_code(cc, [more])  # the transcript grew: only the new message is added
    assert main(["import", str(cc), "--store", str(store), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["added"], report["kept"], report["uids"]) == (1, 5, [6, 6])

    other = tmp_path / "other.jsonl"
    other.write_text(_lines([{"role": "user", "content": "something else entirely"}]), encoding="utf-8")
    assert main(["import", str(other), "--store", str(store), "--session", "claude-11112222"]) == 2
    assert "holds another conversation" in capsys.readouterr().err
    assert len(Store(store).load_events("claude-11112222")) == 6  # nothing written

    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.jpg").write_bytes(b"\xff\xd8")
    assert main(["import", str(cc), "--store", str(folder)]) == 2
    assert "is not an mfs_nb store" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["cat.jpg"]


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    assert main(["import", str(claude_code(tmp_path / "cc.jsonl")), str(codex(tmp_path / "r.jsonl")),
                 "--store", str(store)]) == 0
    return store


def _text(result) -> str:
    return "\n".join(c.text for c in result.content)


def test_mcp_over_stdio_every_tool_and_resource(tmp_path: Path) -> None:
    store = _store(tmp_path)
    params = StdioServerParameters(command=sys.executable, args=["-m", "mfs_nb", "mcp", "--store", str(store)],
                                   env=dict(os.environ))

    async def run() -> None:
        async with Client(params, read_timeout_seconds=60) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"list_sessions", "recall_search", "recall_history", "context", "search", "fetch", "pin",
                             "unpin", "append_note"}
            listed = _text(await client.call_tool("list_sessions", {}))
            assert "claude-11112222 · 5 messages · uids 1–5 · 2026-03-01T10:01:00" in listed
            assert "codex-c0dex999 · 4 messages" in listed

            found = _text(await client.call_tool("recall_search", {"query": "OOMKilled memory limit", "k": 3}))
            assert "claude-11112222 [#3 tool" in found and "(2026-03-01T10:05:00)" in found
            only = _text(await client.call_tool("recall_search", {"query": "cli.py", "session": "codex-c0dex999",
                                                                  "role": "assistant"}))
            assert "codex-c0dex999 [#4 assistant" in only and "claude" not in only
            dated = _text(await client.call_tool("recall_search", {"query": "1Gi", "date_from": "2026-03-02"}))
            assert "claude-11112222" not in dated  # its messages are all of 2026-03-01

            history = await client.call_tool("recall_history", {"session": "claude-11112222", "uid_from": 2,
                                                                "uid_to": 3})
            assert not history.is_error
            assert "[#3 tool · turn 1]\nOOMKilled: container memory limit 512Mi exceeded" in _text(history)
            assert "tail -n 50 /var/log/deploy.log" in _text(history)
            seen = _text(await client.call_tool("context", {"session": "claude-11112222"}))
            assert "what the model of session 'claude-11112222' is sent" in seen and "retry count at 3" in seen

            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert templates == {"mfs://{session}/export.md", "mfs://{session}/ledger.json"}
            exported = (await client.read_resource("mfs://claude-11112222/export.md")).contents[0].text
            assert "# mfs_nb session `claude-11112222`" in exported and "512Mi" in exported
            ledger = (await client.read_resource("mfs://claude-11112222/ledger.json")).contents[0].text
            assert isinstance(json.loads(ledger), list)

            for name, args, says in [
                ("pin", {"session": "codex-c0dex999", "key": "k", "value": "v"}, "this server is read-only"),
                ("recall_history", {"session": "nope", "uid_from": 1}, "no session 'nope'"),
                ("recall_history", {"session": "codex-c0dex999", "uid_from": 4, "uid_to": 2}, "is reversed"),
                ("recall_history", {"session": "codex-c0dex999", "uid_from": 9, "uid_to": 99}, "no events in 9-99"),
                ("recall_search", {"query": "x" * 3000}, "at most 2,000"),
                ("recall_search", {"query": "memory", "k": 0}, "k must be between 1 and 100"),
                ("recall_search", {"query": "memory", "date_to": "last week"}, "must be an ISO date"),
                ("context", {"session": "codex-c0dex999", "page": 7}, "page must be between 1 and 1"),
            ]:
                result = await client.call_tool(name, args)
                assert result.is_error, (name, args)
                line = _text(result)
                assert says in line and "\n" not in line and "Traceback" not in line, line
            assert "2 sessions" in _text(await client.call_tool("list_sessions", {}))  # the server is still there

    asyncio.run(run())


def test_writes_need_allow_writes_and_keys_never_come_back(tmp_path: Path, monkeypatch) -> None:
    store = Store(_store(tmp_path))
    monkeypatch.setenv("SERVICE_API_KEY", "hunter2-secret-value")
    memory = Memory(store, allow_writes=True)

    async def run() -> None:
        async with Client(build(memory)) as client:
            pinned = await client.call_tool("pin", {"session": "codex-c0dex999", "key": "release_flag", "value": "--quick"})
            assert not pinned.is_error and "release_flag" in _text(pinned)
            assert "release_flag" in _text(await client.call_tool("context", {"session": "codex-c0dex999"}))
            note = _text(await client.call_tool("append_note", {
                "session": "codex-c0dex999", "text": "decided: --quick; token hunter2-secret-value"}))
            assert note == "kept as uid 5 of session 'codex-c0dex999'"
            back = _text(await client.call_tool("recall_history", {"session": "codex-c0dex999", "uid_from": 5}))
            assert "decided: --quick" in back and "hunter2" not in back
            assert not (await client.call_tool("unpin", {"session": "codex-c0dex999", "key": "release_flag"})).is_error
            assert "release_flag" not in _text(await client.call_tool("context", {"session": "codex-c0dex999"}))
        empty = Memory(Store(tmp_path / "empty"))
        async with Client(build(empty)) as client:
            result = await client.call_tool("list_sessions", {})
            assert result.is_error and "holds no sessions yet" in _text(result)

    asyncio.run(run())
    stored = json.dumps([e.content for e in store.load_events("codex-c0dex999")])
    assert "hunter2" not in stored and "decided: --quick" in stored


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_needs_the_token_and_refuses_an_open_address_without_one(tmp_path: Path, capsys) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    store = _store(tmp_path)
    assert main(["mcp", "--store", str(store), "--transport", "http", "--host", "0.0.0.0"]) == 2
    assert "needs a bearer token: set MFS_MCP_TOKEN" in capsys.readouterr().err
    assert main(["mcp", "--store", str(tmp_path / "nowhere")]) == 2
    assert "there is no store at" in capsys.readouterr().err

    port, token = _free_port(), "t0ken-for-this-test-only"
    env = {**os.environ, "MFS_MCP_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-m", "mfs_nb", "mcp", "--store", str(store), "--transport", "http",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                bare = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
                time.sleep(0.2)
        assert bare.status_code == 401 and bare.text == "unauthorized\n"
        wrong = httpx2.post(url, json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401

        async def run() -> str:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http, \
                    Client(streamable_http_client(url, http_client=http)) as client:
                return _text(await client.call_tool("recall_search", {"query": "--quick", "session": "codex-c0dex999"}))

        assert "codex-c0dex999 [#" in asyncio.run(run())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert token not in err.decode()


@pytest.mark.slow
def test_shared_sessions_imported_twice_then_found_through_mcp(tmp_path: Path, capsys) -> None:
    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (data / "loaders.py").exists():
        pytest.skip(f"no shared data at {data}")
    sys.path.insert(0, str(data))
    import loaders

    coding = sorted(str(p) for p in (data / "claude_code_sessions").glob("*-*.jsonl"))
    conv = loaders.locomo()[0]
    chat = tmp_path / "locomo.jsonl"
    chat.write_text(_lines([{"role": m["role"], "content": m["content"]} for m in conv["messages"]]), encoding="utf-8")
    store = tmp_path / "store"
    for _ in range(2):
        assert main(["import", *coding, str(chat), "--store", str(store), "--json"]) == 0
    second = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()[-len(coding) - 1:]]
    assert all(r["added"] == 0 and r["kept"] == r["messages"] > 0 for r in second)
    index = {m["id"]: i + 1 for i, m in enumerate(conv["messages"])}  # uid = place in the transcript
    question = next(q for q in conv["questions"] if q["category"] == 4 and q["evidence"])
    memory = Memory(Store(store))

    async def run() -> str:
        async with Client(build(memory)) as client:
            return _text(await client.call_tool("recall_search", {"query": question["question"], "k": 10,
                                                                  "session": "locomo"}))

    found = asyncio.run(run())
    uids = {index[e] for e in question["evidence"] if e in index}
    assert any(f"[#{u} " in found for u in uids), (question, found)


def test_import_compact_runs_the_memory_layer_and_stays_idempotent(tmp_path: Path, capsys) -> None:
    rows = []
    for i in range(60):
        rows.append({"role": "user", "content": f"Question {i}: what is the status of ticket T-{1000 + i}? " + "details " * 40})
        rows.append({"role": "assistant", "content": f"Ticket T-{1000 + i} waits on team {i % 7}. " + "notes " * 40})
    chat = tmp_path / "tickets.jsonl"
    chat.write_text(_lines(rows), encoding="utf-8")
    store = tmp_path / "store"
    args = ["import", str(chat), "--store", str(store), "--compact", "--window", "8000", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["added"] == 120 and report["segments"] >= 1  # compacted as it was written, as a replay does
    events = Store(store).load_events("tickets")
    assert [e.content for e in events] == [r["content"] for r in rows]  # the log is still word for word
    assert main(args) == 0 and json.loads(capsys.readouterr().out.strip().splitlines()[-1])["added"] == 0


def test_every_client_reads_hints_searches_then_fetches_and_hears_a_session_change(tmp_path: Path) -> None:
    """Issue 69, item 3: tool annotations, the search / fetch pair over all sessions, and the session list as a
    resource whose changes a listening client is told of (another process writing the store)."""
    import threading

    import anyio

    store = _store(tmp_path)
    memory = Memory(Store(store), watch_s=0.2)

    async def run() -> None:
        async with Client(build(memory)) as client:
            hints = {t.name: t.annotations for t in (await client.list_tools()).tools}
            for name in ("list_sessions", "recall_search", "recall_history", "context", "search", "fetch"):
                assert hints[name].read_only_hint is True and hints[name].destructive_hint is False, name
            for name in ("pin", "unpin", "append_note"):
                assert hints[name].read_only_hint is False, name
            assert hints["pin"].destructive_hint is True and hints["append_note"].destructive_hint is False

            found = json.loads(_text(await client.call_tool("search", {"query": "OOMKilled memory limit"})))
            first = found["results"][0]
            assert first["id"] == "claude-11112222:3" and "OOMKilled" in first["title"], found
            assert first["url"] == "mfs://claude-11112222/export.md#uid-3"
            page = json.loads(_text(await client.call_tool("fetch", {"id": first["id"]})))
            assert page["id"] == first["id"] and page["metadata"]["uids"] == [1, 5]  # the message and its neighbours
            assert "[#3 tool · turn 1]\nOOMKilled: container memory limit 512Mi exceeded" in page["text"]
            for bad, says in [("claude-11112222", "id must be session:uid"), ("claude-11112222:99", "no message"),
                              ("nope:1", "no session 'nope'")]:
                result = await client.call_tool("fetch", {"id": bad})
                assert result.is_error and says in _text(result), (bad, _text(result))

            listed = json.loads((await client.read_resource("mfs://sessions")).contents[0].text)
            assert {x["session"]: x["last_uid"] for x in listed} == {"claude-11112222": 5, "codex-c0dex999": 4}
            async with client.listen(resources_list_changed=True, resource_subscriptions=["mfs://sessions"]) as sub:
                def another_kernel() -> None:
                    s = Session("notebook", store=Store(store))
                    s.chat("a new session, written beside the server")
                    s.close()

                threading.Thread(target=another_kernel).start()
                heard = []
                with anyio.fail_after(60):
                    async for event in sub:
                        heard.append(type(event).__name__)
                        if {"ResourcesListChanged", "ResourceUpdated"} <= set(heard):
                            break
            listed = json.loads((await client.read_resource("mfs://sessions")).contents[0].text)
            assert {x["session"]: x["last_uid"] for x in listed}["notebook"] == 2

    asyncio.run(run())
    memory.close()


def test_the_set_up_blocks_of_the_guide_start_a_server_the_sdk_client_can_use(tmp_path: Path) -> None:
    """Each host's block in docs/guide/mcp.md (Claude Code, Codex, Cursor, VS Code) names a command and
    arguments; run as that host would (stdio, the store path swapped for a test store), each serves the tools."""
    import re
    import shlex
    import shutil

    import tomllib

    guide = (Path(__file__).parent.parent / "docs" / "guide" / "mcp.md").read_text()
    found: dict[str, tuple[str, list[str]]] = {}
    for lang, body in re.findall(r"```(bash|toml|json)\n(.*?)```", guide, re.S):
        if lang == "bash" and "claude mcp add --scope user" in body:
            words = shlex.split(body.splitlines()[0].split("#")[0])
            found["claude"] = (words[words.index("--") + 1], words[words.index("--") + 2:])
        elif lang == "toml" and "mcp_servers" in body:
            entry = tomllib.loads(body)["mcp_servers"]["mfs-nb"]
            found["codex"] = (entry["command"], entry["args"])
        elif lang == "json" and '"mcpServers"' in body:
            entry = json.loads(body)["mcpServers"]["mfs-nb"]
            found["cursor"] = (entry["command"], entry["args"])
        elif lang == "json" and '"servers"' in body:
            entry = json.loads(body)["servers"]["mfs-nb"]
            assert entry["type"] == "stdio"
            found["vscode"] = (entry["command"], entry["args"])
    assert set(found) == {"claude", "codex", "cursor", "vscode"}, found
    store = _store(tmp_path)
    for host, (command, args) in found.items():
        assert command == "mfs-nb" and args[:2] == ["mcp", "--store"], (host, command, args)
        exe = shutil.which(command)
        argv = [exe, *args[:2], str(store), *args[3:]] if exe else [sys.executable, "-m", "mfs_nb", *args[:2],
                                                                   str(store), *args[3:]]
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))

        async def run(params: StdioServerParameters = params) -> None:
            async with Client(params, read_timeout_seconds=60) as client:
                assert "search" in {t.name for t in (await client.list_tools()).tools}
                assert "claude-11112222" in _text(await client.call_tool("list_sessions", {}))

        asyncio.run(run())
