"""The metric's extraction: the atoms a message states (paths, commands, numbers, errors, identifiers,
names), read by the benchmarks' own rules, never the engine's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .atom_text import STOP, ascii_word, strip_markup, word_set

# --- extraction ------------------------------------------------------------------------------

_EXTENSIONS = word_set("""ex exs heex eex erl hrl py pyi ipynb js mjs cjs ts tsx jsx vue svelte json jsonl yaml yml toml
ini cfg conf md rst txt csv tsv parquet sql sh bash zsh rs go java kt swift c h cc cpp hpp rb php html htm css scss lock
log xml env tf lua r jl scala proto gradle pem png jpg jpeg svg pdf zip gz tar db sqlite""")
_UNITS = word_set("""% ‰ ms µs ns s sec secs second seconds min mins minute minutes h hr hrs hour hours day days week weeks
month months year years kb mb gb tb kib mib gib tib byte bytes k x px em rem km cm mm kg mg lb lbs mile miles ghz mhz
fps rps qps token tokens row rows line lines char chars test tests failure failures error errors warning warnings
file files user users request requests worker workers connection connections item items step steps point points
page pages word words time times pm am usd eur cny rmb dollar dollars euro euros yuan""")
_CN_UNITS = "万亿千元美块人民币年月日号岁分米公里小时钟秒天次个人间张层集部首本名倍度%"
_CURRENCY = "$€£¥￥"
_CANDIDATE = re.compile(r"[^\s\"'`()<>\[\]{},;|]+")
_NUMBER = re.compile(r"\d+(?:[,.]\d+)*")
_CN_DATE = re.compile(r"\d{4}年\d{1,2}月(?:\d{1,2}[日号])?")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ERROR_TOKEN = re.compile(r"[A-Z][A-Za-z0-9]*(?:Error|Exception|Failure|Fault|Panic)")
_ELIXIR_ERROR = re.compile(r"\*\* \(([A-Z][\w.]*)\)")
_BACKTICK = re.compile(r"`([^`\n]{2,80})`")
_MODULE = re.compile(r"[A-Z][a-z][A-Za-z0-9]*(?:\.[A-Z][A-Za-z0-9]*)+(?:\.[a-z_][a-z0-9_]*[!?]?(?:/\d)?)?")
_CODE_MARK = re.compile(r"[_./:()#\d]|[a-z][A-Z]")
_CAPITAL = re.compile(r"[A-Z][a-z]{2,}|[A-Z]{3,6}(?![a-z])")
_TITLE = re.compile(r"《([^《》\n]{1,30})》")
_SHELL_FENCE = re.compile(r"```(?:bash|sh|shell|console|zsh|terminal)[ \t]*\n(.*?)```", re.S)
_PROMPT = re.compile(r"^[ \t]*\$[ \t]+(\S.*)$", re.M)
_SUBCOMMAND = re.compile(r"\s*(?:&&|\|\||;|\|)\s*")
_PROGRAM = re.compile(r"[a-z][\w.+-]*|\.{0,2}/[\w./-]+")
_NOT_NAMES = word_set("""The This That These Those There Then They Their What When Where Which While Who Why How Yes
Yeah Hey Thanks Thank Sure Okay Hello Also And But Just Let Now Here Please Well Wow Great Good Nice Sounds Really
Absolutely Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July
August September October November December Today Tomorrow Yesterday""")
_TRIVIAL = word_set("cd echo true false sleep clear pwd exit set export source")


@dataclass(frozen=True)
class Atom:
    """One exact item: its kind and its matching key (what must stand in the payload)."""

    kind: str
    key: str


def _path_key(token: str) -> str | None:
    token = token.rstrip(".:\\")
    token = re.sub(r"(?::\d+){1,2}$", "", token)  # path:line[:col]
    if token.startswith(("http://", "https://")):
        return token if len(token) > 12 else None
    rooted = token.startswith(("/", "~/", "./", "../"))
    parts = [p for p in token.split("/") if p not in ("", ".", "..", "~")]
    if not parts or not all(re.search(r"[A-Za-z]", p) for p in parts):
        return None
    stem, dot, ext = parts[-1].rpartition(".")
    has_ext = bool(dot and stem and ext.lower() in _EXTENSIONS)
    if len(parts) == 1:
        return parts[0] if has_ext and not parts[0][0].isupper() else None
    if not (has_ext or (rooted and len(parts) >= 2)):
        return None
    return "/".join(parts[-2:])


def _command_atoms(text: str) -> Iterable[str]:
    for line in text.splitlines()[:3]:
        for part in _SUBCOMMAND.split(line.strip()):
            words = part.split()
            if len(words) < 2 or words[0] in _TRIVIAL or not _PROGRAM.fullmatch(words[0]):
                continue
            atom = " ".join(words[:4])
            if len(atom) >= 6:
                yield atom


def _numbers(text: str, bare: bool) -> Iterable[tuple[str, int, int]]:
    """(key, start, end) of each number atom: with a unit or currency, a date, or (when `bare`)
    three or more digits. Keys put one space between a number and an ASCII unit word."""
    taken: list[tuple[int, int]] = []
    for pattern in (_CN_DATE, _ISO_DATE):
        for m in pattern.finditer(text):
            if not (m.start() and ascii_word(text[m.start() - 1])):
                taken.append((m.start(), m.end()))
                yield m.group(0), m.start(), m.end()
    for m in _NUMBER.finditer(text):
        a, b = m.start(), m.end()
        if any(x <= a < y for x, y in taken):
            continue
        before = text[a - 1] if a else " "
        if ascii_word(before) or before in ".:/#-" or (b < len(text) and text[b] == ":" and text[b + 1:b + 2].isdigit()):
            continue  # part of a word, a version, a time, a path or an id
        currency = before if before in _CURRENCY else ""
        unit = ""
        rest = text[b:b + 24]
        word = re.match(r" ?([A-Za-z%‰µ]+)", rest)
        if word and word.group(1).lower() in _UNITS and not (b + word.end() < len(text)
                                                             and ascii_word(text[b + word.end()])):
            unit = " " + word.group(1)
            b += word.end()
        else:
            cn = re.match(f"[{_CN_UNITS}]+", rest)
            if cn:
                unit = cn.group(0)
                b += cn.end()
            elif b < len(text) and ascii_word(text[b]):
                continue
        digits = sum(c.isdigit() for c in m.group(0))
        if currency or unit or (bare and digits >= 3):
            yield currency + m.group(0) + unit, a - len(currency), b


def _line_start(text: str, at: int) -> bool:
    """Whether `at` opens a sentence or a line (markdown markers and list numbers ignored)."""
    line = text[text.rfind("\n", 0, at) + 1:at]
    if not re.sub(r"[#*>|\-+\d.)\s]", "", line):
        return True
    return bool(re.search(r"[.!?。！？:;]\s*[\"“(]?\s*$", line))


def extract(text: str, source: str = "user", command: str | None = None) -> list[tuple[Atom, int, int]]:
    """Atoms of one part of a message, with their character spans. `source` is who said it
    (user, assistant, tool_call, tool_result); `command` is a tool call's shell command."""
    found: list[tuple[Atom, int, int]] = []
    taken: list[tuple[int, int]] = []

    def add(kind: str, key: str | None, a: int, b: int, overlap_ok: bool = False) -> None:
        if not key or (not overlap_ok and any(a < y and x < b for x, y in taken)):
            return
        found.append((Atom(kind, key), a, b))
        taken.append((a, b))

    if command:
        for atom in _command_atoms(command):
            at = max(text.find(atom.split()[0]), 0)
            add("command", atom, at, at + len(atom), overlap_ok=True)
    for block in (*_SHELL_FENCE.finditer(text), *_PROMPT.finditer(text)):
        for atom in _command_atoms(block.group(1)):
            add("command", atom, block.start(1), block.end(1), overlap_ok=True)
    for m in _BACKTICK.finditer(text):
        inner = m.group(1).strip()
        if " " in inner:
            if _PROGRAM.fullmatch(inner.split()[0]) and not inner[0].isupper():
                for atom in _command_atoms(inner):
                    add("command", atom, m.start(1), m.end(1), overlap_ok=True)
        elif _CODE_MARK.search(inner) and not _path_key(inner) and not inner.replace(".", "").isdigit():
            add("ident", inner.rstrip(".,"), m.start(1), m.end(1))
    for m in _CANDIDATE.finditer(text):
        add("path", _path_key(m.group(0)), m.start(), m.end())
    for m in _ELIXIR_ERROR.finditer(text):
        add("error", m.group(1), m.start(), m.end())
    for m in _ERROR_TOKEN.finditer(text):
        if not (m.start() and ascii_word(text[m.start() - 1])) and not (
                m.end() < len(text) and ascii_word(text[m.end()])):
            add("error", m.group(0), m.start(), m.end())
    for m in _MODULE.finditer(text):
        add("ident", m.group(0), m.start(), m.end())
    for key, a, b in _numbers(text, bare=source != "tool_result"):
        add("number", key, a, b)
    if source in ("user", "assistant"):
        names: list[tuple[str, int, int]] = []
        for m in _CAPITAL.finditer(text):
            a, b, word = m.start(), m.end(), m.group(0)
            if (a and ascii_word(text[a - 1])) or (b < len(text) and ascii_word(text[b])):
                continue
            if word in _NOT_NAMES or word.lower() in STOP or _line_start(text, a):
                continue
            if names and names[-1][2] + 1 == a and text[a - 1] in " -":  # "New York City"
                names[-1] = (names[-1][0] + text[a - 1] + word, names[-1][1], b)
            else:
                names.append((word, a, b))
        for word, a, b in names:
            add("name", word, a, b)
        for m in _TITLE.finditer(text):
            add("name", m.group(1), m.start(1), m.end(1))
    return found


