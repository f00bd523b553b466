"""The metric's reading of text (see `bench.atoms`): words and their stems, the stop lists, and the
markup every strategy puts around what it keeps, removed before anything is matched. Like `atoms`, it
imports nothing of the engine."""

from __future__ import annotations

import re

# --- tokens and words ------------------------------------------------------------------------


def word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


def ascii_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’]*|[\u3400-\u4dbf\u4e00-\u9fff]|\d+")
STOP = word_set("""a an the and or but if then else of to in on at by for with from as is are was were be been being
have has had do does did doing done not no yes it its it's this that these those there here what which who whom
whose when where why how all any some each every more most other such than too very can could will would shall
should may might must just also only about into over after before again once out up down off so you your yours we
our ours they them their i me my mine he him his she her hers let lets let's get got like one two well now still
even really yeah yep yup nope okay sure thanks thank hey hi oh wow great good nice much many though because while
through during what's that's i'm you're we're they're i've you've don't didn't doesn't isn't aren't wasn't won't
can't lol omg btw haha see web fri tues""")
CJK_STOP = frozenset("的了是在我你他她它们这那有和就都也吗呢吧啊哦嗯个一不很还要会说到着过没把被给让")


def stem_word(word: str) -> str:
    w = word.lower().replace("’", "'")
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            return w[: -len(suffix)]
    return w


def tokenize(text: str) -> tuple[list[str], list[int], list[int]]:
    """Tokens, their start offsets and the line each stands on."""
    toks, starts, lines = [], [], []
    line, seen = 0, 0
    for m in _TOKEN.finditer(text):
        line += text.count("\n", seen, m.start())
        seen = m.start()
        toks.append(m.group(0))
        starts.append(m.start())
        lines.append(line)
    return toks, starts, lines


# --- markup ----------------------------------------------------------------------------------

# Exact templates of the decoration strategies put around what they keep, one list for all of
# them. A template is anchored to its own wording; anything a person wrote stays. A Chinese
# conversation gets the engine's labels in Chinese (its `lang.py`): each has its Chinese form here,
# written out, since this module imports nothing of the engine.
_HONESTY = ("Everything below is compressed; the originals are no longer in context. For exact numbers, paths or "
            "quotes, call recall_history with the uid range in the header.")
_HONESTY_ZH = ("以下内容均为压缩后的摘要，原文已不在上下文中。需要确切的数字、路径或原话时，请用标题中的 uid 范围调用 "
               "recall_history。")
_TEMPLATES = [re.compile(p, re.M) for p in (
    r"^\[knowledge slot: values kept word for word[^\n]*\]$",
    r"^\[知识槽：[^\n]*\]$",
    r"\[context \d+% of the usable window · compaction at \d+%\]",
    r"\[上下文已占可用窗口的 \d+% · 压缩线 \d+%\]",
    r"^\[notebook cells run since the last message\]$",
    r"^事实（原文照录）：$",
    r"^\[截至 #\d+ [^\n]*\]$",
    r"^\[segment #\d+ · uids \d+–\d+[^\n]*\]$",
    r"^\[earlier history, uids [\d–, ]+, was compressed[^\n]*\]$",
    r"^\[更早的历史（uid [\d–, ]+）已压缩[^\n]*\]$",
    r"^\[the user's own words up to #\d+, verbatim[^\n]*\]$",
    r"^\[older user messages #\d+–#\d+ left this track[^\n]*\]$",
    r"^\[较早的用户消息 #\d+–#\d+ 因预算移出本轨道[^\n]*\]$",
    r"^\[fact lines of the compacted history up to #\d+[^\n]*\]$",
    r"^\[working set and fact lines of the history up to #\d+[^\n]*\]$",
    r"^(?:errors seen|commands run|other tool calls|files touched|said \(user and assistant\)):$",
    r"^(?:出现的错误|运行的命令|其他工具调用|涉及的文件|说过的话（用户与助手）)：$",
    r"^\[older fact lines of uids \d+–\d+ left for the budget[^\n]*\]$",
    r"^\[uid \d+–\d+ 中较早的事实行因预算省略[^\n]*\]$",
    r"^- \(\d+ more fact lines dropped for the budget; recall the uid range\)$",
    r"^- \(\d+ older lines of this guide left for the budget\)$",
    r"^- （本指南较早的 \d+ 行因预算省略）$",
    r"^- \(nothing to (?:summarize|merge)\)$",
    r"^- （没有可(?:摘要|合并)的内容）$",
    r"^- (?:#\d+ )?(?:用户|助手|工具)：",  # a line's speaker in Chinese (the English `user: ` stays, as it did)
    r"^Facts \(verbatim\):$",
    r"^\[fact lines\]$",
    r"^\[summary of the earlier conversation\]$",
    r"^\[uids \d+–\d+ were left out of this request[^\n]*\]$",
    r"\[tool result cleared: [^\n\]]*; recall_history\(\d+, \d+\)\]",
    r"\[… output trimmed: [\d,]+ chars; recall_history\(\d+, \d+\) …\]",
    r"\[… [\d,]+ chars elided …\]",
    r"\[tool result #\d+(?: from [^\n\]]+)?\]",
    r"\[no result was recorded for this tool call\]",
    r"\barguments of [\d,]+ chars; recall_history\(\d+, \d+\)",
    r"\[quoted AI(?: from reply #\d+)?(?: \+ the user's note)?\]",
    r"\[引用的 AI 输出(?:（来自回复 #\d+）)?(?: ?\+ 用户的附言)?\]",
    r"the user pasted [\d,]+ chars (?:from reply #\d+|from an AI reply)",
    r"用户粘贴了 [\d,]+ 个字符，(?:来自回复 #\d+|来自一条 AI 回复)",
    r"\[document\]",
    r"\[文档\]",
    r"\((?:[\d,]+ chars, )first line: ",
    r"（(?:[\d,]+ 个字符，)?首行：|[\d,]+ 个字符，首行：",
    r"recall_history\(\d+(?:, \d+)?\) 可取回(?:原文)?",
    r"recall_history\(\d+(?:, \d+)?\)(?: returns (?:the text|it|them|the originals))?",
    r"\[#\d+(?: #\d+)*(?: \+\d+)?\]",
)]


def strip_markup(text: str) -> str:
    """`text` without any strategy's own decoration (the templates above), each replaced by a
    space so that the words on either side never join. Applied to the history too, so what a
    person wrote is treated the same on both sides."""
    text = text.replace(_HONESTY, " ").replace(_HONESTY_ZH, " ")
    for pattern in _TEMPLATES:
        text = pattern.sub(" ", text)
    return text
