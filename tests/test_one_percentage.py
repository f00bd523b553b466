"""One base, one percentage (issue 39 item 6): the status line, the notices, `%context` and the note
sent to the model all give shares of the usable window, the same number for the same payload;
tiers are named in words; a pin or a config change moves the meter by what the payload changed."""

from __future__ import annotations

import re

from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.models.llm import Completion
from mfs_nb.window.tokens import message_tokens

PROVIDER_SHARE = 0.8  # this provider's tokenizer counts a fifth fewer tokens than the estimate


def _provider(default: str = "noted, the pool stays under 30") -> FakeLLM:
    """A fake whose usage is a provider's own count of each request: 80 % of the estimate."""
    fake = FakeLLM()

    def answer(messages):
        prompt = int(PROVIDER_SHARE * sum(message_tokens(m) for m in messages))
        return Completion(default, [], {"prompt_tokens": prompt, "completion_tokens": 9}, "primary", "fake")

    fake.script = [answer] * 400
    return fake


def _pct(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return match.group(1)


def test_status_line_notice_context_header_and_budget_note_give_one_percentage(store_dir):
    from mfs_nb.ui.context import ContextView
    from mfs_nb.ui.data import context_data, status_data

    fake = _provider()
    s = Session("pct", store=store_dir, window_tokens=4096, llm=fake)
    s.configure(auto_compaction=False)  # the tier notices come one by one, nothing compacts under them
    crossed = []
    for i in range(60):
        reply = s.chat(f"message {i}: the pool has 120 connections and four replicas " * 4)
        notices = [n for n in reply.notices if n.startswith("context at ")]
        if notices:
            crossed.append((reply, notices[0], fake.received[-1][-1]["content"]))
        if len(crossed) >= 2:
            break
    assert crossed, "the context never crossed a tier"
    for reply, notice, last_message in crossed:
        sent = _pct(r"context at (\d+%) of the usable window when sent", notice)
        note = _pct(r"\[context (\d+%) of the usable window · compaction at", last_message)
        line = reply.usage.status_line()
        shown_sent = (_pct(r"\(the request was (\d+%)\)", line) if "the request was" in line
                      else _pct(r"^ctx (\d+%)", line))
        assert sent == note == shown_sent, (notice, last_message, line)
        assert re.search(r"\((clearing soon|compacting|compacting now)\)", notice), notice  # tier in words
        assert not re.search(r"\btier\b|\b(warn|compress|hard)\b", notice + line), (notice, line)
    # %context after the cell: the payload the status line's first number measures, same base, same rounding
    reply = crossed[-1][0]
    data = context_data(s)
    now = _pct(r"^ctx (\d+%)", reply.usage.status_line())
    assert data["usage"]["percent"] == now == f"{reply.usage.tokens / reply.usage.effective:.0%}"
    assert f"({now} of the usable window" in ContextView(data=data).html()
    assert ContextView(data=data).text().startswith(f"send view: ctx {now}")
    assert status_data(reply.usage)["ratio"] == round(reply.usage.tokens / reply.usage.effective, 4)


def test_a_pin_moves_the_meter_by_about_the_pinned_tokens(store_dir):
    s = Session("pin", store=store_dir, window_tokens=8192, llm=_provider())
    s.configure(auto_compaction=False, tool_clearing=False)
    i = 0
    while s.usage().ratio < 0.6:
        s.chat(f"message {i}: the pool has 120 connections and four replicas " * 6)
        i += 1
    before = s.usage()
    assert before.source == "anchor+estimate"
    value = "postgres 15 on port 5433, pool size 30, statement timeout 5s, replicas in eu-west-1 and us-east-2"
    s.pin("db", value)
    after = s.usage()
    slot = s.send_view().layers[1]
    assert slot.kind == "knowledge"
    moved = after.tokens - before.tokens
    # the provider counts 80 % of the estimate: the slot's estimate scaled by k, never the whole payload's gap
    assert 0.5 * slot.tokens <= moved <= 1.2 * slot.tokens, (moved, slot.tokens, before.tokens, after.tokens)
    assert after.tier == before.tier


def test_a_config_change_re_anchors_without_a_jump(store_dir):
    s = Session("cfg", store=store_dir, window_tokens=8192, llm=_provider())
    for i in range(6):
        s.chat(f"message {i}: the pool has 120 connections and four replicas " * 6)
    before = s.usage()
    s.configure(window_tokens=9000)  # the trim size follows the window: the payload's structure key changes
    after = s.usage()
    assert after.tokens == before.tokens and after.effective > before.effective
