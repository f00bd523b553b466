"""The working set: files touched, commands run, errors seen and decisions, from the log alone."""

from __future__ import annotations

import json

from conftest import FakeLLM, tool_call

from mfs_nb import Session
from mfs_nb.events import Event
from mfs_nb.layers.facts import tool_digest
from mfs_nb.layers.segments import compressor_messages, fact_list, topic_keywords
from mfs_nb.layers.workset import budget, error_lines, exit_status, lines_of
from mfs_nb.recall.tools import Tool


def call(uid: int, name: str, args: dict, cid: str) -> Event:
    return Event(uid, "s", uid, "assistant", "", tool_calls=({"id": cid, "type": "function",
                                                             "function": {"name": name, "arguments": json.dumps(args)}},))


def result(uid: int, cid: str, text: str) -> Event:
    return Event(uid, "s", uid, "tool", text, tool_call_id=cid)


def history() -> list[Event]:
    return [
        Event(1, "s", 1, "user", "Fix the pool. Don't touch the migrations; use Postgres 16 instead of SQLite.",
              turn_start=True),
        call(2, "Read", {"file_path": "/app/lib/pool.ex"}, "c1"), result(3, "c1", "defmodule Pool do\nend"),
        call(4, "Edit", {"file_path": "/app/lib/pool.ex", "old_string": "a", "new_string": "b"}, "c2"),
        result(5, "c2", "ok"),
        call(6, "Bash", {"command": "mix test test/pool_test.exs", "description": "Run the pool tests"}, "c3"),
        result(7, "c3", "  1) test checkout (PoolTest)\n     test/pool_test.exs:12\n"
                        "     ** (RuntimeError) pool exhausted after 30 s\nExit code 1"),
        call(8, "Read", {"file_path": "/app/lib/pool.ex"}, "c4"), result(9, "c4", "defmodule Pool do\nend"),
        call(10, "str_replace_based_edit_tool", {"command": "create", "path": "/app/lib/new.ex", "file_text": "x"}, "c5"),
        result(11, "c5", "created"),
        call(12, "Bash", {"command": "rm tmp/old.log && mix test test/pool_test.exs",
                          "description": "Clean up and test again"}, "c6"),
        result(13, "c6", "3 tests, 0 failures"),
        call(14, "Glob", {"pattern": "priv/repo/migrations/*.exs"}, "c7"), result(15, "c7", "none"),
        Event(16, "s", 16, "assistant", "All 3 tests pass now; the fix is in `lib/pool.ex`."),
    ]


def by_group(lines):
    out: dict[str, list[str]] = {}
    for x in lines:
        out.setdefault(x.group, []).append(x.render())
    return out


def test_files_collapse_with_the_latest_change_and_every_uid():
    files = by_group(lines_of(history()))["files"]
    pool = [x for x in files if x.startswith("- tool: /app/lib/pool.ex")]
    assert pool == ["- tool: /app/lib/pool.ex — edited (Read, Edit) [#2 #4 #8]"]  # a later read does not hide the edit
    assert "- tool: /app/lib/new.ex — created (str_replace_based_edit_tool) [#10]" in files
    assert "- tool: tmp/old.log — deleted (Bash) [#12]" in files
    assert "- tool: priv/repo/migrations/*.exs — searched (Glob) [#14]" in files


def test_commands_keep_their_description_and_exit_status():
    commands = by_group(lines_of(history()))["commands"]
    assert "- tool: Bash: mix test test/pool_test.exs — Run the pool tests → exit 1 [#6]" in commands
    assert any(c.startswith("- tool: Bash: rm tmp/old.log && mix test test/pool_test.exs — Clean up") for c in commands)
    assert exit_status("Traceback (most recent call last):\nValueError: bad") == "failed"
    assert exit_status("all good") == ""


def test_errors_with_their_location_and_the_users_decisions():
    groups = by_group(lines_of(history()))
    assert groups["errors"] == ["- tool: 1) test checkout (PoolTest) [#7]",  # the failing test, then its error
                                "- tool: test/pool_test.exs:12 — ** (RuntimeError) pool exhausted after 30 s [#7]"]
    said = "\n".join(groups["said"])
    assert "user: Fix the pool. Don't touch the migrations; use Postgres 16 instead of SQLite. [#1]" in said
    assert said.count("Don't touch the migrations") == 1
    assert "assistant: All 3 tests pass now; the fix is in `lib/pool.ex`. [#16]" in said
    trace = 'Traceback (most recent call last):\n  File "app/x.py", line 9, in run\n    go()\nKeyError: \'id\'\n'
    assert error_lines(trace) == ['File "app/x.py", line 9, in run — KeyError: \'id\'']
    assert error_lines("FAILED tests/test_a.py::test_b - assert 1 == 2\nerror: linker failed") == [
        "FAILED tests/test_a.py::test_b - assert 1 == 2", "error: linker failed"]


