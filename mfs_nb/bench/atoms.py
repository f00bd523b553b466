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
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .atom_text import CJK, CJK_STOP, STOP, ascii_word, stem_word, tokenize
from .extraction import Atom, extract, parts, payload_text

KINDS = ("path", "command", "number", "error", "ident", "name")
SOURCES = ("user", "assistant", "tool_call", "tool_content", "tool_result")
STATED = ("user", "assistant", "tool_call", "tool_content")  # what the conversation said, not what tools printed
# The working set (issue 14): what was said, and what the calls acted on — the files, commands and
# patterns they name — but not the text they carry (a file's new contents, a prompt, a plan).
WORKING = ("user", "assistant", "tool_call")
WINDOW = 8  # words on each side that make an atom's context
SPECIFIC = 0.5  # a context word beside more than this share of the facts (and more than 3) is too common



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
