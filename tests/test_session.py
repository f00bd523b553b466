"""Session: append-only log, resume, recall, send view, tool loop, bad input."""

from __future__ import annotations

import json

import pytest
from conftest import FakeLLM, tool_call, without_budget_note

from mfs_nb import ConfigError, InputError, LLMError, Session
from mfs_nb.session import flush_at_exit


def test_fifty_turns_then_resume_is_byte_identical(store_dir):
    s = Session("long", store=store_dir, llm=FakeLLM(default="reply ✓ 数字 120"))
    sent = [f"turn {i}: pool_size={i % 30}, path /srv/app/{i}.yaml, 费用 {i}元" for i in range(50)]
    for text in sent:
        s.chat(text)
    before = s.recall(1, s.last_uid)
    assert len(before) == 100 and [e.uid for e in before] == list(range(1, 101))

    again = Session("long", store=store_dir, llm=FakeLLM())
    after = again.recall(1, again.last_uid)
    assert [(e.uid, e.turn, e.role, e.content, e.sha256, e.created_at) for e in after] == \
           [(e.uid, e.turn, e.role, e.content, e.sha256, e.created_at) for e in before]
    assert [e.content for e in after if e.role == "user"] == sent
    reply = again.chat("one more")
    assert reply.uids == [101, 102]
    assert again.turn == 51
    assert [e.uid for e in Session("long", store=store_dir).events] == list(range(1, 103))


def test_send_view_is_system_then_every_event(store_dir):
    fake = FakeLLM(script=["first answer", "second answer"])
    s = Session("v", store=store_dir, llm=fake)
    s.chat("hello")
    s.chat("again")
    view = s.send_view()
    assert view.messages[0]["role"] == "system"
    assert [m["content"] for m in view.messages[1:]] == ["hello", "first answer", "again", "second answer"]
    assert [(la.kind, la.uid_from, la.uid_to) for la in view.layers] == [("system", None, None), ("raw", 1, 4)]
    assert view.tokens == sum(la.tokens for la in view.layers) > 0
    # what the model received on the second call is exactly the view at that moment
    assert without_budget_note(fake.received[1]) == view.messages[:-1]
    assert fake.received[1][-1]["content"].startswith("again\n\n[context ")  # show_budget: the note at the tail


def test_usage_is_one_object_for_meter_and_tier(store_dir):
    s = Session("u", store=store_dir, window_tokens=2048, llm=FakeLLM())
    u = s.usage()
    assert u.window == 2048 and u.effective < 2048 and u.tier == "ok" and u.source == "estimate"
    assert u.status_line().startswith("ctx ") and "session u" in u.status_line()


def test_anchor_from_provider_usage_and_restart(store_dir):
    fake = FakeLLM(prompt_tokens=500)
    s = Session("a", store=store_dir, llm=fake)
    s.chat("hi there")
    u = s.usage()
    assert u.source == "anchor+estimate" and u.tokens > 500
    resumed = Session("a", store=store_dir, llm=FakeLLM())
    assert resumed.usage().tokens == u.tokens and resumed.usage().source == "anchor+estimate"


def test_tool_loop_runs_recall_and_pairs_results(store_dir):
    fake = FakeLLM(script=["noted", tool_call("recall_history", {"uid_from": 1, "uid_to": 1}), "it said 120"])
    s = Session("t", store=store_dir, llm=fake)
    s.chat("Our DB allows 120 connections")
    reply = s.chat("what did I say first?")
    assert reply.text == "it said 120"
    roles = [e.role for e in s.events]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    tool_event = s.events[4]
    assert "Our DB allows 120 connections" in tool_event.content and tool_event.tool_call_id == "call_1"
    last_payload = fake.received[-1]
    assert last_payload[-2]["tool_calls"][0]["id"] == "call_1"
    assert last_payload[-1]["role"] == "tool" and last_payload[-1]["tool_call_id"] == "call_1"
    assert fake.tools_seen[0][0]["function"]["name"] == "recall_history"


