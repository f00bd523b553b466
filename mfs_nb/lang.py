"""Headers and notices in the conversation's language (issue 18 deliverable 6).

A Chinese conversation gets Chinese segment prose (the summarizer is asked for it), and with this
module Chinese headers in the payload, Chinese labels inside segments and tracks (fact-list
captions, speakers, budget notes) and Chinese notices in the notebook. The language is decided
by script from the user's own messages (`segments.conversation_language`); Chinese is the one
translation here, every other language keeps the English text. A header's language is fixed when
the layer is built from the history it covers (a segment stores it), so its bytes never change
between calls and the prefix cache holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

CHINESE = "Chinese"

_TEXT: dict[str, tuple[str, str]] = {
    # model-facing headers (in the payload)
    "honesty": (
        "Everything below is compressed; the originals are no longer in context. For exact numbers, "
        "paths or quotes, call recall_history with the uid range in the header.",
        "以下内容均为压缩后的摘要，原文已不在上下文中。需要确切的数字、路径或原话时，请用标题中的 uid 范围调用 "
        "recall_history。"),
    "facts_label": ("Facts (verbatim):", "事实（原文照录）："),
    "fact_caption": (
        "[working set and fact lines of the history up to #{upto}, verbatim (compacted, or cleared from this "
        "payload); recall_history gives their context]",
        "[截至 #{upto} 的工作集与事实行，原文照录（已压缩，或已从本次请求中清除）；recall_history 可取回上下文]"),
    "verbatim_caption": (
        "[the user's own words up to #{upto}, verbatim and never summarized; quoted AI output and "
        "documents are pointers]",
        "[截至 #{upto} 用户的原话，逐字保留、从不摘要；粘贴的 AI 输出和文档只留指针]"),
    "knowledge_header": (
        "[knowledge slot: values kept word for word and never compacted. The user pins them; you save one "
        "with remember(key, value) and drop it with forget(key)]",
        "[知识槽：这些值逐字保留，永不压缩。用户固定它们；你可以用 remember(key, value) 保存一项，"
        "用 forget(key) 删除]"),
    # labels inside a segment and the tracks: the segment header, the fact lists, the guides
    "segment_degraded": ("degraded", "降级"),
    "segment_topics": ("topics: {words}", "主题：{words}"),
    "facts_errors": ("errors seen:", "出现的错误："),
    "facts_commands": ("commands run:", "运行的命令："),
    "facts_calls": ("other tool calls:", "其他工具调用："),
    "facts_files": ("files touched:", "涉及的文件："),
    "facts_said": ("said (user and assistant):", "说过的话（用户与助手）："),
    "facts_outputs": ("what tools returned:", "工具返回的内容："),
    "facts_dropped": (
        "[older fact lines of uids {lo}–{hi} left for the budget ({what}); recall_history returns them]",
        "[uid {lo}–{hi} 中较早的事实行因预算省略（{what}）；recall_history 可取回]"),
    "count_errors": ("{n} errors", "错误 {n} 条"),
    "count_commands": ("{n} commands", "命令 {n} 条"),
    "count_calls": ("{n} calls", "工具调用 {n} 条"),
    "count_files": ("{n} files", "文件 {n} 条"),
    "count_said": ("{n} said", "对话 {n} 条"),
    "count_outputs": ("{n} output lines", "输出 {n} 条"),
    "guide_dropped": ("- ({n} older lines of this guide left for the budget)", "- （本指南较早的 {n} 行因预算省略）"),
    "evicted": ("[earlier history, uids {spans}, was compressed and its summaries no longer fit here; "
                "recall_history returns the originals]",
                "[更早的历史（uid {spans}）已压缩，其摘要已放不下；recall_history 可取回原文]"),
    "calls": ("calls {names}", "调用 {names}"),
    "nothing_to_summarize": ("- (nothing to summarize)", "- （没有可摘要的内容）"),
    "nothing_to_merge": ("- (nothing to merge)", "- （没有可合并的内容）"),
    # labels inside the user-verbatim track (origin.py): quoted AI output, documents, the dropped note
    "quoted": ("[quoted AI] the user pasted {chars:,} chars {origin} (first line: {first_line}); "
               "recall_history({uid}) returns the text",
               "[引用的 AI 输出] 用户粘贴了 {chars:,} 个字符，{origin}（首行：{first_line}）；recall_history({uid}) 可取回原文"),
    "quoted_from_reply": ("from reply #{reply}", "来自回复 #{reply}"),
    "quoted_from_ai": ("from an AI reply", "来自一条 AI 回复"),
    "quoted_note": ("[quoted AI + the user's note]", "[引用的 AI 输出 + 用户的附言]"),
    "quoted_note_from": ("[quoted AI from reply #{reply} + the user's note]", "[引用的 AI 输出（来自回复 #{reply}）+ 用户的附言]"),
    "document_snapshot": ("[document] {path} ({chars:,} chars, first line: {first_line})",
                          "[文档] {path}（{chars:,} 个字符，首行：{first_line}）"),
    "document": ("[document] {chars:,} chars, first line: {first_line}; recall_history({uid}) returns it",
                 "[文档] {chars:,} 个字符，首行：{first_line}；recall_history({uid}) 可取回"),
    "verbatim_dropped": ("[older user messages #{lo}–#{hi} left this track for its budget; recall_history returns them]",
                         "[较早的用户消息 #{lo}–#{hi} 因预算移出本轨道；recall_history 可取回]"),
    "budget_note": ("[context {share} of the usable window · compaction at {line}]",
                    "[上下文已占可用窗口的 {share} · 压缩线 {line}]"),
    # user-facing notices
    "compacted": ("context compacted: {before} → {after} (segment {ids}, uids {a}–{b})",
                  "上下文已压缩：{before} → {after}（片段 {ids}，uid {a}–{b}）"),
    "ahead": (
        "compaction ahead: the context is at {share} of the usable window and compacts from {line} on, once "
        "the background summary is ready; it will cover uids {a}–{b} (%compact --preview shows it, %compact "
        "does it now)",
        "即将压缩：上下文已占可用窗口的 {share}，从 {line} 起压缩（后台摘要就绪后）；将覆盖 uid {a}–{b}"
        "（%compact --preview 可预览，%compact 立即执行）"),
    "ahead_miss": ("; it sends ≈{tokens} tokens past the prompt cache once", "；届时约 {tokens} tokens 不命中提示缓存（一次）"),
    "ahead_miss_priced": ("; it sends ≈{tokens} tokens past the prompt cache once, ≈{dollars} more than a cache "
                          "read at {model}'s prices", "；届时约 {tokens} tokens 不命中提示缓存（一次），按 {model} 的价格"
                          "比缓存读取多约 {dollars}"),
    "not_worth": ("nothing worth compacting: {n} messages, {tokens} tokens (the payload would go from {now} to "
                  "{then} tokens)", "不值得压缩：{n} 条消息，{tokens} tokens（请求会从 {now} 变为 {then} tokens）"),
    "tier": ("context at {share} of the usable window when sent ({tier})", "上下文已占可用窗口的 {share}（发送时；{tier}）"),
    "pinned": ("knowledge slot: pinned {keys} ({n} entries, {tokens} of {budget} tokens)",
               "知识槽：已固定 {keys}（{n} 项，{tokens} / {budget} tokens）"),
    "remembered": ("knowledge slot: remembered {keys} ({n} entries, {tokens} of {budget} tokens)",
                   "知识槽：已记住 {keys}（{n} 项，{tokens} / {budget} tokens）"),
    "removed": ("knowledge slot: removed {keys} ({n} entries left)", "知识槽：已删除 {keys}（剩 {n} 项）"),
    "slot_full": ("knowledge slot full: {keys} left it (written longest ago); pin again to bring one back",
                  "知识槽已满：{keys} 已移出（最早写入的）；重新 pin 可恢复"),
}


def text(key: str, language: str | None = None, **values: Any) -> str:
    """The text `key` in `language` (Chinese, else English), with `values` filled in."""
    english, chinese = _TEXT[key]
    return (chinese if language == CHINESE else english).format(**values)


# The speaker of a line (a fact line, a line of a guide): the role name, and its Chinese word.
SPEAKERS = {"user": "用户", "assistant": "助手", "tool": "工具"}


def speaker(role: str, language: str | None = None) -> str:
    """`role: ` as a line's speaker label in `language` (`用户：` in Chinese); an unknown role as it is."""
    if language == CHINESE and role in SPEAKERS:
        return SPEAKERS[role] + "："
    return f"{role}: "