def test_budget_drops_the_oldest_low_priority_lines_and_names_them():
    events = [Event(i, "s", i, "assistant", f"step {i}: copied {1000 + i} rows") for i in range(1, 60)]
    events.append(Event(60, "s", 60, "assistant", "ValueError: column 'id' is missing"))
    kept = budget(lines_of(events), 300)
    text = kept.render()
    assert "ValueError: column 'id' is missing" in text and "copied 1059 rows" in text
    assert "copied 1001 rows" not in text
    assert "[older fact lines of uids 1–" in text and "recall_history returns them" in text
    assert len(kept.lines) + len(kept.dropped) == 60


def test_a_segments_fact_list_and_the_digest_complement_each_other():
    events = history()
    facts = fact_list(events).render()
    assert "errors seen:" in facts and "files touched:" in facts and "commands run:" in facts
    long = "x" * 800 + "\n  1) test checkout (PoolTest)\n     test/pool_test.exs:12\n     ** (RuntimeError) pool exhausted\n" + \
        "KeyError: other\n" + "y" * 800
    events[6] = result(7, "c3", long)
    digest = next(m["content"] for m in compressor_messages(events) if m.get("tool_call_id") == "c3")
    assert "** (RuntimeError) pool exhausted" not in digest.split("[fact lines]")[-1]  # the fact list has it
    assert "[fact lines]" in digest
    assert "[fact lines]" in tool_digest(long) and "RuntimeError" in tool_digest(long).split("[fact lines]")[-1]
    error = ("ValueError: column customer_identifier missing in /app/data/orders_2024.csv at row 123456 "
             + "(while loading batch 77 of the nightly import) " * 3)  # over 200 characters: the fact list cuts it
    events = [call(1, "Bash", {"command": "python load.py"}, "c1"), result(2, "c1", "x" * 900 + "\n" + error + "\n" + "y" * 900)]
    digest = next(m["content"] for m in compressor_messages(events) if m.get("tool_call_id") == "c1")
    assert "customer_identifier" not in digest  # a long error line is in the fact list once, not again in the digest
    assert "customer_identifier" in fact_list(events).render()


def test_tool_lines_of_cleared_history_reach_the_payload_before_any_compaction(store_dir):
    rounds = 30
    script = []
    for i in range(rounds):
        script += [tool_call("run_shell", {"command": f"make target_{i} --jobs 4", "description": f"build step {i}"},
                             f"call_{i}"), f"round {i} done"]
    s = Session("ws", store=store_dir, window_tokens=16000, llm=FakeLLM(script=script))
    s.register_tool(Tool("run_shell", "run a command", {"type": "object"},
                         lambda command, description="": f"building {command}\n" + "log line 12345\n" * 100 +
                         ("error: undefined symbol foo_" + command[12:14].strip() + "\nexit code 2" if "7" in command else "")))
    for i in range(rounds):
        s.chat(f"run step {i}")
    assert not s.compactor.segments and s.clearing_state().clear_before > 0, "S2 cleared, S3 never ran"
    view = s.send_view()
    kinds = [x.kind for x in view.layers]
    assert "facts" in kinds and kinds.index("facts") < kinds.index("raw")
    text = view.messages[kinds.index("facts")]["content"]
    assert "run_shell: make target_7 --jobs 4 — build step 7 → exit 2" in text
    assert "error: undefined symbol foo_7" in text
    assert view.tokens <= s.profile().effective
    s._llm = FakeLLM(default="plain answer")
    s.chat("a question without tools")
    again = s.send_view()
    assert again.messages[kinds.index("facts")]["content"] == text  # byte-stable between memory events


