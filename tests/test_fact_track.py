"""The fact track: the working set and fact lines of history the payload no longer shows as it was."""

from __future__ import annotations

import json

from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.events import Event
from mfs_nb.layers.fact_track import fact_track


def _events(n: int) -> list[Event]:
    out = []
    for i in range(1, n + 1):
        role = "user" if i % 2 else "assistant"
        out.append(Event(i, "s", (i + 1) // 2, role, f"message {i}: the limit is {1000 + i} rows in data/t{i}.csv"))
    return out


def test_higher_kinds_first_then_the_newest_and_the_rest_named():
    events = _events(40)
    events[4] = Event(5, "s", 3, "user", "TimeoutError: the export stalled after 30 s")
    full = fact_track(events, 40, 40, set(), 10_000)
    assert full is not None and full.dropped is None
    assert "- user: message 1: the limit is 1001 rows in data/t1.csv [#1]" in full.text
    small = fact_track(events, 40, 40, set(), 260)
    assert small is not None and small.dropped is not None and small.dropped[0] == 1
    assert "TimeoutError: the export stalled" in small.text  # the oldest line, but an error: kept first
    assert "[#40]" in small.text and "[#1]" not in small.text
    assert "[older fact lines of uids 1–" in small.text and "recall_history returns them" in small.text
    assert fact_track(events, 40, 40, set(), 0) is None


def test_the_messages_a_line_shows_whole_are_named_and_a_cut_one_is_not():
    """Issue 44: a search for the model leaves out what its payload shows word for word; a line of
    the fact track that holds a whole message counts, one cut to its line length does not."""
    events = _events(6)
    events[2] = Event(3, "s", 2, "user", "The timeout is 30 s. " + "More words here to pad the message. " * 8)
    track = fact_track(events, 6, 6, set(), 10_000)
    assert track is not None and "- user: The timeout is 30 s. [#3]" in track.text  # one sentence of it
    assert track.whole == (1, 2, 4, 5, 6)
    # a message with a tool call is never whole: the line shows its text, not the call's arguments; nor
    # does a short text count inside the line of its own command
    call = {"id": "c1", "type": "function",
            "function": {"name": "write_file", "arguments": json.dumps({"path": "conf/app.yaml", "content": "port: 8443"})}}
    run = {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "psql -c 'select 1'"})}}
    tools = [Event(1, "s", 1, "user", "set up the config in conf/app.yaml please"),
             Event(2, "s", 1, "assistant", "Writing conf/app.yaml now.", tool_calls=(call,)),
             Event(3, "s", 1, "tool", "ok", tool_call_id="c1"),
             Event(4, "s", 2, "assistant", "psql", tool_calls=(run,)),
             Event(5, "s", 2, "tool", "1", tool_call_id="c2")]
    track = fact_track(tools, 5, 5, set(), 10_000)
    assert track is not None and "Writing conf/app.yaml now. [#2]" in track.text and "psql -c" in track.text
    assert track.whole == (1,)


def test_lines_shown_elsewhere_are_not_repeated():
    events = _events(6)
    shown = "- assistant: message 2: the limit is 1002 rows in data/t2.csv [#2]\nassistant: message 4: the limit is 1004 rows in data/t4.csv …"
    track = fact_track(events, 6, 6, {1, 3}, 10_000, shown_text=shown)
    assert track is not None
    assert "[#2]" not in track.text and "[#4]" not in track.text  # in a segment's list or its text
    assert "[#1]" not in track.text and "[#3]" not in track.text  # kept whole by the user-verbatim track
    assert "[#5]" in track.text and "[#6]" in track.text
    assert fact_track(events, 0, 0, set(), 10_000) is None


def test_text_lines_only_from_the_compacted_range_tool_lines_from_the_cleared_one():
    events = _events(10)
    track = fact_track(events, 4, 8, set(), 10_000)
    assert track is not None and track.upto == 8
    assert "[#4]" in track.text and "[#5]" not in track.text  # uids 5–8 are raw in the payload: not repeated


