"""The benchmarks' own reading of "a fact survived": an independent extractor, one markup
stripper for every strategy, and matching that asks for the fact *in context*.

This module judges the engine, so it shares nothing with it: it does not import `mfs_nb.facts`
(or any engine module) and its patterns are written for a different purpose — to name the exact
items a reader of the conversation would check, not to choose lines worth keeping.

Atoms, by kind (each documented at its pattern below):

- ``path``     file paths and URLs; a path is identified by its last two components
               (``lib/pool.ex`` in ``/home/u/app/lib/pool.ex``), so a summary that writes the
               project-relative path is not penalised for dropping the home directory;
- ``command``  shell commands: ``command``/``cmd`` values of tool-call arguments, lines of
               fenced ``bash``/``sh``/``console`` blocks and ``$ ``-prompt lines; one atom per
               sub-command (split at ``&&``, ``;``, ``|``), its first four words;
- ``number``   a number with three or more digits, or any number with a unit or currency sign
               (``30 s``, ``2.5 GB``, ``$40``, ``2900万美元``);
- ``error``    exception and error class names (``TimeoutError``, ``** (CompileError)``);
- ``ident``    identifiers in backticks and dotted module names (``Spotter.Pool.checkout``);
- ``name``     proper names in chat text: capitalised words not at a sentence start (joined when
               adjacent), and Chinese titles in 《…》; a name in more than 2 % of the messages (a
               speaker) is context, not a fact.

Matching (`score`):

1. every payload is passed through `strip_markup`, which removes any strategy's decoration —
   uid tags and ranges, segment headers, recall handles, cleared/trimmed stubs, the fixed
   honesty and summary captions — so an atom can never be found inside a uid or a caption;
2. an atom is found only on word boundaries (``23`` is not inside ``123``);
3. **in context**: a number, or any atom of six characters or fewer, counts only where one of
   the content words that stood within `WINDOW` words of it in the original also stands within
   `WINDOW` words of it in the payload; a longer atom counts only where some content word stands
   within `WINDOW` words of it. Content words are alphabetic words of three or more letters
   (CJK: character bigrams) that are not stop words and not part of any atom of the history —
   so a bag of atoms, with nothing but atoms in it, scores zero.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("path", "command", "number", "error", "ident", "name")
SOURCES = ("user", "assistant", "tool_call", "tool_result")
WINDOW = 8  # words on each side that make an atom's context
SHORT = 6  # atoms this long or shorter must keep an original context word

# --- extraction ------------------------------------------------------------------------------

_EXT = ("ex|exs|heex|eex|erl|hrl|py|pyi|ipynb|js|mjs|cjs|ts|tsx|jsx|vue|svelte|json|jsonl|ya?ml|toml|ini|cfg|conf|"
        "md|rst|txt|csv|tsv|parquet|sql|sh|bash|zsh|rs|go|java|kt|swift|c|h|cc|cpp|hpp|rb|php|html?|css|scss|"
        "lock|log|xml|env|dockerfile|tf|lua|r|jl|scala|proto|gradle|pem|png|jpe?g|svg|pdf|zip|gz|tar|db|sqlite")
# a URL, or a run of path components with at least one slash
_URL = re.compile(r"https?://[^\s<>\"'`)\]]+")
_SLASHED = re.compile(r"(?<![\w.@+/-])(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+")
# a bare file name with a known extension (``mix.exs``), not part of a longer dotted word
_FILENAME = re.compile(r"(?<![\w./-])[A-Za-z_][\w-]*\.(?:" + _EXT + r")(?![\w-]|\.\w)")
_HAS_EXT = re.compile(r"\.(?:" + _EXT + r")$", re.I)

_UNIT = (r"%|‰|ms|µs|ns|s|sec|secs|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?|"
         r"[KMGT]i?B|kb|mb|gb|bytes?|k|x|px|em|rem|km|cm|mm|kg|mg|lbs?|miles?|GHz|MHz|fps|rps|qps|"
         r"tokens?|rows?|lines?|chars?|tests?|failures?|errors?|warnings?|files?|users?|requests?|workers?|"
         r"connections?|items?|steps?|points?|pages?|words?|times?|pm|am")
_CN_UNIT = r"万|亿|千|元|美元|块|人民币|年|月|日|号|岁|分|米|公里|小时|分钟|秒|天|次|个|人|间|张|层|集|部|首|本|名|倍|度|%"
# three or more digits (commas and a decimal part allowed), or any number followed by a unit
_NUMBER = re.compile(
    r"[$€£¥￥]\s?\d(?:[\d,]*\d)?(?:\.\d+)?[kKmMbB]?(?![A-Za-z0-9_])"
    r"|(?<![A-Za-z0-9_.,:/#-])\d[\d,]*(?:\.\d+)?(?:\s?(?:" + _UNIT + r")(?![A-Za-z0-9_])|(?:" + _CN_UNIT + r")+)"
    r"|(?<![A-Za-z0-9_.,:/#-])\d(?:[\d,]*\d)?(?:\.\d+)?(?![A-Za-z0-9_]|[.,]\d)")
_ERROR = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Failure|Fault|Panic)\b|\*\* \(([A-Z][\w.]*)\)")
_BACKTICK = re.compile(r"`([^`\n]{3,60})`")
_DOTTED = re.compile(r"\b[A-Z][a-z][A-Za-z0-9]*(?:\.[A-Z][A-Za-z0-9]*)+(?:\.[a-z_][a-z0-9_]*[!?]?(?:/\d)?)?")
_CAPWORD = re.compile(r"\b(?:[A-Z][a-z]{2,}|[A-Z]{3,6}\b)(?:[ -][A-Z][a-z]{2,})*")
_TITLE = re.compile(r"《([^《》\n]{1,30})》")
_SENTENCE_END = re.compile(r"(?:^|[.!?。！？:\n]\s*|[\"“(]\s*)$")
_FENCE = re.compile(r"```(?:bash|sh|shell|console|zsh|terminal)?\n(.*?)```", re.S)
_PROMPT = re.compile(r"^\s*\$\s+(.+)$", re.M)
_SPLIT_CMD = re.compile(r"\s*(?:&&|\|\||;|\|)\s*")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NOT_NAMES = _words(
    "The This That These Those There Then They Their What When Where Which While Who Why How Yes Yeah Hey Thanks "
    "Thank Sure Okay Hello Also And But Just Let Now Here Please Well Wow Great Good Nice Sounds Really Absolutely "
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July August "
    "September October November December Today Tomorrow Yesterday")
_TRIVIAL_CMD = frozenset({"cd", "echo", "true", "false", "sleep", "clear", "pwd", "exit", "set"})


@dataclass(frozen=True)
class Atom:
    """One exact item: its kind and its matching key (what must stand in the payload)."""

    kind: str
    key: str


def _path_key(p: str) -> str | None:
    p = p.rstrip(".,:;)'\"")
    if p.startswith(("http://", "https://")):
        return p if len(p) > 10 else None
    parts = [x for x in p.split("/") if x not in ("", ".", "..", "~")]
    if not parts or (len(parts) < 3 and not _HAS_EXT.search(parts[-1])):
        return None  # "and/or", "n/a", "km/h": a slash is not yet a path
    key = "/".join(parts[-2:])
    return key if len(key) >= 4 else None


def _command_atoms(text: str) -> Iterable[str]:
    for line in text.splitlines()[:3]:
        for part in _SPLIT_CMD.split(line.strip()):
            words = part.split()
            if len(words) < 2 or words[0] in _TRIVIAL_CMD or not re.match(r"^[\w./~-]+$", words[0]):
                continue
            atom = " ".join(words[:4])
            if len(atom) >= 6:
                yield atom


def extract(text: str, *, names: bool = True, commands: str | None = None) -> list[tuple[Atom, int, int]]:
    """Atoms of `text` with their character spans. `commands`, when given, is a shell command
    (from a tool call) whose sub-commands become command atoms; `names` enables proper names."""
    found: list[tuple[Atom, int, int]] = []
    taken: list[tuple[int, int]] = []

    def add(kind: str, key: str | None, a: int, b: int, overlap_ok: bool = False) -> None:
        if not key:
            return
        if not overlap_ok and any(a < y and x < b for x, y in taken):
            return
        found.append((Atom(kind, key), a, b))
        taken.append((a, b))

    for m in _URL.finditer(text):
        add("path", _path_key(m.group(0)), m.start(), m.end())
    for m in _SLASHED.finditer(text):
        add("path", _path_key(m.group(0)), m.start(), m.end())
    for m in _FILENAME.finditer(text):
        add("path", m.group(0), m.start(), m.end())
    if commands:
        for atom in _command_atoms(commands):
            at = text.find(atom.split()[0])
            add("command", atom, max(at, 0), max(at, 0) + len(atom), overlap_ok=True)
    for block in (*_FENCE.finditer(text), *_PROMPT.finditer(text)):
        for atom in _command_atoms(block.group(1)):
            add("command", atom, block.start(1), block.end(1), overlap_ok=True)
    for m in _ERROR.finditer(text):
        add("error", m.group(1) or m.group(0), m.start(), m.end())
    for m in _BACKTICK.finditer(text):
        inner = m.group(1).strip()
        if " " in inner:  # `mix test --trace`: a command written in prose
            for atom in _command_atoms(inner) if re.match(r"^[a-z][\w.-]*\s", inner) else ():
                add("command", atom, m.start(1), m.end(1), overlap_ok=True)
        elif not _HAS_EXT.search(inner):
            add("ident", inner, m.start(1), m.end(1))
    for m in _DOTTED.finditer(text):
        add("ident", m.group(0), m.start(), m.end())
    for m in _NUMBER.finditer(text):
        s = " ".join(m.group(0).split())
        digits = sum(c.isdigit() for c in s)
        has_unit = not s.replace(",", "").replace(".", "").isdigit()
        if digits >= 3 or (has_unit and digits >= 1):
            add("number", s, m.start(), m.end())
    if names:
        for m in _CAPWORD.finditer(text):
            words = m.group(0).split(" ")
            start = m.start()
            while words and (words[0] in _NOT_NAMES or _SENTENCE_END.search(text[max(0, start - 3):start])):
                start += len(words[0]) + 1
                words = words[1:]
            if words and not any(w in _NOT_NAMES for w in words):
                add("name", " ".join(words), start, m.end())
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


def call_text(call: dict[str, Any]) -> tuple[str, str | None]:
    """A tool call as plain text (its name, then the string values of its arguments, JSON keys and
    escapes gone) and its shell command when it carries one."""
    fn = call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError):
        args = raw
    command = args.get("command") or args.get("cmd") if isinstance(args, dict) else None
    return (fn.get("name") or "") + " " + " ".join(_string_values(args)), command if isinstance(command, str) else None


def parts(message: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(source, text, command) for each part of a message that can state a fact."""
    role = message.get("role")
    out: list[tuple[str, str, str | None]] = []
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if role in ("user", "assistant") and content.strip():
        out.append((role, content, None))
    elif role == "tool" and content.strip():
        out.append(("tool_result", content, None))
    for call in message.get("tool_calls") or ():
        text, command = call_text(call)
        out.append(("tool_call", text, command))
    return out