@pytest.mark.parametrize("args, needle", [
    ({"uid_from": 5, "uid_to": 2}, "reversed"),
    ({"uid_from": 900}, "no events in 900-900"),
    ({"uid_from": "abc"}, "whole number"),
    ({"uid_from": 1, "uid_to": 100000}, "more than"),
    ({"wrong": 1}, "bad arguments"),
])
def test_recall_tool_bad_ranges_get_bounded_answers(store_dir, args, needle):
    fake = FakeLLM(script=["a", tool_call("recall_history", args), "done"])
    s = Session("r", store=store_dir, llm=fake, recall_max_events=3)
    s.chat("x")
    s.chat("y")
    result = [e for e in s.events if e.role == "tool"][0].content
    assert result.startswith("error:") and needle in result and len(result) < 300


def test_recall_api_errors_are_input_errors(store_dir):
    s = Session("r2", store=store_dir, llm=FakeLLM())
    with pytest.raises(InputError, match="no events yet"):
        s.recall(1, 2)
    s.chat("x")
    assert [e.uid for e in s.recall("1", "2")] == [1, 2]
    assert [e.uid for e in s.recall(0, 99)] == [1, 2]  # clipped to what exists
    with pytest.raises(InputError, match="reversed"):
        s.recall(2, 1)


@pytest.mark.parametrize("bad, needle", [
    ("", "empty"),
    ("   \n\t", "empty"),
    ("x" * 5_000_000, "tokens"),
    ("word " * 1_000_000, "tokens"),
    (b"\xff\xfe\x00bad", "not UTF-8"),
    ("bin\x00ary", "NUL"),
    (12, "must be text"),
], ids=["empty", "blank", "5MB-run", "5MB-words", "undecodable", "nul", "not-text"])
def test_bad_input_is_one_line_and_loses_nothing(store_dir, bad, needle):
    s = Session("b", store=store_dir, llm=FakeLLM())
    s.chat("before")
    with pytest.raises(InputError, match=needle) as info:
        s.chat(bad)
    assert "\n" not in str(info.value)
    assert len(s.events) == 2
    s.chat("after")
    assert [e.content for e in s.events if e.role == "user"] == ["before", "after"]


def test_lone_surrogates_are_refused_like_undecodable_bytes(store_dir):
    s = Session("sur", store=store_dir, llm=FakeLLM())
    raw = b"bad \xff\xfe\xfd char"
    for bad in (raw, raw.decode("utf-8", "surrogateescape")):
        with pytest.raises(InputError, match="not .*(UTF-8|valid text)") as info:
            s.chat(bad)
        assert "\n" not in str(info.value)
    assert "3 undecodable characters, the first at position 4" in str(info.value)
    assert s.events == []
    s.record("tool", "tool output \udcff\udcfe end")  # not typed by the user: one U+FFFD per bad byte
    assert Session("sur", store=store_dir).events[0].content == "tool output \ufffd\ufffd end"


def test_llm_failure_keeps_the_message_and_session_usable(store_dir):
    fake = FakeLLM(script=[LLMError("primary endpoint failed: HTTP 503")])
    s = Session("f", store=store_dir, llm=fake)
    with pytest.raises(LLMError):
        s.chat("please answer")
    assert [e.role for e in s.events] == ["user"]
    assert s.ledger()[-1]["kind"] == "failure"
    s.chat("try again")
    assert [e.content for e in s.events if e.role == "user"] == ["please answer", "try again"]