def test_facts_survive_the_eviction_of_their_segment_map(store_dir, roomy_layers):
    s = Session("ft", store=store_dir, window_tokens=8000, llm=FakeLLM(), consolidation=False)  # eviction only
    for i in range(160):
        s.record("user", f"turn {i}", new_turn=True)
        s.prepare_call()
        s.record("assistant", f"Measured: service-{i} answered in {300 + i} ms under load. " + "Filler words. " * 60)
        if s.compactor.evicted:
            break
    assert s.compactor.evicted, "the test needs an evicted segment map"
    view = s.send_view()
    kinds = [x.kind for x in view.layers]
    assert "facts" in kinds and kinds.index("facts") < kinds.index("raw")
    text = view.messages[kinds.index("facts")]["content"]
    first_evicted = s.compactor.evicted[0][0]
    assistant = next(e for e in s.events if e.role == "assistant" and e.uid >= first_evicted)
    assert f"[#{assistant.uid}]" in text  # an evicted map's fact is still in the payload, verbatim
    s.record("user", "an ordinary turn", new_turn=True)
    s.record("assistant", "ok")
    again = s.send_view()
    assert again.messages[kinds.index("facts")]["content"] == text  # only compaction events rebuild it


def test_what_tools_printed_fills_the_room_the_rest_leaves_newest_first():
    """A compacted tool result's printed paths and numbers stay in the fact track, under their own
    caption, ranked under every other line: a tight track keeps the working set and drops them first."""
    from mfs_nb.layers.workset import lines_of

    def call(uid: int, cid: str, command: str) -> Event:
        return Event(uid, "s", uid, "assistant", "", tool_calls=({"id": cid, "type": "function", "function": {
            "name": "Bash", "arguments": json.dumps({"command": command})}},))

    events = [Event(1, "s", 1, "user", "Find where the pool size is set."),
              call(2, "c1", "ls config"), Event(3, "s", 3, "tool", "config/pool.exs\nconfig/runtime.exs", tool_call_id="c1"),
              call(4, "c2", "grep -rn pool_size config"),
              Event(5, "s", 5, "tool", "config/runtime.exs:12:  pool_size: 64 connections", tool_call_id="c2")]
    full = fact_track(events, 5, 5, set(), 10_000)
    assert full is not None
    printed = full.text.split("what tools returned:")[1]
    assert "- tool: config/runtime.exs:12:  pool_size: 64 connections [#5]" in printed
    assert "config/pool.exs" in printed
    assert full.text.index("commands run:") < full.text.index("what tools returned:")
    tight = fact_track(events, 5, 5, set(), 120)
    assert tight is not None and "grep -rn pool_size config" in tight.text and "what tools returned:" not in tight.text
    assert not [x for x in lines_of(events) if x.group == "outputs"]  # a segment's fact list leaves them out


def test_printed_lines_leave_out_errors_and_recalls_and_the_newest_win_the_room():
    from mfs_nb.layers.workset import lines_of

    def call(uid: int, cid: str, name: str = "Bash") -> Event:
        return Event(uid, "s", uid, "assistant", "", tool_calls=({"id": cid, "type": "function", "function": {
            "name": name, "arguments": json.dumps({"command": f"make report{uid}"})}},))

    events: list[Event] = []
    for i in range(10):
        uid = 2 * i + 1
        events += [call(uid, f"c{i}"), Event(uid + 1, "s", uid + 1, "tool", f"wrote out/report{i}.csv with {100 + i} rows",
                                             tool_call_id=f"c{i}", name="Bash")]
    events += [call(21, "c10"), Event(22, "s", 22, "tool", 'File "app/main.py", line 3\nValueError: bad row 7',
                                      tool_call_id="c10", name="Bash"),
               call(23, "c11", "recall_history"), Event(24, "s", 24, "tool", "[#2] wrote out/report0.csv with 100 rows",
                                                        tool_call_id="c11", name="recall_history")]
    printed = [x for x in lines_of(events, outputs=10_000) if x.group == "outputs"]
    assert {x.uids for x in printed} == {(2 * i + 2,) for i in range(10)}  # the recall's copy adds no uid
    assert not any("ValueError" in x.text or "main.py" in x.text for x in printed)  # the errors group has them
    full = fact_track(events, 24, 24, set(), 10_000)
    assert full is not None and full.dropped is None and "out/report0.csv" in full.text
    some = fact_track(events, 24, 24, set(), full.tokens - 40)  # a few printed lines too many
    assert some is not None and "what tools returned:" in some.text and "make report1" in some.text
    assert "out/report9.csv" in some.text and "out/report0.csv" not in some.text  # the newest first