# --- markup ----------------------------------------------------------------------------------

# Captions and stubs that strategies add around what they keep. One list for every strategy.
_CAPTIONS = (
    "Everything below is compressed; the originals are no longer in context. For exact numbers, paths or quotes, "
    "call recall_history with the uid range in the header.",
    "[summary of the earlier conversation]",
    "Facts (verbatim):",
)
_BRACKETED = re.compile(r"\[[^\[\]\n]{0,400}\]")
_DECORATION = re.compile(r"#\d|\buids?\b|recall_history|\bcleared\b|\btrimmed\b|\belided\b|\bsegment\b|"
                         r"summary of the earlier|compressed|verbatim|quoted AI|\[document\]|tool result|"
                         r"left out of this request|no result was recorded", re.I)
_HANDLE = re.compile(r"recall_history\([^)]*\)")
_STUB_JSON = re.compile(r"\{\"cleared\": \"[^\"]*\"\}")
_UIDS = re.compile(r"#\d+(?:\s*[–-]\s*#?\d+)?|\buids? \d+(?:\s*[–-]\s*\d+)?(?:,\s*\d+(?:\s*[–-]\s*\d+)?)*")


def strip_markup(text: str) -> str:
    """`text` without any strategy's own decoration: uid tags and ranges, segment headers, recall
    handles, cleared/trimmed stubs and fixed captions. Everything is replaced by a space so words
    on either side never join."""
    for caption in _CAPTIONS:
        text = text.replace(caption, " ")
    text = _STUB_JSON.sub(" ", text)
    text = _HANDLE.sub(" ", text)
    text = _BRACKETED.sub(lambda m: " " if _DECORATION.search(m.group(0)) else m.group(0), text)
    return _UIDS.sub(" ", text)


