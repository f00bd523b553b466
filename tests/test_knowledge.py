"""The knowledge slot (issue 18 deliverable 1) and the model's view of its budget (deliverable 7)."""

from __future__ import annotations

import pytest
from conftest import FakeLLM, tool_call

from mfs_nb import InputError, Session
from mfs_nb.session import shared_prefix_tokens

REPLY = "Noted; the pool stays at the agreed size and the migration waits for the freeze to end. " * 3


def _slot(messages):
    return [m for m in messages if (m.get("content") or "").startswith("[knowledge slot")]


def test_pin_puts_the_value_right_after_the_system_prompt_and_survives_compaction_and_reopen(store_dir):
    s = Session("k", store=store_dir, window_tokens=8000, llm=FakeLLM(default=REPLY), show_budget=False,
                background_compaction=False)
    notices = s.pin("db_port", "5433")
    assert notices and "pinned db_port" in notices[0]
    for i in range(40):
        s.chat(f"message {i}: the staging host stg-{i} restarts nightly at 0{i % 10}:15 UTC. " * 8)
    assert s.segments, "the conversation was compacted"
    sent = s.llm.received[-1]
    assert sent[0]["role"] == "system" and sent[1]["content"].startswith("[knowledge slot")
    assert "- db_port: 5433" in sent[1]["content"]
    assert [layer.kind for layer in s.send_view().layers][:2] == ["system", "knowledge"]
    row = [r for r in s.ledger() if r["kind"] == "knowledge"][0]
    assert row["by"] == "user" and row["set"] == [{"key": "db_port", "value": "5433", "by": "user"}]
    assert row["cache_miss_tokens"] == 0  # an empty session: nothing cached after the system prompt yet
    again = Session("k", store=store_dir, llm=FakeLLM())
    assert again.knowledge.text() == s.knowledge.text()


def test_the_slot_is_byte_stable_between_writes_and_a_write_costs_what_follows_it(store_dir):
    s = Session("kb", store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY), show_budget=False)
    s.pin({"a": "1", "b": "two words"})
    for i in range(3):
        s.chat(f"turn {i}")
    before = s.send_view().messages
    s.chat("one more")
    after = s.send_view().messages
    assert _slot(before) == _slot(after)
    assert shared_prefix_tokens(before, after, s.token_counts(s.send_view()).__getitem__) > 0
    size = s.send_view().tokens
    s.pin("a", "3")  # in place: "b" keeps its line after it
    text = s.knowledge.text()
    assert text.index("- a: 3") < text.index("- b: two words")
    row = [r for r in s.ledger() if r["kind"] == "knowledge"][-1]
    system = s.send_view().layers[0].tokens
    assert 0 < row["cache_miss_tokens"] <= size - system + 1
    s.pin("a", "3")  # the same value again: nothing changes in the payload, no miss
    assert [r for r in s.ledger() if r["kind"] == "knowledge"][-1]["cache_miss_tokens"] == 0


def test_the_model_remembers_and_forgets_through_its_tools(store_dir):
    llm = FakeLLM(script=[tool_call("remember", {"key": "target_metric", "value": "p95 < 200 ms"}), "kept",
                          tool_call("forget", {"key": "target_metric"}, "call_2"), "dropped"])
    s = Session("km", store=store_dir, llm=llm, show_budget=False)
    names = [t["function"]["name"] for t in s._tool_schemas()]
    assert "remember" in names and "forget" in names
    s.chat("keep the target: p95 under 200 ms")
    assert "- target_metric (saved by you): p95 < 200 ms" in llm.received[-1][1]["content"]
    assert "remembered target_metric" in s.events[2].content
    s.chat("that target no longer holds")
    assert s.knowledge.text() is None and not _slot(llm.received[-1])
    rows = [r for r in s.ledger() if r["kind"] == "knowledge"]
    assert [r["by"] for r in rows] == ["model", "model"] and rows[-1]["removed"] == ["target_metric"]
    s.configure(knowledge_share=0)
    assert "remember" not in [t["function"]["name"] for t in s._tool_schemas()]


def test_a_full_slot_lets_the_oldest_written_entries_go_with_a_notice(store_dir):
    s = Session("kf", store=store_dir, window_tokens=8000, llm=FakeLLM(), knowledge_share=0.02)
    budget = s.knowledge_budget()
    for i in range(6):
        s.pin(f"k{i}", f"value number {i} " * 4)
    assert s.knowledge.tokens() <= budget
    oldest = next(iter(s.knowledge.entries))
    notices = s.pin("fresh", "the newest value " * 4)
    assert any("knowledge slot full" in n for n in notices)
    assert "fresh" in s.knowledge.entries and oldest not in s.knowledge.entries
    row = [r for r in s.ledger() if r["kind"] == "knowledge"][-1]
    assert row["evicted"] and row["evicted"][0] == oldest
    assert Session("kf", store=store_dir, llm=FakeLLM()).knowledge.entries.keys() == s.knowledge.entries.keys()