def spoken(line: str, language: str | None = None) -> str:
    """`line`, whose English speaker label (`user: …`, `tool: …`) is the working set's key, with the
    label in `language`; a line with no such label as it is."""
    role, sep, rest = line.partition(": ")
    return speaker(role, language) + rest if sep and language == CHINESE and role in SPEAKERS else line


_KANA = re.compile(r"[\u3040-\u30ff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")
CJK_SHARE = 0.3  # of the letters in the user's messages: above it, the conversation is Chinese/Japanese/Korean


def has_cjk(text: str) -> bool:
    """Whether `text` has a Chinese, Japanese or Korean character."""
    return bool(_HAN.search(text) or _KANA.search(text) or _HANGUL.search(text))


def conversation_language(events: Sequence[Any]) -> str | None:
    """The language the user writes in, when the script says so with no model: Chinese, Japanese
    or Korean (each CJK character counts for a word's worth of Latin letters); None otherwise
    (the instruction then asks for the user's language in general)."""
    text = " ".join(e.content for e in events if e.role == "user")
    han, kana, hangul = len(_HAN.findall(text)), len(_KANA.findall(text)), len(_HANGUL.findall(text))
    cjk = han + kana + hangul
    if not cjk or 4 * cjk < CJK_SHARE * (4 * cjk + len(_LATIN.findall(text))):
        return None
    return "Korean" if hangul > han + kana else "Japanese" if kana > 0.1 * cjk else "Chinese"


def translated(language: str | None) -> str:
    """`language` when this module has its headers, else "" (English)."""
    return language if language == CHINESE else ""


def header_language(events: Sequence[Any]) -> str:
    """The language of a layer's headers for the history `events`: one this module translates to, or ""."""
    return translated(conversation_language(events))
