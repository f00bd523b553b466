"""Headers and notices follow the conversation's language (issue 18 deliverable 6), byte-stable."""

from __future__ import annotations

from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.bench import atom_text
from mfs_nb.lang import text

ZH = "我们把连接池上限定为三十，数据库允许一百二十个连接，配置文件在 deploy/pool.yaml，周五之前上线。"
REPLY_ZH = "好的，连接池上限三十，配置在 deploy/pool.yaml，周五之前上线，迁移期间保留余量给人工会话。" * 3
EN = "We cap the pool at thirty; the database allows 120 connections and the config lives in deploy/pool.yaml."


def _chat(name, store_dir, message, reply, turns=40, **settings):
    llm = FakeLLM(default=reply, summary_text="- the pool: thirty of 120 connections, deploy/pool.yaml, Friday")
    s = Session(name, store=store_dir, window_tokens=8000, llm=llm, background_compaction=False, **settings)
    notices = []
    for i in range(turns):
        notices += s.chat(f"{i}: {message}").notices
    return s, notices


def test_a_chinese_conversation_gets_chinese_headers_and_notices(store_dir):
    s, notices = _chat("zh", store_dir, ZH, REPLY_ZH)
    s.pin("上线日期", "周五")
    assert any(n.startswith("上下文已压缩：") for n in notices)
    assert any(n.startswith("上下文已占可用窗口的") for n in notices)
    payload = "\n".join(m["content"] for m in s.send_view().messages)
    assert text("honesty", "Chinese") in payload and "Everything below is compressed" not in payload
    assert payload.startswith(s._system()) and "[知识槽：" in payload
    assert "[截至 #" in payload  # the user-verbatim track's (or fact track's) caption
    assert "- 上线日期: 周五" in payload
    assert s.llm.received[-1][-1]["content"].endswith("压缩线 90%]")  # the budget note
    # the summarizer was asked for Chinese, and the segment keeps its header language for good
    assert "Write the guide in Chinese" in s.llm.summaries[-1][-1]["content"]
    before = s.segments[0].render()
    again = Session("zh", store=store_dir, llm=FakeLLM())
    assert again.segments[0].render() == before and again.segments[0].language == "Chinese"


def test_an_english_conversation_keeps_english_and_the_metric_strips_both(store_dir):
    s, notices = _chat("en", store_dir, EN + " " + EN,
                        "Noted: the pool stays at thirty and the config is in deploy/pool.yaml. " * 3, turns=60)
    assert any(n.startswith("context compacted: ") for n in notices)
    payload = "\n".join(m["content"] for m in s.send_view().messages)
    assert text("honesty") in payload and text("honesty", "Chinese") not in payload
    for language in (None, "Chinese"):
        for key in ("honesty", "facts_label", "knowledge_header"):
            assert atom_text.strip_markup(text(key, language)).strip() == "", (key, language)
        assert atom_text.strip_markup(text("fact_caption", language, upto=12)).strip() == ""
        assert atom_text.strip_markup(text("budget_note", language, share="63%", line="90%")).strip() == ""


def test_notices_in_chinese_and_the_budget_note_through_the_magics(ip, capsys):
    session = ip.magics_manager.registry["MfsMagics"].get_session()
    session._injected_llm = session._llm = FakeLLM(default=REPLY_ZH * 3, summary_text="- 连接池上限三十，周五上线")
    for i in range(8):
        ip.run_cell_magic("chat", "", f"{i}：{ZH}")
    assert session.llm.received[-1][-1]["content"].endswith("压缩线 90%]")
    capsys.readouterr()
    ip.run_line_magic("compact", "")
    assert "上下文已压缩：" in capsys.readouterr().out
    ip.run_line_magic("mfs", "pin 负责人=数据平台组")
    assert "知识槽：已固定 负责人" in capsys.readouterr().out
    ip.run_line_magic("mfs", "config show_budget=false")
    ip.run_cell_magic("chat", "", "还有别的吗？")
    assert session.llm.received[-1][-1]["content"] == "还有别的吗？"