def test_other_calls_show_their_arguments_and_outcome_and_pair_with_their_own_result():
    events = [
        call(1, "get_reservation_details", {"reservation_id": "4NQLHD"}, "call_0"),
        result(2, "call_0", '{"reservation_id": "4NQLHD", "status": "active"}'),
        call(3, "cancel_reservation", {"reservation_id": "4NQLHD"}, "call_0"),  # the same id again
        result(4, "call_0", '{"status": "cancelled", "refund": 405}'),
        call(5, "recall_history", {"uid_from": 1, "uid_to": 2}, "call_1"),
        Event(6, "s", 6, "tool", "[#7] KeyError: 'id'", tool_call_id="call_1", name="recall_history"),
    ]
    calls = lines_of(events)
    text = {x.text: x for x in calls}
    cancel = 'tool: cancel_reservation(reservation_id=4NQLHD) → {"status": "cancelled", "refund": 405}'
    lookup = 'tool: get_reservation_details(reservation_id=4NQLHD) → {"reservation_id": "4NQLHD", "status": "active"}'
    assert set(text) == {cancel, lookup}  # the memory layer's own tools are not work done, nor what they return
    assert text[cancel].kind < text[lookup].kind  # an action outranks a lookup
    long = lines_of([call(1, "book", {"note": "x" * 500, "total": 405}, "c"), result(2, "c", "y" * 500)])[0]
    assert len(long.text) <= 200 and long.text.startswith("tool: book(note=") and "→ yyy" in long.text


def test_an_attached_documents_closing_line_is_not_something_the_user_said(store_dir, tmp_path):
    doc = tmp_path / "must-read.md"  # "must" is a decision word: the closing line is not one either
    body = "# Incident review\nThe pool was raised to 40 on deploy/pool.yaml.\n"
    doc.write_text(body, encoding="utf-8")
    s = Session("ws-doc", store=store_dir, llm=FakeLLM(default="noted"))
    s.chat("Read the review before we size the pool.", docs=[doc])
    said = [x.text for x in lines_of(s._events) if x.group == "said"]
    opening = [t for t in said if t.startswith("user: [attached document attachments/")]
    assert len(opening) == 1 and opening[0].endswith(f"-must-read.md ({len(body)} chars)]")  # the pointer stays
    assert "user: The pool was raised to 40 on deploy/pool.yaml." in said
    assert not any("[end of " in t for t in said), said
    topics = topic_keywords(s._events).split(", ")  # nor do the lines around it name the topic
    assert "pool" in topics and not {"attachments", "attached", "chars"} & set(topics), topics


def test_the_offline_defaults_notice_is_not_something_the_assistant_said(store_dir):
    s = Session("ws-offline", store=store_dir)  # no model configured: the offline default answers
    s.chat("Keep the pool under 30; run `pytest tests/test_pool.py` after each change.")
    reply = s._events[-1]
    assert reply.role == "assistant" and "No model is configured" in reply.content
    said = [x.text for x in lines_of(s._events) if x.group == "said"]
    assert "user: Keep the pool under 30; run `pytest tests/test_pool.py` after each change." in said
    assert not any(t.startswith("assistant:") for t in said), said
    topics = topic_keywords(s._events).split(", ")  # a segment's header names what the user talked about
    assert "pool" in topics and not {"model", "configured", "message", "config"} & set(topics), topics


def test_when_room_is_short_the_line_least_recently_and_least_often_used_goes_first():
    """Issue 67: within a kind the fact track ranks by recency and reuse (`workset.rank`), never by
    the order lines were met; errors still come before paths."""
    from mfs_nb.layers.facts import ERROR, PATH
    from mfs_nb.layers.workset import Line, budget, rank

    error = Line("errors", ERROR, "boom", "tool: RuntimeError: boom", (1,))
    edited_often = Line("files", PATH, "lib/a.ex", "tool: lib/a.ex — edited (Edit)", (2, 5, 9, 12))
    read_once_early = Line("files", PATH, "lib/c.ex", "tool: lib/c.ex — read (Read)", (3,))
    read_once_later = Line("files", PATH, "lib/b.ex", "tool: lib/b.ex — read (Read)", (14,))
    read_once_last = Line("files", PATH, "lib/d.ex", "tool: lib/d.ex — read (Read)", (40,))
    lines = [error, edited_often, read_once_early, read_once_later, read_once_last]
    order = rank(lines)
    assert order == rank(list(reversed(lines))) == rank(lines[2:] + lines[:2])  # the order met plays no part
    assert order[0] is error and order[-1] is read_once_early  # least recently and least often used: first out
    assert order.index(read_once_last) < order.index(read_once_later)  # recency among lines used once
    assert order.index(edited_often) < order.index(read_once_later)  # four uses outweigh two places of recency
    one_line = sum(len(x.render()) for x in lines) // (4 * len(lines))  # about a line's tokens
    kept = budget(lines, 40 + 6 * 4 + 3 * (one_line + 4))
    assert error in kept.lines and edited_often in kept.lines and read_once_early in kept.dropped