def test_a_failed_turn_asked_again_is_sent_once_and_kept_marked(store_dir):
    """Issue 71, item 2: the retry of the same text right after a failure takes the failed turn's place in
    what the model is sent; the log keeps both, the first marked; another question after a failure does not."""
    from mfs_nb.ui.data import recall_text

    fake = FakeLLM(script=["the pool has 12 workers", LLMError("primary endpoint failed: HTTP 503"), "it is 32"])
    s = Session("retry", store=store_dir, llm=fake)
    s.chat("how many workers?")
    with pytest.raises(LLMError):
        s.chat("what is pool_size?")
    s.chat("what is pool_size?")
    sent = [m["content"] for m in without_budget_note(fake.received[-1])[1:]]
    assert sent == ["how many workers?", "the pool has 12 workers", "what is pool_size?"]
    assert [(e.uid, e.role, e.content) for e in s.events[2:]] == [
        (3, "user", "what is pool_size?"), (4, "user", "what is pool_size?"), (5, "assistant", "it is 32")]
    assert s.retried() == {3: 4}
    assert "[#3 user · turn 2 · failed, asked again as #4]" in recall_text(s.recall(3, 4), s.retried())
    assert "[#4 user · turn 3]" in recall_text(s.recall(3, 4), s.retried())
    assert "failed, asked again as #4" in s._recall_tool(3)  # the model's own recall says so too
    assert s.coverage()["lost"] == 0 and s.coverage()["asked_again"] == 1
    # a restart reads the same from the log alone
    again = Session("retry", store=store_dir, llm=FakeLLM())
    assert [m["content"] for m in again.send_view().messages[1:]] == sent + ["it is 32"]

    # a failure inside a tool round: the whole unanswered turn gives way; a cell record in between stays
    fake.script = [tool_call("recall_history", {"uid_from": 1}), LLMError("timeout"), "done"]
    with pytest.raises(LLMError):
        s.chat("check uid 1")
    s.record("tool", "[notebook] In [3]: x = 1", name="notebook")
    s.chat("check uid 1")
    sent = [m.get("content") for m in without_budget_note(fake.received[-1])]
    assert sent.count("check uid 1") == 1 and not any(m.get("tool_calls") for m in fake.received[-1])
    assert any("x = 1" in (c or "") for c in sent)

    # another question after a failure: the failed one stays, nothing is left out
    fake.script = [LLMError("HTTP 500"), "fine"]
    with pytest.raises(LLMError):
        s.chat("first question")
    s.chat("a different question")
    sent = [m.get("content") for m in without_budget_note(fake.received[-1])]
    assert "first question" in sent and sent[-1] == "a different question"


def test_invalid_config_keeps_old_value_and_is_not_saved(store_dir):
    s = Session("c", store=store_dir, llm=FakeLLM())
    s.configure(window_tokens="32k")
    assert s.window == 32_000
    for bad in ({"window_tokens": "lots"}, {"window_tokens": 10}, {"max_tool_rounds": 0},
                {"api_base": "ftp://x"}, {"nonsense": 1}, {"fallback_model": "openai/x"}):
        with pytest.raises(ConfigError):
            s.configure(**bad)
        assert s.window == 32_000
    assert Session("c", store=store_dir).window == 32_000


def test_window_too_small_for_fixed_overhead_is_a_clear_error(store_dir):
    with pytest.raises(ConfigError, match="too small"):
        Session("w", store=store_dir, window_tokens=1024, system_prompt="rule " * 2000)


def test_api_keys_never_reach_the_store(store_dir, monkeypatch):
    secret = "sk-test-DO-NOT-STORE-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("MFS_FALLBACK_API_KEY", secret + "-fb")
    with pytest.raises(ConfigError, match="never saved"):
        Session("k", store=store_dir, llm=FakeLLM()).configure(api_key=secret)
    fake = FakeLLM(script=[LLMError(f"provider said: bad key {secret}"), "fine"])
    s = Session("k", store=store_dir, llm=fake)
    s.configure(fallback_model="openai/backup", fallback_base_url="http://127.0.0.1:9/v1")
    with pytest.raises(LLMError):
        s.chat(f"my key is not {secret[:6]}")
    s.chat("ok")
    import pathlib
    blob = b"".join(p.read_bytes() for p in pathlib.Path(store_dir).rglob("*") if p.is_file())
    assert secret.encode() not in blob


def test_invalid_session_names(store_dir):
    for bad in ("", "../x", "a b", "x" * 65):
        with pytest.raises(ConfigError):
            Session(bad, store=store_dir)


def test_two_writers_on_one_session_never_lose_or_duplicate(store_dir):
    a = Session("shared", store=store_dir, llm=FakeLLM(default="from a"))
    b = Session("shared", store=store_dir, llm=FakeLLM(default="from b"))
    a.chat("a1")
    b.chat("b1")  # b's in-memory log is stale: its first uid collides and must be re-taken
    a.chat("a2")
    events = Session("shared", store=store_dir).events
    assert [e.uid for e in events] == list(range(1, len(events) + 1))
    assert sorted(e.content for e in events if e.role == "user") == ["a1", "a2", "b1"]


