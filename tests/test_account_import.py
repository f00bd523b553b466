"""`mfs-nb import` of account exports (issue 69, item 2): ChatGPT's conversation trees read along the branch
the person last saw, claude.ai's flat lists, the export's zip, a damaged file, and a second import that
adds nothing. The exports are built here, in the shape the services write."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from mfs_nb.commands import accounts
from mfs_nb.commands.cli import main
from mfs_nb.store import Store


def _node(nid, parent, children, role=None, text=None, *, t=0.0, recipient="all", ctype="text", name=None, **extra):
    message = None
    if role is not None:
        content = {"content_type": ctype, "parts": [text]} if ctype in ("text", "multimodal_text") else \
            {"content_type": ctype, "text": text}
        message = {"id": nid, "author": {"role": role, "name": name}, "create_time": 1_700_000_000 + t,
                   "content": content, "recipient": recipient, "metadata": extra.get("metadata", {})}
    return nid, {"id": nid, "message": message, "parent": parent, "children": children}


def chatgpt_trip() -> dict:
    """A trip plan with a regenerated first answer, an edited second question, and a python step."""
    nodes = dict([
        _node("root", None, ["sys"]),
        _node("sys", "root", ["u1"], "system", ""),
        _node("u1", "sys", ["a1", "a1b"], "user", "Plan a 3-day trip to Lisbon", t=1,
              metadata={"attachments": [{"name": "flights.pdf", "size": 20480, "mime_type": "application/pdf"}]}),
        _node("a1", "u1", [], "assistant", "Day 1: Alfama and the castle.", t=2),
        _node("a1b", "u1", ["u2", "u2e"], "assistant", "Day 1: Belém and the tower.", t=3),
        _node("u2", "a1b", ["a2"], "user", "Add a budget of 600 euros", t=4),
        _node("a2", "u2", [], "assistant", "200 euros a day.", t=5),
        _node("u2e", "a1b", ["c1"], "user", "Add a budget of 650 euros", t=6),
        _node("c1", "u2e", ["r1"], "assistant", "print(round(650 / 3, 2))", t=7, recipient="python", ctype="code"),
        _node("r1", "c1", ["th"], "tool", "216.67", t=8, ctype="execution_output", name="python"),
        _node("th", "r1", ["a3"], "assistant", "Let me think about it", t=9, ctype="thoughts"),
        _node("a3", "th", [], "assistant", "About 217 euros a day.", t=10),
    ])
    return {"title": "Lisbon trip", "id": "6f1a2b3c-trip", "create_time": 1_700_000_001,
            "update_time": 1_700_000_010, "mapping": nodes, "current_node": "a3"}


def chatgpt_cycle() -> dict:
    """A tree whose current node's parents loop; a path from the start survives beside it."""
    nodes = dict([
        _node("root", None, ["y1"]),
        _node("y1", "root", ["y2"], "user", "What is the port of the staging database?", t=20),
        _node("y2", "y1", [], "assistant", "Port 5433.", t=21),
        _node("x1", "x2", [], "user", "lost", t=22),
        _node("x2", "x1", ["x1"], "assistant", "lost too", t=23),
    ])
    return {"title": "Staging DB", "id": "9d9d9d9d-db", "create_time": 1_700_000_020, "update_time": 1_700_000_023,
            "mapping": nodes, "current_node": "x1"}


def chatgpt_orphan() -> dict:
    """A tree whose current node's parent is not in it."""
    nodes = dict([
        _node("root", None, ["z1"]),
        _node("z1", "root", ["z2"], "user", "Which region do we deploy to?", t=30),
        _node("z2", "z1", [], "assistant", "eu-west-1.", t=31),
        _node("z3", "gone", [], "assistant", "an answer to a question that is not there", t=32),
    ])
    return {"title": "Region", "id": "0a0a0a0a-rg", "create_time": 1_700_000_030, "update_time": 1_700_000_032,
            "mapping": nodes, "current_node": "z3"}


def claude_parser() -> dict:
    return {"uuid": "c1a0de00-4242", "name": "Refactor the parser", "created_at": "2024-05-01T10:00:00.000000Z",
            "updated_at": "2024-05-01T10:02:00.000000Z", "chat_messages": [
                {"uuid": "m1", "sender": "human", "text": "Here is my parser; make it handle quotes.",
                 "content": [{"type": "text", "text": "Here is my parser; make it handle quotes."}],
                 "attachments": [{"file_name": "parser.py", "file_size": 44, "file_type": "text/x-python",
                                  "extracted_content": "def parse(line):\n    return line.split(',')\n"}],
                 "files": [{"file_name": "diagram.png"}], "created_at": "2024-05-01T10:00:00.000000Z"},
                {"uuid": "m2", "sender": "assistant", "created_at": "2024-05-01T10:01:00.000000Z", "content": [
                    {"type": "text", "text": "Let me check the csv module."},
                    {"type": "tool_use", "id": "toolu_1", "name": "web_search", "input": {"query": "python csv quotes"}},
                    {"type": "tool_result", "name": "web_search", "content": [{"type": "text", "text": "csv.reader handles quoting"}]},
                    {"type": "text", "text": "Use csv.reader(io.StringIO(line))."}]},
                {"uuid": "m3", "sender": "human", "text": "Thanks, that works.", "content": [],
                 "created_at": "2024-05-01T10:02:00.000000Z"}]}


def _events(store: Path, name: str) -> list[tuple[str, str]]:
    return [(e.role, e.content) for e in Store(store).load_events(name)]


