"""Issue 13 units: summaries validated before commit, the breaker saved and half-open, settings
checked before saving, tool-call arguments bounded, the lease protocol."""

from __future__ import annotations

import time

import pytest
from conftest import FakeLLM, tool_call

from mfs_nb import ConfigError, LLMError, Session
from mfs_nb.compaction.lease import Lease, live_claims
from mfs_nb.compaction.summary_check import validate_summary
from mfs_nb.events import Event
from mfs_nb.store import Store


def _events(texts: list[str]) -> list[Event]:
    return [Event(uid=i + 1, session="x", turn=i // 2 + 1, role="user" if i % 2 == 0 else "assistant", content=t)
            for i, t in enumerate(texts)]


RANGE = _events(["We should keep the replica pool under thirty connections for the billing service. " * 8,
                 "Agreed: billing replicas stay under thirty, and deploy/pool.yaml holds the limit. " * 8,
                 "也要检查缓存的过期时间，订单服务的缓存是五分钟。" * 6])


@pytest.mark.parametrize("text,why", [
    ("", "empty"),
    ("   \n ", "empty"),
    ("I'm unable to summarize this conversation.", "refusal"),
    ("I'm sorry, but I can't help with summarizing that billing discussion about replicas.", "refusal"),
    ("抱歉，我无法总结这段对话。", "refusal"),
    ("Lo siento, no puedo resumir esta conversación sobre billing.", "refusal"),
    ("Sure! Here is the summary you asked for:", "preamble"),
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, billing replicas pool.", "filler"),
    ("- The weather in Paris was lovely and the museums were crowded all week long.", "content"),
    ("- billing replica pool " + "x" * 500_000, "shorter"),
])
def test_unusable_summaries_are_rejected(text, why):
    prose, reason = validate_summary(text, RANGE, target=400)
    assert prose is None, (text[:60], reason)
    assert {"empty": "empty", "refusal": "refusal", "preamble": "preamble", "filler": "filler",
            "content": "content", "shorter": "shorter"}[why] in reason


def test_usable_summaries_pass_and_long_ones_are_cut_with_a_note():
    good = "- Billing replica pool stays under thirty connections; the limit lives in deploy/pool.yaml."
    assert validate_summary(good, RANGE, 400) == (good, "")
    prose, note = validate_summary("Sure, here is the summary:\n" + good, RANGE, 400)
    assert prose == good  # the preamble line is dropped, the summary kept
    assert validate_summary("- 订单服务的缓存过期时间是五分钟，需要检查。", RANGE, 400)[0]
    long = "\n".join(f"- billing replica pool note {i}: stays under thirty" for i in range(25))
    prose, note = validate_summary(long, RANGE, 50)
    assert prose is not None and "cut at about 100 tokens" in note and prose.endswith(f"[{note}]")
    assert len(prose) < len(long)


def test_a_rejected_summary_counts_as_a_failure_and_the_range_stays_covered(store_dir):
    fake = FakeLLM(summary_text="I'm unable to summarize this conversation.",
                   default="Here is what that means for the billing replicas, step by step. " * 12)
    s = Session("rej", store=store_dir, window_tokens=32000, llm=fake)
    for i in range(6):
        s.chat(f"turn {i}: billing replicas stay under {20 + i} connections")
    s.compact()
    assert s.compactor.segments[-1].degraded and "unable" not in s.compactor.segments[-1].prose
    assert s.compactor.failures == 1
    assert any(r["kind"] == "summary_rejected" for r in s.ledger())
    assert s.coverage()["lost"] == 0


def test_breaker_is_saved_goes_half_open_on_compact_and_closes_on_success(store_dir):
    fake = FakeLLM(summary_text=LLMError("primary endpoint failed: HTTP 503"))
    s = Session("brk", store=store_dir, window_tokens=32000, llm=fake)
    i = 0
    while not s.compactor.breaker_open:
        s.chat(f"turn {i}: the cache for index {i} expires after {i} minutes")
        s.compact()
        i += 1
        assert i < 10
    again = Session("brk", store=store_dir, window_tokens=32000, llm=fake)  # a restart keeps it open
    assert again.compactor.breaker_open and "open" in again.status()["breaker"]
    asked = len(fake.summaries)
    again.chat("one more turn about the cache for index 99")
    again.compact()  # the user's %compact tries the model once (half-open) …
    assert len(fake.summaries) == asked + 1 and again.compactor.breaker_open  # … it failed: still open
    fake.summary_text = None  # the model is fixed
    again.chat("and another turn about the cache for index 100")
    again.compact()
    assert not again.compactor.breaker_open and again.compactor.failures == 0
    assert any(r["kind"] == "breaker_closed" for r in again.ledger())
    assert not Session("brk", store=store_dir, window_tokens=32000, llm=fake).compactor.breaker_open


def test_breaker_lets_one_automatic_try_through_after_the_cool_down(store_dir, monkeypatch):
    fake = FakeLLM(summary_text=LLMError("down"))
    s = Session("cool", store=store_dir, window_tokens=32000, llm=fake)
    s.compactor.breaker.open, s.compactor.breaker.opened_at = True, time.time()
    assert s.compactor.summarize(s.events or [s.record("user", "x")], 8000)[0] is None
    assert len(fake.summaries) == 0  # open and cooling down: the model is not asked
    monkeypatch.setattr("mfs_nb.compaction.limits.BREAKER_COOLDOWN_S", 0.0)
    s.compactor.summarize(s.events, 8000)
    assert len(fake.summaries) == 1


def test_settings_that_fail_the_window_check_are_never_saved(store_dir):
    with pytest.raises(ConfigError, match="too small"):
        Session("tiny", store=store_dir, window_tokens=1024, system_prompt="x " * 4000, llm=FakeLLM())
    assert Store(store_dir).load_meta("tiny") == {}
    Session("tiny", store=store_dir, llm=FakeLLM())  # the session still opens
    for bad in ("inf", "nan", "-inf", "1e400"):
        with pytest.raises(ConfigError):
            Session("tiny", store=store_dir, llm=FakeLLM()).configure(window_tokens=bad)
        with pytest.raises(ConfigError):
            Session("tiny", store=store_dir, llm=FakeLLM()).configure(timeout_s=bad)


def test_deeply_nested_tool_arguments_still_get_a_result(store_dir):
    deep = "[" * 100_000 + "]" * 100_000
    fake = FakeLLM(script=[tool_call("recall_history", deep, "c1"), tool_call("recall_history", "x" * 300_000, "c2"),
                           "done"])
    s = Session("tools", store=store_dir, window_tokens=200_000, llm=fake)
    reply = s.chat("look something up")
    assert reply.text == "done"
    results = [e for e in s.events if e.role == "tool"]
    assert [e.tool_call_id for e in results] == ["c1", "c2"]
    assert "nested more than" in results[0].content and "chars, more than" in results[1].content


def test_lease_excludes_a_second_holder_and_expires(store_dir, monkeypatch):
    monkeypatch.setenv("MFS_LEASE_TTL_S", "1")
    store = Store(store_dir)
    a, b = Lease(store, "s", "kernel-a"), Lease(store, "s", "kernel-b")
    assert a.try_acquire() and not b.try_acquire()
    a.release()
    assert b.try_acquire() and b.valid()
    b._stop.set()  # kernel b "dies": nobody renews its lease
    b.claim = None
    time.sleep(1.2)
    assert a.acquire(wait_s=2) and a.valid()
    a.release()
    rows = [{"claim": "x", "kind": "claim", "owner": "o", "expires": 10.0},
            {"claim": "y", "kind": "claim", "owner": "p", "expires": 10.0},
            {"claim": "y", "kind": "release", "owner": "p", "expires": 0.0}]
    assert set(live_claims(rows, 5.0)) == {"x"} and live_claims(rows, 11.0) == {}