def test_meter_and_trigger_read_one_value(store_dir):
    from mfs_nb.ui.data import status_data

    s = Session("one", store=store_dir, window_tokens=4096, llm=FakeLLM(default="short answer"))
    i = 0
    while s.usage().tokens < 0.45 * s.usage().effective:
        s.chat(f"message {i}: " + "the pool has 120 connections " * 10)
        i += 1
    plan = s.prepare_call()
    meter = status_data(plan.usage)
    assert plan.usage.tier == "ok" and meter["tier"] == "ok" and plan.notices == []
    # earlier thresholds: the same number now crosses them (automatic compaction off: a lowered warn line
    # lowers the planned fill too, so it would compact now and the number would change)
    s.configure(warn_at=0.3, hard_at=0.35, auto_compaction=False)
    plan2 = s.prepare_call()
    meter2 = status_data(plan2.usage)
    assert plan2.usage.tokens == plan.usage.tokens and meter2["ratio"] == meter["ratio"]
    assert plan2.usage.tier == meter2["tier"] != "ok"
    assert plan2.usage.label in meter2["line"] and plan2.notices and f"({plan2.usage.label})" in plan2.notices[0]
    assert plan2.usage.tier not in meter2["line"] + plan2.notices[0]  # the internal name is not shown
    assert s.ledger()[-1]["kind"] == "tier"
    with pytest.raises(ConfigError, match="only move earlier"):
        s.configure(warn_at=0.9)


def test_calibration_moves_k_and_notes_a_persistent_deviation_once(store_dir):
    from mfs_nb.models.llm import Completion

    s = Session("cal", store=store_dir, llm=FakeLLM())
    real = {"n": 0}

    def priced(messages):  # a provider whose tokenizer counts 1.5x our estimate
        from mfs_nb.window.tokens import message_tokens
        real["n"] = round(1.5 * sum(message_tokens(m) for m in messages))
        return Completion("answer " * 20, [], {"prompt_tokens": real["n"], "completion_tokens": 5}, "primary", "f")

    s._llm = FakeLLM(script=[priced] * 8)
    notes = []
    for i in range(8):
        notes += s.chat(f"turn {i} " + "words and numbers 42 " * 20).notices
    assert 1.35 < s._meter.k <= 1.5
    assert sum("estimates differ" in n for n in notes) == 1
    assert [r["kind"] for r in s.ledger()].count("calibration") == 1
    u = s.usage()
    assert u.source == "anchor+estimate"
    assert Session("cal", store=store_dir)._meter.k == s._meter.k


def test_the_saved_state_is_a_small_row_written_only_when_it_changes(store_dir):
    """Issue 19 (fast, small writes): the per-call history is appended to its own table in batches,
    not rewritten inside the session's state every turn; an unchanged state is not written again."""
    s = Session("small", store=store_dir, llm=FakeLLM())
    s.chat("first")
    version = s.store._sessions.version
    s._save_meta()  # the state has not changed since the turn saved it
    assert s.store._sessions.version == version
    s.chat("second")  # a turn moves the uid high-water mark: one small write
    assert s.store._sessions.version == version + 1
    priced = Session("priced", store=store_dir, llm=FakeLLM(prompt_tokens=500))
    for i in range(45):
        priced.chat(f"turn {i}")
    meta = priced.store.load_meta("priced")
    assert "history" not in meta["anchor"] and len(json.dumps(meta)) < 2_000
    assert len(Session("priced", store=store_dir, llm=FakeLLM()).history) == 40  # two batches of 20 so far
    store = priced.store
    flush_at_exit()  # what the interpreter's exit runs: the 5 rows still waiting are written
    again = Session("priced", store=store_dir, llm=FakeLLM())
    assert [h["call"] for h in again.history] == list(range(1, 46))
    # a store written before the calls table kept the history in the state row: it moves, once
    old = {**meta["anchor"], "last_uid": 0, "history": [{"call": i, "turn": i, "tokens": 10 * i, "tier": "ok", "acted": False}
                                         for i in range(1, 6)]}
    store.save_meta("legacy", settings={}, anchor=old)
    legacy = Session("legacy", store=store_dir, llm=FakeLLM())
    legacy.chat("after the upgrade")
    flush_at_exit()
    assert [h["call"] for h in Session("legacy", store=store_dir, llm=FakeLLM()).history] == [1, 2, 3, 4, 5, 6]