def test_a_chatgpt_export_follows_the_branch_the_person_saw_and_imports_once(tmp_path, capsys):
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps([chatgpt_trip(), chatgpt_cycle(), chatgpt_orphan()]))
    store = tmp_path / "store"
    assert main(["import", str(export), "--store", str(store)]) == 0
    out, err = capsys.readouterr()
    assert "conversation 'Region': its tree has a missing parent" in err, err
    assert _events(store, "chatgpt-region-0a0a0a0a") == [("user", "Which region do we deploy to?"),
                                                         ("assistant", "eu-west-1.")]
    trip, db = "chatgpt-lisbon-trip-6f1a2b3c", "chatgpt-staging-db-9d9d9d9d"
    assert f"{trip}: 6 messages imported as uids 1–6  (Lisbon trip)" in out, out
    assert "conversation 'Staging DB': its tree has a cycle; read along its longest path" in err, err
    events = _events(store, trip)
    assert [r for r, _ in events] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert events[0][1].startswith("Plan a 3-day trip to Lisbon") and "[attached file flights.pdf" in events[0][1]
    assert events[1][1] == "Day 1: Belém and the tower."  # the regenerated answer, not the first one
    assert events[2][1] == "Add a budget of 650 euros"  # the edited question
    said = " ".join(c for _, c in events)
    assert "Alfama" not in said and "600 euros" not in said and "think about it" not in said
    e = Store(store).load_events(trip)
    assert e[3].tool_calls[0]["function"]["name"] == "python" and "650 / 3" in e[3].tool_calls[0]["function"]["arguments"]
    assert e[4].tool_call_id == e[3].tool_calls[0]["id"] and e[4].content == "216.67"
    assert e[0].created_at == "2023-11-14T22:13:21.000Z"  # the export's own time
    assert _events(store, db) == [("user", "What is the port of the staging database?"), ("assistant", "Port 5433.")]
    assert main(["import", str(export), "--store", str(store)]) == 0  # again: nothing new
    assert f"{trip}: nothing new (6 messages already imported)" in capsys.readouterr().out
    assert len(Store(store).load_events(trip)) == 6


def test_a_claude_export_in_its_zip_keeps_tools_and_attached_text(tmp_path, capsys):
    z = tmp_path / "data-2024-05-02.zip"
    with zipfile.ZipFile(z, "w") as archive:
        archive.writestr("data-2024-05-02/conversations.json", json.dumps([claude_parser()]))
        archive.writestr("data-2024-05-02/users.json", "[]")
    store = tmp_path / "store"
    assert main(["import", str(z), "--store", str(store)]) == 0
    name = "claude-refactor-the-parser-c1a0de00"
    assert f"{name}: 5 messages imported as uids 1–5" in capsys.readouterr().out
    e = Store(store).load_events(name)
    roles = [x.role for x in e]
    assert roles == ["user", "assistant", "tool", "assistant", "user"], roles
    assert "def parse(line):" in e[0].content and "[attached file diagram.png]" in e[0].content
    snapshot = next(p for p in (store / "attachments").iterdir())
    assert snapshot.read_text() == "def parse(line):\n    return line.split(',')\n" and snapshot.name in e[0].content
    assert e[1].content == "Let me check the csv module." and e[1].tool_calls[0]["function"]["name"] == "web_search"
    assert e[2].content == "csv.reader handles quoting" and e[2].tool_call_id == e[1].tool_calls[0]["id"]
    assert e[3].content == "Use csv.reader(io.StringIO(line))." and e[4].content == "Thanks, that works."
    assert e[0].created_at == "2024-05-01T10:00:00.000Z"
    assert main(["import", str(z), "--store", str(store)]) == 0
    assert "nothing new (5 messages already imported)" in capsys.readouterr().out


def test_a_damaged_export_imports_what_comes_before_and_a_rerun_finishes_it(tmp_path, capsys):
    whole = json.dumps([claude_parser(), chatgpt_trip(), chatgpt_cycle()])
    cut = tmp_path / "conversations.json"
    cut.write_text(whole[: whole.index('"Lisbon trip"') + 40])  # truncated inside the second conversation
    store = tmp_path / "store"
    assert main(["import", str(cut), "--store", str(store)]) == 2
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.startswith("mfs-nb: ")]
    assert len(lines) == 1 and str(cut) in lines[0] and "conversation 2" in lines[0] and "the 1 before it" in lines[0]
    assert "Traceback" not in err
    assert Store(store).sessions() == ["claude-refactor-the-parser-c1a0de00"]
    cut.write_text(whole)  # the whole file: the rest comes in, the first adds nothing
    assert main(["import", str(cut), "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "claude-refactor-the-parser-c1a0de00: nothing new" in out and "chatgpt-lisbon-trip-6f1a2b3c: 6 messages" in out
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps([chatgpt_cycle(), {"version": 9, "threads": []}]))
    assert main(["import", str(odd), "--format", "chatgpt", "--store", str(tmp_path / "other")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "conversation 2 (after 'Staging DB')" in line and "not a ChatGPT or claude.ai conversation" in line


def test_since_and_session_names(tmp_path, capsys):
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps([chatgpt_trip(), claude_parser()]))
    store = tmp_path / "store"
    assert main(["import", str(export), "--store", str(store), "--since", "2024-01-01"]) == 0
    assert Store(store).sessions() == ["claude-refactor-the-parser-c1a0de00"]  # the trip was last active in 2023
    assert main(["import", str(export), "--store", str(store), "--since", "last week"]) == 2
    assert "give an ISO date" in capsys.readouterr().err
    same = accounts.session_name("chatgpt", "Lisbon trip", "6f1a2b3c-other")
    assert same == accounts.session_name("chatgpt", "Lisbon trip", "6f1a2b3c-other") != \
        accounts.session_name("chatgpt", "Lisbon trip", "77777777")