def payload_text(messages: Sequence[dict[str, Any]]) -> str:
    """The markup-free text of a payload: contents and tool calls (as `call_text`), one per line."""
    chunks = []
    for m in messages:
        for _, text, _ in parts(m) or [("", m.get("content") or "", None)]:
            chunks.append(strip_markup(text if isinstance(text, str) else ""))
    return "\n".join(chunks)


# --- context ---------------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’]*|[\u3400-\u4dbf\u4e00-\u9fff]|\d+")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_STOP = _words("""a an the and or but if then else of to in on at by for with from as is are was were be been being
have has had do does did not no yes it its it's this that these those there here what which who whom whose when
where why how all any some each every more most other such than too very can could will would shall should may
might must just also only about into over after before again once out up down off so you your yours we our ours
they them their i me my mine he him his she her hers let lets let's get got like one two well now still even
really yeah okay sure thanks thank hey hi oh wow great good nice much many though because while through during
what's that's i'm you're we're they're i've you've don't didn't doesn't isn't aren't wasn't won't can't
""")
_CJK_STOP = frozenset("的了是在我你他她它们这那有和就都也吗呢吧啊哦嗯个一不很还要会说到着过没把被给让")


def _tokens(text: str) -> tuple[list[str], list[int]]:
    toks, starts = [], []
    for m in _TOKEN.finditer(text):
        toks.append(m.group(0))
        starts.append(m.start())
    return toks, starts


def _units(toks: Sequence[str], starts: Sequence[int], lo: int, hi: int, skip: tuple[int, int],
           excluded: frozenset[str] | set[str]) -> set[str]:
    """Content units among tokens lo..hi-1, leaving out tokens inside char span `skip`."""
    units: set[str] = set()
    prev_cjk = None
    for k in range(max(lo, 0), min(hi, len(toks))):
        t = toks[k]
        inside = skip[0] <= starts[k] < skip[1]
        if _CJK.match(t):
            if prev_cjk is not None and not inside and starts[k] == starts[prev_cjk] + 1:
                bigram = toks[prev_cjk] + t
                if not (set(bigram) & _CJK_STOP) and bigram not in excluded:
                    units.add(bigram)
            prev_cjk = None if inside else k
            continue
        prev_cjk = None
        if inside or not t[0].isalpha():
            continue
        w = t.lower().replace("’", "'")
        if len(w) >= 3 and w not in _STOP and w not in excluded:
            units.add(w)
    return units


def _around(starts: Sequence[int], a: int, b: int) -> tuple[int, int]:
    """Token index range [lo, hi) of the WINDOW tokens on either side of char span a..b."""
    first = bisect.bisect_left(starts, a)
    last = bisect.bisect_left(starts, b)
    return first - WINDOW, last + WINDOW


def atom_words(atoms: Iterable[Atom]) -> frozenset[str]:
    """Words and CJK bigrams that occur inside atoms: never context, so that a list of atoms
    cannot supply its own context."""
    out: set[str] = set()
    for atom in atoms:
        toks, starts = _tokens(atom.key)
        for t in toks:
            if t[0].isalpha() and not _CJK.match(t):
                out.add(t.lower())
        for k in range(1, len(toks)):
            if _CJK.match(toks[k]) and _CJK.match(toks[k - 1]) and starts[k] == starts[k - 1] + 1:
                out.add(toks[k - 1] + toks[k])
    return frozenset(out)


# --- the fact set of a conversation ----------------------------------------------------------

@dataclass
class Fact:
    """An atom stated in the conversation: who stated it first, where, and the content words
    that stood around it in the original (the union over its mentions)."""

    atom: Atom
    source: str
    first: int
    last: int
    context: set[str] = field(default_factory=set)


@dataclass
class FactSet:
    """Every fact of a transcript up to `upto` (exclusive), and the words that are atoms."""

    facts: dict[Atom, Fact]
    excluded: frozenset[str]

    def older(self, cut: int) -> list[Fact]:
        """Facts stated only before message index `cut` (never restated after it)."""
        return [f for f in self.facts.values() if f.last < cut]


def fact_set(messages: Sequence[dict[str, Any]], upto: int | None = None) -> FactSet:
    """Extract the facts of messages[:upto] with their original context words."""
    upto = len(messages) if upto is None else upto
    mentions: list[tuple[int, str, str, list[tuple[Atom, int, int]]]] = []
    name_df: Counter[str] = Counter()
    for i, m in enumerate(messages[:upto]):
        for source, text, command in parts(m):
            found = extract(text, names=source in ("user", "assistant"), commands=command)
            mentions.append((i, source, text, found))
            name_df.update({a.key for a, _, _ in found if a.kind == "name"})
    frequent = {k for k, n in name_df.items() if n > max(3, 0.02 * upto)}
    atoms = {a for *_, found in mentions for a, _, _ in found if not (a.kind == "name" and a.key in frequent)}
    excluded = atom_words(atoms)
    facts: dict[Atom, Fact] = {}
    for i, source, text, found in mentions:
        if not found:
            continue
        toks, starts = _tokens(text)
        for atom, a, b in found:
            if atom not in atoms:
                continue
            lo, hi = _around(starts, a, b)
            ctx = _units(toks, starts, lo, hi, (a, b), excluded)
            fact = facts.get(atom)
            if fact is None:
                facts[atom] = Fact(atom, source, i, i, ctx)
            else:
                fact.last = i
                fact.context |= ctx
    return FactSet(facts, excluded)


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
    """A payload's markup-free text, tokenised once, for many atom look-ups."""

    def __init__(self, messages: Sequence[dict[str, Any]], excluded: frozenset[str]):
        self.text = payload_text(messages)
        self.flat = re.sub(r"\s+", " ", self.text)
        self.toks, self.starts = _tokens(self.flat)
        self.excluded = excluded

    def occurrences(self, key: str) -> list[tuple[int, int]]:
        """Spans of `key` in the payload on word boundaries (a letter, digit, '_' or, for numbers,
        a decimal point or comma continuing the number on either side is not a boundary)."""
        key = " ".join(key.split())
        out = []
        at = self.flat.find(key)
        while at >= 0:
            end = at + len(key)
            before = self.flat[at - 1] if at else " "
            after = self.flat[end] if end < len(self.flat) else " "
            after2 = self.flat[end + 1] if end + 1 < len(self.flat) else " "
            ok_before = not (before.isalnum() or before == "_" or (key[0].isdigit() and before in ".,-"))
            ok_after = not (after.isalnum() or after == "_" or (after in ".,-" and after2.isalnum()))
            if ok_before and ok_after:
                out.append((at, end))
            at = self.flat.find(key, at + 1)
        return out

    def present(self, key: str) -> bool:
        return bool(self.occurrences(key))

    def in_context(self, fact: Fact) -> bool:
        key = fact.atom.key
        strict = fact.atom.kind == "number" or len(key) <= SHORT
        for a, b in self.occurrences(key):
            lo, hi = _around(self.starts, a, b)
            units = _units(self.toks, self.starts, lo, hi, (a, b), self.excluded)
            if (units & fact.context) if strict else units:
                return True
        return False


