"""Prompt caching that providers honour (issue 42): cache breakpoints for Anthropic-style models, a
prompt_cache_key for OpenAI, real cache reads and writes from the usage, and one retry without the
hints where an endpoint refuses them. Every request goes to a fake endpoint of its kind on 127.0.0.1."""

from __future__ import annotations

import json
import re

import pytest
from fake_provider import FakeProvider

from mfs_nb import Session
from mfs_nb.models.prompt_cache import CacheHints, choose, family, mark

CLAUDE = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def claude(monkeypatch):
    provider = FakeProvider(reply="noted, the pool stays under 30")
    monkeypatch.setenv("ANTHROPIC_API_BASE", provider.url.removesuffix("/v1"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    yield provider
    provider.close()


def _marked(body: dict) -> list[tuple[str, str]]:
    """(where, text) of every block a request marks, in request order."""
    out = []
    for tool in body.get("tools") or []:
        if "cache_control" in tool:
            out.append(("tool", tool.get("name", "")))
    system = body.get("system")
    for block in system if isinstance(system, list) else []:
        if "cache_control" in block:
            out.append(("system", block["text"]))
    for i, message in enumerate(body.get("messages") or []):
        for block in message["content"] if isinstance(message["content"], list) else []:
            if "cache_control" in block:
                out.append((f"message {i}", block.get("text") or block.get("type")))
    return out


def _prefix(body: dict, upto_text: str) -> str:
    """The request serialised up to and including the block whose text is `upto_text`."""
    whole = json.dumps([body.get("tools"), body.get("system"), body.get("messages")], sort_keys=True)
    whole = whole.replace('"cache_control": {"type": "ephemeral"}, ', "")  # a mark is not part of what is cached
    end = whole.index(json.dumps(upto_text)[1:-1]) + len(json.dumps(upto_text)) - 2
    return whole[:end]


def test_the_model_families_that_get_marks():
    assert family(CLAUDE) == family("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0") == "anthropic"
    assert family("vertex_ai/claude-3-5-sonnet@20240620") == family("claude-3-haiku-20240307") == "anthropic"
    assert family("vertex_ai/gemini-1.5-pro") == family("ollama/llama3") == family("mfs-offline/default") == ""
    assert family("openai/gpt-4o-mini") == family("gpt-4o") == "openai"


def test_at_most_four_marks_and_the_previous_anchor_only_when_out_of_reach():
    far = CacheHints(standing=1, history=5, anchor=60, previous=30)
    marks, tools = choose(far, has_tools=True)
    assert marks == [1, 5, 30, 60] and not tools  # four in all: the tool schemas give way
    near = CacheHints(standing=1, history=5, anchor=12, previous=10)
    assert choose(near, has_tools=True) == ([1, 5, 12], True)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                                     "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "result\n\n[note]"}]
    out, _, placed = mark(messages, None, CacheHints(standing=0, history=2, anchor=3, note="\n\n[note]"))
    assert placed == 2 and out[2] == messages[2]  # an assistant turn carries no mark
    assert out[3]["content"] == [{"type": "text", "text": "result", "cache_control": {"type": "ephemeral"}},
                                 {"type": "text", "text": "\n\n[note]"}]
    assert messages[3]["content"] == "result\n\n[note]"  # the caller's list is untouched


def test_claude_requests_carry_breakpoints_where_the_layers_are_stable(claude, tmp_path):
    s = Session("claude", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000)
    s.pin("db_limit", "120")
    for text in ("Keep the pool under 30.", "The DB allows 120 connections.", "What did I say about the pool?"):
        s.chat(text, stream=False)
    bodies = [h["body"] for h in claude.hits if h["path"].endswith("/messages")]
    assert len(bodies) == 3
    for body, text in zip(bodies, ("Keep the pool under 30.", "The DB allows 120 connections.",
                                   "What did I say about the pool?")):
        marked = _marked(body)
        assert 2 <= len(marked) <= 4, marked
        # the newest message is the rolling anchor: its own words marked, the budget note a block after it
        assert marked[-1][1] == text
        last = body["messages"][-1]["content"]
        assert last[-1]["text"].lstrip().startswith("[context") and "cache_control" not in last[-1]
        # the standing prefix (system prompt and knowledge slot) ends in a mark
        assert any("db_limit" in t for _, t in marked), marked
        # with no segment yet: the tool schemas, the knowledge slot and the newest message
        assert [w for w, _ in marked][0] == "tool" and len(marked) == 3, marked
    # what the second call marked as its anchor is repeated byte for byte by the third, so it is read
    first_anchor = _marked(bodies[1])[-1][1]
    assert _prefix(bodies[1], first_anchor) == _prefix(bodies[2], first_anchor)
    assert s.history[-1]["cache_read"] > 0 and s.history[-1]["cache_write"] > 0, s.history[-1]
    assert "cache" in s.usage().status_line()


def test_cache_reads_and_writes_reach_the_status_line_and_the_call_history(claude, tmp_path):
    s = Session("claude", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000)
    replies = [s.chat(f"turn {i}: the pool stays under {20 + i}", stream=False) for i in range(4)]
    first, last = s.history[0], s.history[-1]
    assert first["cache_read"] == 0 and first["cache_write"] > 0  # nothing cached yet: all written
    assert last["cache_read"] > last["cache_write"]  # an ordinary call reads what the last one wrote
    line = replies[-1].usage.status_line()
    assert "cache" in line and "written" in line, line
    s.close()  # writes the waiting call rows
    again = Session("claude", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000)
    assert again.history[-1]["cache_read"] == last["cache_read"]  # kept with the call rows
    # the payload chart of %mfs ledger: the provider's own figures in its summary and each column
    from mfs_nb.ui.data import ledger_data
    from mfs_nb.ui.html import ledger_html

    history = again.history * 3  # the chart is drawn from 10 calls on
    page = ledger_html(ledger_data(again.ledger(), history, again.usage().effective))
    read = sum(r["cache_read"] for r in history) / sum(r["prompt_tokens"] for r in history)
    assert f"provider cache: {read:.1%} of input read" in page and "read from the provider's cache" in page
    assert f"{last['cache_read'] / last['prompt_tokens']:.0%} read from the provider's cache" in page
    plain = ledger_html(ledger_data([], [{"call": i, "tokens": 100} for i in range(12)], 1000))
    assert "provider cache" not in plain and "linear-gradient" not in plain  # nothing reported, nothing claimed


def test_a_setting_turns_the_marks_off(claude, tmp_path):
    s = Session("plain", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000, prompt_cache=False)
    s.chat("Keep the pool under 30.", stream=False)
    assert "cache_control" not in json.dumps(claude.hits[-1]["body"])


def test_an_endpoint_that_refuses_the_marks_gets_one_retry_without_them_and_none_after(claude, tmp_path):
    claude.mode = "nocache"
    s = Session("strict", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000)
    reply = s.chat("Keep the pool under 30.", stream=False)
    assert reply.text == "noted, the pool stays under 30"
    assert any("cache" in n and "without" in n for n in reply.notices), reply.notices
    second = s.chat("And the DB allows 120.", stream=False)
    assert not any("cache" in n and "without" in n for n in second.notices)  # said once
    bodies = [h["body"] for h in claude.hits]
    assert len(bodies) == 3 and "cache_control" in json.dumps(bodies[0])
    assert "cache_control" not in json.dumps(bodies[1]) + json.dumps(bodies[2])


def test_openai_gets_one_prompt_cache_key_per_session_and_nothing_else(monkeypatch, tmp_path):
    provider = FakeProvider(reply="ok")
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
        a = Session("a", store=str(tmp_path / "s"), model="openai/gpt-4o-mini", window_tokens=128_000)
        b = Session("b", store=str(tmp_path / "s"), model="openai/gpt-4o-mini", window_tokens=128_000)
        a.chat("one", stream=False)
        a.chat("two", stream=False)
        b.chat("three", stream=False)
        keys = [h["body"].get("prompt_cache_key") for h in provider.hits]
        assert keys[0] and keys[0] == keys[1] and keys[2] and keys[2] != keys[0]
        assert "cache_control" not in json.dumps([h["body"] for h in provider.hits])
        assert a.history[-1]["cache_read"] == 40  # the fake reports 40 cached prompt tokens
    finally:
        provider.close()


def test_a_compaction_moves_only_the_marks_after_the_block(claude, tmp_path):
    """Before: the knowledge slot and the newest message are marked. After `%compact`: the same standing
    mark, byte for byte, plus one at the end of the history layers (segment block and tracks), and the
    newest message."""
    s = Session("claude", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000,
                background_compaction=False)
    s.pin("db_limit", "120")
    claude.reply = "Here is the plan in detail. " + "We go over the retry policy, the billing export and the " \
        "staging deploy once more, step by step, with the numbers as agreed. " * 30
    for i in range(6):
        s.chat(f"turn {i}: keep the pool under {20 + i} and the timeout at {30 + i} s", stream=False)
    before = _marked(claude.hits[-1]["body"])
    assert s.compact()
    assert s.segments
    s.chat("what is the pool limit now?", stream=False)
    after = _marked(claude.hits[-1]["body"])
    assert before[1] == after[1] and "db_limit" in after[1][1]  # the standing prefix's mark is unchanged
    # the history layers' end is marked: the segment block, then the tracks (the user's own words last)
    assert after[2][1].startswith("[the user's own words") and "[#9] turn 4" in after[2][1]
    assert after[-1][1] == "what is the pool limit now?" and len(after) == 4


def test_the_bill_prices_each_call_from_the_cost_map_with_cache_rates_and_the_summarizer_apart(claude, tmp_path):
    from mfs_nb.models.cost import describe, price

    rates = price(CLAUDE)
    assert rates is not None and rates["write"] > rates["input"] > rates["read"] > 0  # Anthropic's three rates
    s = Session("claude", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=200_000, background_compaction=False)
    claude.reply = "Here is the plan in detail. " + "We go over the retry policy and the billing export " \
        "once more, step by step, with the numbers as agreed. " * 30
    for i in range(5):
        s.chat(f"turn {i}: keep the pool under {20 + i}", stream=False)
    assert s.compact() and s.segments
    bill = s.cost()
    rows = [r for r in s.history if "prompt_tokens" in r]
    chat = bill["chat"]
    assert chat["calls"] == len(rows) == 5 and chat["written_tokens"] == sum(r["cache_write"] for r in rows)
    expected = sum((r["prompt_tokens"] - r["cache_read"] - r["cache_write"]) * rates["input"]
                   + r["cache_read"] * rates["read"] + r["cache_write"] * rates["write"]
                   + r["completion_tokens"] * rates["output"] for r in rows)
    assert chat["dollars"] == pytest.approx(expected, abs=1e-6) and chat["dollars"] < chat["uncached_dollars"]
    assert bill["summarizer"]["calls"] == 1 and bill["summarizer"]["dollars"] > 0  # the compaction's call
    assert bill["dollars"] == pytest.approx(chat["dollars"] + bill["summarizer"]["dollars"], abs=2e-6)
    text = describe(bill)
    assert "chat: 5 calls" in text and "summarizer: 1 calls" in text and "with no cache" in text


def test_a_model_the_cost_map_does_not_know_is_price_unknown_never_zero(tmp_path):
    from mfs_nb.models.cost import describe, session_cost

    bill = session_cost([{"prompt_tokens": 900, "cache_read": 0, "cache_write": 0, "completion_tokens": 20,
                          "model": "openai/my-own-model"}], [], "openai/my-own-model")
    assert bill["dollars"] is None and bill["unpriced"] == ["openai/my-own-model"]
    assert "price unknown" in describe(bill) and "$0" not in describe(bill)
    offline = Session("o", store=str(tmp_path / "s"))
    offline.chat("hello")
    assert offline.cost()["dollars"] == 0.0  # the offline default costs nothing, and is not 'unknown'


def test_mfs_cost_prints_the_bill(ip, capsys):
    ip.run_cell("%%chat\nkeep the pool under 30")
    capsys.readouterr()
    ip.run_line_magic("mfs", "cost")
    out = capsys.readouterr().out
    assert "priced with litellm's cost map" in out and "chat: 1 calls" in out


def test_gates_in_money_use_the_price_ratio_where_it_is_known(claude, tmp_path):
    """A cache miss costs (write − read) per token once; a freed token saves a read on every later call."""
    from mfs_nb.models.cost import miss_weight, price

    rates = price(CLAUDE)
    assert miss_weight(CLAUDE) == pytest.approx((rates["write"] - rates["read"]) / rates["read"])  # 11.5
    assert miss_weight("openai/gpt-4o") == pytest.approx(1.0)  # a write is an ordinary input token there
    assert miss_weight("openai/my-own-model") is None  # the token ratio then
    s = Session("claude", store=str(tmp_path / "s"), model=CLAUDE, window_tokens=8_000)
    assert s.miss_weight() == pytest.approx(miss_weight(CLAUDE))
    assert Session("off", store=str(tmp_path / "s"), model=CLAUDE, prompt_cache=False).miss_weight() is None
    assert Session("o", store=str(tmp_path / "s")).miss_weight() is None  # the offline default
    claude.reply = "Noted. " + "We keep the retry policy, the billing export and the staging deploy as agreed. " * 12
    ahead = None
    for i in range(60):
        notices = s.chat(f"step {i}: the pool for service-{i} stays under {20 + i} connections; "
                         f"see deploy/pool_{i}.yaml. " * 2, stream=False).notices
        ahead = next((n for n in notices if n.startswith("compaction ahead")), None)
        if ahead:
            break
    assert ahead, "the compaction was not announced"
    tokens, dollars = re.search(r"≈([\d,]+) tokens past the prompt cache once, ≈\$([\d.]+) more", ahead).groups()
    miss = int(tokens.replace(",", ""))
    assert miss > 0 and float(dollars) == pytest.approx(miss * (rates["write"] - rates["read"]), abs=1e-4)