def _string_values(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _string_values(v)
    elif isinstance(value, list):
        for v in value:
            yield from _string_values(v)


TARGET_CHARS = 200  # a single-line argument value up to this size names what a call acts on


def call_text(call: dict[str, Any]) -> tuple[str, str, str | None]:
    """A tool call as plain text, in two parts — what it acts on (its name, its shell command and
    every short single-line argument value: a file, a pattern, a description) and what it carries
    (longer or multi-line values: the text it writes or replaces, a prompt, a plan) — and its shell
    command when it has one. JSON keys and escapes are gone."""
    fn = call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError):
        args = raw
    command = (args.get("command") or args.get("cmd")) if isinstance(args, dict) else None
    command = command if isinstance(command, str) else None
    target: list[str] = [fn.get("name") or ""]
    content: list[str] = []
    for value in _string_values(args):
        short = value is command or (len(value) <= TARGET_CHARS and "\n" not in value.strip())
        (target if short else content).append(value)
    return " ".join(target), "\n".join(content), command


def parts(message: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(source, markup-free text, command) for each part of a message that can state a fact."""
    role = message.get("role")
    out: list[tuple[str, str, str | None]] = []
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    content = strip_markup(content)
    if role in ("user", "assistant") and content.strip():
        out.append((role, content, None))
    elif role == "tool" and content.strip():
        out.append(("tool_result", content, None))
    for call in message.get("tool_calls") or ():
        target, carried, command = call_text(call)
        out.append(("tool_call", strip_markup(target), command))
        if carried.strip():
            out.append(("tool_content", strip_markup(carried), None))
    return out


def payload_text(messages: Sequence[dict[str, Any]]) -> str:
    """The markup-free text of a payload: contents and tool calls, one part per line."""
    return "\n".join(text for m in messages for _, text, _ in parts(m))
