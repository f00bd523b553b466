"""The fact track (docs/architecture.md, "The verbatim tracks"): exact lines that must never be
paraphrased.

Deterministic, zero LLM. A *fact line* is a line (or, in prose, a sentence) that carries an error
string, a command, a path or URL, or a number with a unit, an amount, a date or an identifier —
in English or Chinese. Lines are kept word for word, cut only when longer than 200 characters
(head 150 + "…" + tail 50). Their budget and priorities are the working set's (`workset.budget`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

ERROR, COMMAND, PATH, NUMBER = 0, 1, 2, 3

LINE_CHARS, HEAD, TAIL = 200, 150, 50

_ERROR = re.compile(
    r"(?:\b[A-Z][A-Za-z]*(?:Error|Exception|Failure)\b|Traceback|\bFAILED\b|\bfailed\b|\bfatal\b|\bpanic\b"
    r"|\berror\b|\bERROR\b|\bwarning:|\*\* \(|exit (?:code|status) [1-9]|错误|失败|异常|报错)"
)
_COMMAND = re.compile(
    r"(?:^\s*[$>#]\s+\S|`[^`\n]{2,}`|^\s*(?:sudo\s+)?(?:pip3?|python3?|pytest|npm|npx|yarn|pnpm|node|git|mix|iex|"
    r"cargo|go|docker|kubectl|make|cmake|curl|wget|ls|cd|cat|grep|rg|sed|awk|find|cp|mv|rm|mkdir|chmod|ssh|scp|"
    r"uv|poetry|conda|brew|apt(?:-get)?|psql|mysql|redis-cli|jupyter|ipython|mfs-nb|bash|sh|zsh)\b[ \t]+\S)",
    re.M,
)
_PATH = re.compile(
    r"(?:https?://\S+|(?:~|\.{1,2})?/?(?:[\w.@-]+/)+[\w.@-]+|\b[\w-]+\.(?:py|ipynb|ex|exs|erl|js|mjs|ts|tsx|jsx|"
    r"json|ya?ml|toml|ini|cfg|md|rst|txt|csv|tsv|parquet|sql|sh|rs|go|java|kt|c|h|cc|cpp|hpp|rb|php|html|css|"
    r"lock|log|xml|env)\b(?::\d+)?)"
)
_NUMBER = re.compile(
    r"(?:[$€£¥￥]\s?\d|\d[\d,._]*\s?(?:%|‰|ms|µs|us|ns|s|sec|secs|seconds?|min|minutes?|h|hrs?|hours?|days?|"
    r"weeks?|months?|years?|[KMGT]i?B|[kKMG]\b|bytes?|tokens?|req/s|qps|rps|rows?|cols?|items?|files?|tests?|"
    r"users?|connections?|replicas?|cores?|GHz|MHz|px|pt|em|km|m|cm|mm|kg|g|mg|lbs?|USD|EUR|CNY|RMB|dollars?|"
    r"元|块|万|亿|千|百|美元|人民币|公里|米|厘米|千克|公斤|克|小时|分钟|秒|天|周|年|月|日|号|点|岁|个|次|张|间|人|家|"
    r"层|星|分|度|倍)(?![A-Za-z])|\b\d{4}-\d{1,2}-\d{1,2}\b|\b\d{1,2}:\d{2}\b|\d{4}年\d{1,2}月|\b\d{3,4}[-\s]\d{3,4}[-\s]?\d{0,4}\b"
    r"|\b[A-Z]{2,}[-_]?\d{2,}\b|\b[0-9a-f]{7,40}\b|\b\d[\d,.]*\b|[零一二三四五六七八九十百千万亿]+[元万亿个次天年月日号])"
)
_SENTENCE = re.compile(r"(?<=[.!?。！？；;])\s+|(?<=[。！？；])")


@dataclass(frozen=True)
class Fact:
    """One fact line, with the most important kind it carries and the uid it came from."""

    text: str
    kind: int
    uid: int | None = None


WINDOW, OVERLAP = 256, 64  # long lines are scanned in overlapping windows (see `_found`)


def _found(pattern: re.Pattern[str], line: str) -> bool:
    """`pattern.search(line)`, in linear time on long lines: the path pattern's nested repetition
    backtracks quadratically on a long run of word characters (a 60k-char line took 30 s). Every
    fact pattern matches a short stretch, so overlapping windows find what one scan would."""
    if len(line) <= WINDOW:
        return pattern.search(line) is not None
    step = WINDOW - OVERLAP
    for i in range(0, len(line) - OVERLAP, step):
        if i:  # start after a space when one is near, so a window never begins inside a word
            space = line.find(" ", i, i + OVERLAP // 2)
            i = space + 1 if space >= 0 else i
        if pattern.search(line[i:i + WINDOW]):
            return True
    return False


def classify(line: str) -> int | None:
    """The highest-priority fact kind in `line`, or None when it carries no fact."""
    if _found(_ERROR, line):
        return ERROR
    if _COMMAND.search(line):  # anchored at line starts or backquotes: linear
        return COMMAND
    if _found(_PATH, line):
        return PATH
    if _found(_NUMBER, line):
        return NUMBER
    return None


def cut(line: str) -> str:
    """A line longer than 200 characters keeps its first 150 and last 50, joined by '…'."""
    return line if len(line) <= LINE_CHARS else line[:HEAD] + "…" + line[-TAIL:]


def stands_whole(text: str, line: str) -> bool:
    """Whether the whole of a non-empty `text` stands in `line` word for word, whitespace aside (a message
    a layer shows whole: `SendView.shown_uids`)."""
    flat = " ".join(text.split())
    return bool(flat) and flat in " ".join(line.split())


def _units(text: str) -> Iterable[str]:
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if len(line) <= LINE_CHARS:
            yield line
            continue
        for sentence in _SENTENCE.split(line):  # prose: one fact per sentence, not per paragraph
            sentence = sentence.strip()
            if sentence:
                yield sentence


def extract(text: str, uid: int | None = None) -> list[Fact]:
    """Fact lines of one text, in order of appearance, without duplicates."""
    seen: set[str] = set()
    out = []
    for unit in _units(text):
        kind = classify(unit)
        if kind is None:
            continue
        line = cut(unit)
        if line not in seen:
            seen.add(line)
            out.append(Fact(line, kind, uid))
    return out


def tool_digest(text: str, head: int = 400, tail: int = 200, max_facts: int = 12,
                taken: Iterable[str] = ()) -> str:
    """The compressor's view of a tool result (docs/architecture.md, "Segments (S3)"): head 400 +
    tail 200 characters plus its first 12 fact lines that the fact track has not `taken` already, so the prose is asked
    to cover what the verbatim lines do not. Deterministic; short results pass unchanged."""
    if len(text) <= head + tail + 50:
        return text
    skip = set(taken)
    facts = [f.text for f in extract(text) if not any(f.text in t or t in f.text for t in skip)][:max_facts]
    out = text[:head] + f"\n[… {len(text) - head - tail:,} chars elided …]\n" + text[-tail:]
    if facts:
        out += "\n[fact lines]\n" + "\n".join(facts)
    return out
