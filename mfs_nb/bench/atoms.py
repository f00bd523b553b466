"""The benchmarks' own reading of "a fact survived": an independent extractor, one markup
stripper for every strategy, and matching that asks for the fact *in context*.

This module judges the engine, so it shares nothing with it: it imports no engine module, and it
finds facts its own way — by looking at whitespace-separated tokens and the words beside numbers,
not with the engine's line-classifying regexes — to name the exact items a reader of the
conversation would check, not to choose lines worth keeping.

Atoms, by kind:

- ``path``     a token that is a URL, or a file path: components that all contain a letter and
               either a last component ``stem.ext`` with a known extension or an explicit root
               (``/``, ``~/``, ``./``); identified by its last two components, so a summary that
               writes ``lib/pool.ex`` for ``/home/u/app/lib/pool.ex`` is not penalised;
- ``command``  shell commands: ``command``/``cmd`` values of tool-call arguments, lines of
               fenced blocks marked bash/sh/shell/console, ``$ ``-prompt lines and multi-word
               commands in backticks; one atom per sub-command (split at ``&&``, ``;``, ``|``),
               its first four words;
- ``number``   a number with a unit or currency sign after/before it (``30 s``, ``2.5 GB``,
               ``$40``, ``2900万美元``), an ISO or Chinese date, or — in what the user and the
               assistant say and in tool-call arguments — any number of three or more digits (in
               tool output bare numbers are mostly line numbers, ids and timestamps: left out);
- ``error``    exception and error class names (``TimeoutError``, ``** (CompileError)``);
- ``ident``    identifiers in backticks that look like code (an underscore, dot, slash, colon,
               parenthesis, digit or inner capital) and dotted module names (``Spotter.Pool``);
- ``name``     proper names in user and assistant text: capitalised words not at the start of a
               sentence or line, and Chinese titles in 《…》; a name in more than 2 % of the
               messages of any block of 500 (a speaker) is context, not a fact.

Matching (`score`):

1. the history and every payload pass through the same `strip_markup`, which removes exact
   templates of any strategy's decoration — uid tags, segment headers, track and fact-track
   captions, recall handles, cleared/trimmed stubs, the honesty line, each also in the Chinese a
   Chinese conversation gets, and the Chinese speaker labels (``用户：``) — and nothing else;
2. an atom is found only on word boundaries (``23`` is not inside ``123``; CJK characters beside
   a number do not break it); a number matches with or without the space before its unit;
3. **in context**: an atom counts only where a word that stood within `WINDOW` words of it in the
   original also stands within `WINDOW` words of it in the payload, and that word is specific —
   it stood beside at most `SPECIFIC` of the facts (so a fixed filler of common context words
   cannot vouch for every atom), and the payload does not put it beside many more facts than the
   conversation did. Words are lowercased and lightly stemmed; CJK text counts in
   character bigrams; stop words and every word that is part of an atom never count, so a bag
   of atoms cannot supply its own context. A fact with no specific word beside it anywhere in
   the conversation (a path read by a bare ``Read`` call, say) cannot be judged in context and is
   left out of the measured set, for every strategy alike; `FactSet.no_context` keeps them and
   the tables say how many.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .atom_text import CJK, CJK_STOP, STOP, ascii_word, stem_word, strip_markup, tokenize, word_set

KINDS = ("path", "command", "number", "error", "ident", "name")
SOURCES = ("user", "assistant", "tool_call", "tool_content", "tool_result")
STATED = ("user", "assistant", "tool_call", "tool_content")  # what the conversation said, not what tools printed
# The working set (issue 14): what was said, and what the calls acted on — the files, commands and
# patterns they name — but not the text they carry (a file's new contents, a prompt, a plan).
WORKING = ("user", "assistant", "tool_call")
WINDOW = 8  # words on each side that make an atom's context
SPECIFIC = 0.5  # a context word beside more than this share of the facts (and more than 3) is too common


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


# --- context ---------------------------------------------------------------------------------

def _units(toks: Sequence[str], starts: Sequence[int], lines: Sequence[int], a: int, b: int,
           excluded: frozenset[str] | set[str]) -> set[str]:
    """Context units of the atom at char span a..b: the WINDOW tokens on either side of it on its
    own line, as stemmed content words and CJK bigrams that are neither stop words nor part of an
    atom."""
    units: set[str] = set()
    prev_cjk = None
    first = bisect.bisect_left(starts, a)
    line = lines[first] if first < len(lines) else (lines[-1] if lines else 0)
    skip = (a, b)
    for k in range(max(first - WINDOW, 0), min(bisect.bisect_left(starts, b) + WINDOW, len(toks))):
        if lines[k] != line:
            prev_cjk = None
            continue
        t = toks[k]
        inside = skip[0] <= starts[k] < skip[1]
        if CJK.match(t):
            if prev_cjk is not None and not inside and starts[k] == starts[prev_cjk] + 1:
                bigram = toks[prev_cjk] + t
                if not (set(bigram) & CJK_STOP) and bigram not in excluded:
                    units.add(bigram)
            prev_cjk = None if inside else k
            continue
        prev_cjk = None
        if inside or not t[0].isalpha():
            continue
        w = stem_word(t)
        if len(w) >= 3 and t.lower() not in STOP and w not in STOP and w not in excluded:
            units.add(w)
    return units


def atom_words(spans: Iterable[str]) -> frozenset[str]:
    """Stemmed words and CJK bigrams that occur inside atoms (their whole matched text): never
    context, so that a list of atoms cannot supply its own context."""
    out: set[str] = set()
    for span in spans:
        toks, starts, _ = tokenize(span)
        for t in toks:
            if t[0].isalpha() and not CJK.match(t):
                out.add(stem_word(t))
        for k in range(1, len(toks)):
            if CJK.match(toks[k]) and CJK.match(toks[k - 1]) and starts[k] == starts[k - 1] + 1:
                out.add(toks[k - 1] + toks[k])
    return frozenset(out)


# --- the fact set of a conversation ----------------------------------------------------------

@dataclass
class Fact:
    """An atom stated in the conversation: who stated it first, where, and the words that stood
    around it in the original (the union over its mentions)."""

    atom: Atom
    source: str
    first: int
    last: int
    context: set[str] = field(default_factory=set)


@dataclass
class FactSet:
    """Every fact of a transcript, the words that are atoms, how common each context word is,
    and the markup-free text of each message (to tell a restated fact)."""

    facts: dict[Atom, Fact]
    excluded: frozenset[str]
    common: tuple[str, ...]  # context words too common to vouch for a fact, most common first
    texts: list[str]
    no_context: dict[Atom, Fact] = field(default_factory=dict)  # facts with no specific word beside them
    df: Counter[str] = field(default_factory=Counter)  # how many facts each word stands beside in the history

    def older(self, cut: int) -> list[Fact]:
        """Facts stated before message index `cut` and not restated after it — neither as an atom
        the extractor finds nor as the same text on word boundaries."""
        later = Payload.from_text("\n".join(self.texts[cut:]), self)
        return [f for f in self.facts.values() if f.last < cut and not later.present(f.atom.key)]


def fact_set(messages: Sequence[dict[str, Any]], upto: int | None = None) -> FactSet:
    """Extract the facts of messages[:upto] with their original context words."""
    upto = len(messages) if upto is None else upto
    mentions: list[tuple[int, str, str, list[tuple[Atom, int, int]]]] = []
    texts: list[str] = []
    block_df: dict[int, Counter[str]] = {}
    for i, m in enumerate(messages[:upto]):
        message_parts = parts(m)
        texts.append("\n".join(text for _, text, _ in message_parts))
        for source, text, command in message_parts:
            found = extract(text, source, command)
            mentions.append((i, source, text, found))
            block_df.setdefault(i // 500, Counter()).update({a.key for a, _, _ in found if a.kind == "name"})
    frequent = {k for n_block, df in block_df.items() for k, n in df.items()
                if n > max(3, 0.02 * min(500, upto - 500 * n_block))}
    keep = {a for *_, found in mentions for a, _, _ in found if not (a.kind == "name" and a.key in frequent)}
    excluded = atom_words(text[a:b] for _, _, text, found in mentions for atom, a, b in found if atom in keep)
    facts: dict[Atom, Fact] = {}
    for i, source, text, found in mentions:
        if not found:
            continue
        toks, starts, lines = tokenize(text)
        for atom, a, b in found:
            if atom not in keep:
                continue
            ctx = _units(toks, starts, lines, a, b, excluded)
            fact = facts.get(atom)
            if fact is None:
                facts[atom] = Fact(atom, source, i, i, ctx)
            else:
                fact.last = i
                fact.context |= ctx
    df = Counter(u for f in facts.values() for u in f.context)
    common = tuple(u for u, n in df.most_common() if n > max(3, SPECIFIC * len(facts)))
    for f in facts.values():
        f.context -= set(common)
    no_context = {a: f for a, f in facts.items() if not f.context}
    measured = {a: f for a, f in facts.items() if f.context}
    fs = FactSet(measured, excluded, common, texts, no_context)
    # How many facts each word stands beside in the history itself, counted exactly as `score`
    # counts it in a payload: the verbatim history is the reference a payload is held to.
    history = Payload.from_text("\n".join(texts), fs)
    for f in measured.values():
        fs.df.update(set().union(*history.contexts(f.atom.key)))
    return fs


def older_cut(counts: Sequence[int], upto: int, share: float = 2 / 3) -> int:
    """Message index where the newest (1 - share) of the tokens of messages[:upto] begins."""
    total = sum(counts[:upto])
    run = 0
    for i in range(upto):
        run += counts[i]
        if run >= share * total:
            return i + 1
    return upto


# --- matching --------------------------------------------------------------------------------

class Payload:
    """A payload's markup-free text, tokenised once, for many atom look-ups against one FactSet."""

    def __init__(self, messages: Sequence[dict[str, Any]], facts: FactSet):
        self._set(payload_text(messages), facts)

    @classmethod
    def from_text(cls, text: str, facts: FactSet) -> Payload:
        p = cls.__new__(cls)
        p._set(text, facts)
        return p

    def _set(self, text: str, facts: FactSet) -> None:
        self.flat = re.sub(r"[^\S\n]+", " ", re.sub(r"\s*\n\s*", "\n", text)).strip()
        self.toks, self.starts, self.lines = tokenize(self.flat)
        self.facts = facts

    def _find(self, key: str) -> list[tuple[int, int]]:
        out = []
        at = self.flat.find(key)
        while at >= 0:
            end = at + len(key)
            before = self.flat[at - 1] if at else " "
            after = self.flat[end] if end < len(self.flat) else " "
            after2 = self.flat[end + 1] if end + 1 < len(self.flat) else " "
            ok_before = not (ascii_word(before) or (key[0].isdigit() and before in ".,-$€£¥"))
            ok_after = not (ascii_word(after) or (after in ".,-" and ascii_word(after2)))
            if key[-1].isdigit() and after.isdigit():
                ok_after = False
            if ok_before and ok_after:
                out.append((at, end))
            at = self.flat.find(key, at + 1)
        return out

    def occurrences(self, key: str) -> list[tuple[int, int]]:
        """Spans of `key` on word boundaries: an ASCII letter, digit or '_' (or a decimal point or
        comma continuing a number) beside it is not a boundary; a CJK character is. A number with
        a unit also matches without the space between them ('30 s' / '30s')."""
        key = " ".join(key.split())
        spans = self._find(key)
        number_unit = re.fullmatch(r"([$€£¥￥]?\d[\d,.]*) ([A-Za-z%‰µ]+)", key)
        if number_unit:
            spans += self._find(number_unit.group(1) + number_unit.group(2))
        return spans

    def present(self, key: str) -> bool:
        return bool(self.occurrences(key))

    def contexts(self, key: str) -> list[set[str]]:
        """The context units beside each occurrence of `key`."""
        return [_units(self.toks, self.starts, self.lines, a, b, self.facts.excluded)
                for a, b in self.occurrences(key)]