@dataclass
class Score:
    """Facts in context (the headline) and bare presence (the old atom count, secondary), by
    source and by kind, over one fixed set of facts."""

    total: int
    kept: int
    present: int
    by_source: dict[str, tuple[int, int]]
    by_kind: dict[str, tuple[int, int]]

    @property
    def rate(self) -> float | None:
        return self.kept / self.total if self.total else None

    @property
    def presence(self) -> float | None:
        return self.present / self.total if self.total else None

    def of(self, group: str, name: str) -> float | None:
        kept, total = (self.by_source if group == "source" else self.by_kind).get(name, (0, 0))
        return kept / total if total else None

    def stated(self) -> float | None:
        """User, assistant and tool-call facts together: what the conversation *said*."""
        kept = total = 0
        for s in ("user", "assistant", "tool_call"):
            k, t = self.by_source.get(s, (0, 0))
            kept, total = kept + k, total + t
        return kept / total if total else None


def score(facts: Sequence[Fact], payload: Payload) -> Score:
    """How many of `facts` the payload keeps in context (and how many are merely present)."""
    by_source: dict[str, list[int]] = {}
    by_kind: dict[str, list[int]] = {}
    kept = present = 0
    for f in facts:
        here = payload.present(f.atom.key)
        ok = here and payload.in_context(f)
        present += here
        kept += ok
        for table, name in ((by_source, f.source), (by_kind, f.atom.kind)):
            cell = table.setdefault(name, [0, 0])
            cell[0] += ok
            cell[1] += 1
    return Score(len(facts), kept, present, {k: (v[0], v[1]) for k, v in by_source.items()},
                 {k: (v[0], v[1]) for k, v in by_kind.items()})