@pytest.mark.parametrize("key, value, words", [
    ("x" * 65, "1", "is invalid"),
    ("", "1", "is invalid"),
    ("a=b", "1", "is invalid"),
    ("bin", b"\x00\x01", "binary"),
    ("ctl", "abc\x00def", "control characters"),
    ("big", "word " * 100_000, "tokens"),
    ("empty", "  ", "empty"),
    ("key", "sk-abcdefghijklmnopqrstuvwx", "API key"),
])
def test_bad_values_are_refused_with_one_line_and_change_nothing(store_dir, key, value, words):
    s = Session("kx", store=store_dir, llm=FakeLLM())
    s.pin("keep", "me")
    rows = len(s.ledger())
    with pytest.raises(InputError, match=words) as err:
        s.pin(key, value)
    assert "\n" not in str(err.value)
    assert list(s.knowledge.entries) == ["keep"] and len(s.ledger()) == rows
    s.chat("still usable")


def test_ten_thousand_keys_at_once_and_unpin_of_a_missing_key(store_dir):
    s = Session("kk", store=store_dir, llm=FakeLLM())
    with pytest.raises(InputError, match="at most 200"):
        s.pin({f"k{i}": "v" for i in range(10_000)})
    with pytest.raises(InputError, match="no key 'nope'"):
        s.unpin("nope")
    assert s.knowledge.text() is None


def test_the_budget_note_is_at_the_tail_only_and_leaves_the_cached_prefix_alone(store_dir):
    llm = FakeLLM(default=REPLY)
    s = Session("bn", store=store_dir, window_tokens=32000, llm=llm)
    s.pin("owner", "team-data")
    for i in range(4):
        s.chat(f"question {i} about the staging cluster")
    last = llm.received[-1][-1]["content"]
    assert last.startswith("question 3") and last.endswith("compaction at 90%]")
    assert "[context " in last and "% of the usable window" in last
    assert all("[context " not in m["content"] for m in llm.received[-1][:-1])
    assert all("[context " not in e.content for e in s.events)  # never in the log
    # each request's bytes before its note are a prefix of the next request
    for prev, cur in zip(llm.received, llm.received[1:]):
        head = prev[:-1] + [{**prev[-1], "content": prev[-1]["content"].rsplit("\n\n[context ", 1)[0]}]
        assert cur[:len(head)] == head
    s.configure(show_budget=False)
    s.chat("and now?")
    assert llm.received[-1][-1]["content"] == "and now?"


def test_pin_and_unpin_through_the_magics(ip, capsys):
    ip.run_line_magic("mfs", "pin db=orders_v2 'region=eu west 1'")
    out = capsys.readouterr().out
    assert "pinned db, region" in out
    ip.run_line_magic("mfs", "pin")
    assert "region = 'eu west 1'" in capsys.readouterr().out
    ip.run_line_magic("mfs", "pin novalue")
    assert "expected key=value" in capsys.readouterr().err
    ip.run_line_magic("mfs", "unpin db")
    assert "removed db" in capsys.readouterr().out
    ip.run_line_magic("context", "")
    assert "knowledge slot" in capsys.readouterr().out
    ip.run_cell_magic("chat", "", "hello")
    session = ip.magics_manager.registry["MfsMagics"].get_session()
    assert list(session.knowledge.entries) == ["region"]


def test_pin_keeps_backslashes_and_braces_as_typed_and_refuses_undecodable_text(ip, store_dir):
    s = Session("ku", store=store_dir, llm=FakeLLM())
    with pytest.raises(InputError, match="not valid text"):
        s.pin("v", "ok\udcff")
    s.pin("crlf", "a\r\nb")
    assert s.knowledge.entries["crlf"].value == "a\nb"
    ip.user_ns["n"] = 7
    ip.run_cell(r"%mfs pin data_dir=C:\Users\ana\data pattern=\d+\.csv fmt={n} 'home=$HOME/x' chan=#ops")
    entries = ip.magics_manager.registry["MfsMagics"].get_session().knowledge.entries
    assert {k: e.value for k, e in entries.items()} == {
        "data_dir": r"C:\Users\ana\data", "pattern": r"\d+\.csv", "fmt": "{n}", "home": "$HOME/x",
        "chan": "#ops"}


def test_the_latest_write_of_a_key_wins_across_kernels(store_dir):
    a = Session("kk2", store=store_dir, llm=FakeLLM())
    for key in ("p", "q", "r"):
        a.pin(key, "1")
    a.pin("port", "5432")
    b = Session("kk2", store=store_dir, llm=FakeLLM())  # another kernel: its own ledger numbering
    b.pin("port", "6543")
    assert Session("kk2", store=store_dir, llm=FakeLLM()).knowledge.entries["port"].value == "6543"