@dataclass
class Score:
    """Facts in context (the headline) and bare presence (the old atom count, secondary), by
    source and by kind, over one fixed set of facts."""

    total: int
    kept: int
    present: int
    by_source: dict[str, tuple[int, int]]
    by_kind: dict[str, tuple[int, int]]
    by_kind_working: dict[str, tuple[int, int]] = field(default_factory=dict)  # kinds, working-set facts only

    @property
    def rate(self) -> float | None:
        return self.kept / self.total if self.total else None

    @property
    def presence(self) -> float | None:
        return self.present / self.total if self.total else None

    def of(self, group: str, name: str) -> float | None:
        """Rate of one source ("source"), one kind ("kind") or one kind among working-set facts ("working")."""
        table = {"source": self.by_source, "kind": self.by_kind, "working": self.by_kind_working}[group]
        kept, total = table.get(name, (0, 0))
        return kept / total if total else None

    def stated_counts(self) -> tuple[int, int]:
        """(kept, total) of user, assistant and tool-call facts: what the conversation *said*."""
        kept = total = 0
        for s in STATED:
            k, t = self.by_source.get(s, (0, 0))
            kept, total = kept + k, total + t
        return kept, total

    def stated(self) -> float | None:
        kept, total = self.stated_counts()
        return kept / total if total else None


def score(facts: Sequence[Fact], payload: Payload) -> Score:
    """How many of `facts` the payload keeps in context (and how many are merely present).

    A word vouches for a fact only where it stands beside the fact's atom and — over the whole
    payload, counting every fact of the conversation — beside hardly more facts than it stood
    beside in the conversation itself (at most 1.5 times as many, or 2 more): a word spread over
    every atom is filler, not context."""
    beside: dict[str, set[Atom]] = {}
    contexts_of: dict[Atom, list[set[str]]] = {}
    for f in (*payload.facts.facts.values(), *facts):
        if f.atom in contexts_of:
            continue
        contexts_of[f.atom] = contexts = payload.contexts(f.atom.key)
        for units in contexts:
            for u in units:
                beside.setdefault(u, set()).add(f.atom)
    df = payload.facts.df
    by_source: dict[str, list[int]] = {}
    by_kind: dict[str, list[int]] = {}
    by_kind_working: dict[str, list[int]] = {}
    kept = present = 0
    for f in facts:
        contexts = contexts_of[f.atom]
        ok = any(u in f.context and len(beside[u]) <= max(df.get(u, 0) + 2, 1.5 * df.get(u, 0))
                 for units in contexts for u in units)
        present += bool(contexts)
        kept += ok
        tables = [(by_source, f.source), (by_kind, f.atom.kind)]
        if f.source in WORKING:
            tables.append((by_kind_working, f.atom.kind))
        for table, name in tables:
            cell = table.setdefault(name, [0, 0])
            cell[0] += ok
            cell[1] += 1
    return Score(len(facts), kept, present, {k: (v[0], v[1]) for k, v in by_source.items()},
                 {k: (v[0], v[1]) for k, v in by_kind.items()}, {k: (v[0], v[1]) for k, v in by_kind_working.items()})
