"""The working set (docs/architecture.md, "The verbatim tracks"): what the agent did, kept verbatim.

Deterministic, zero LLM, a pure function of events. From a range of the log it takes

- **files touched**: paths in the arguments of file tools (read / edit / write / create / delete
  calls, and an editor tool's ``command`` verb) and in a few shell verbs (``cat``, ``rm``,
  ``touch``, ``sed -i``, ``cp``/``mv``); repeated touches of one file collapse into one line with
  the latest operation (the latest change, when a read or a search came after it), the tools used
  and the uids;
- **commands run**: shell commands from tool calls, with their description and the exit status
  when the result shows one; a command run again collapses into its line;
- **other tool calls**: any other call (an API action, a lookup) as ``name(key=value, …)`` with
  the start of its result, so a task already done is not done again; actions rank with commands,
  lookups (``get_…``, ``search_…``) with paths;
- **errors seen**: exception lines with their message, failing tests, ``error:`` lines and the
  ``path:line`` location beside them, from tool results;
- **what was said**: fact lines (errors, commands, paths, numbers) of user and assistant text, and
  the user's decisions and constraints ("use X instead", "never …", "不要 …");
- **what tools returned** (the session's fact track only, not a segment's fact list): the fact lines
  (commands, paths, numbers) a tool result printed, ranked under every other kind, so they fill the
  room the rest leaves, newest first.

Lines are cut at 200 characters (head 150 + "…" + tail 50). Within a budget, the higher kinds
win (errors > commands and decisions > paths > bare numbers) and, within a kind, the line used more
recently and more often (`rank`: each further use counts as a few places newer);
what is left out is named by uid range, so recall_history reaches it. Segments' fact lists and the
session's fact track both come from here, so a line has one form wherever it appears.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import lang
from ..events import Event
from ..window.tokens import estimate_tokens
from .cells import NAME as CELLS
from .cells import failed_lines
from .facts import COMMAND, ERROR, LINE_CHARS, PATH, cut, extract
from .origin import canned, markup_free

GROUPS = ("errors", "commands", "calls", "files", "said", "outputs")  # each group's caption is `lang` key facts_<group>
_LOOKUP = re.compile(r"^(?:get|list|search|find|read|fetch|lookup|query|show|view|check|calculate|describe)", re.I)
MEMORY_TOOLS = frozenset({"recall_history", "recall_search", "remember", "forget"})  # the memory layer's own tools: not work done
CHANGES = ("created", "edited", "deleted")
MAX_UIDS = 5  # uids shown on one collapsed line (the newest); the count of the rest follows
ERRORS_PER_RESULT = 4
SAID_CACHE = 20_000  # messages whose text lines are kept (`said_lines`); a message is a few hundred bytes of lines
OUTPUT = 4  # output lines rank under every other kind (4 + the fact's own kind: commands, paths, numbers)
OUTPUT_POOL = 4  # printed lines read, in tokens, per token of room: the ranking (kind, then newest) chooses among them
OUTPUT_CACHE = 2_000  # tool results whose printed lines are kept (`output_lines`; the newest are read first)
REUSE, REUSE_MAX = 3, 5  # a further use of a line's file, command or text counts as this many places newer (`rank`)
TOOL = "tool: "  # the speaker of lines read from tool calls and results (said lines carry user: / assistant:)

_FILE_KEYS = ("file_path", "path", "notebook_path", "filename", "file", "target_file", "filepath")
_SHELL_KEYS = ("command", "cmd", "script")
_EDITOR_VERBS = {"view": "read", "create": "created", "str_replace": "edited", "insert": "edited",
                 "undo_edit": "edited", "delete": "deleted"}
_OP_WORDS = (("deleted", ("delete", "remove", "rm", "unlink")),
             ("edited", ("edit", "multiedit", "replace", "patch", "update", "modify", "insert", "notebookedit")),
             ("created", ("write", "create", "new", "save")),
             ("read", ("read", "view", "open", "cat", "get", "show")),
             ("searched", ("grep", "glob", "search", "find", "ls", "list")))
_SHELL_TOOL = re.compile(r"bash|shell|terminal|exec|run|command|console|sh\b", re.I)
_WORD_SPLIT = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")

_EXIT = re.compile(r"(?:exit(?:ed)?(?: with)?(?: code| status)?|return ?code|returncode)[ =:]+(-?\d+)", re.I)
_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Failure|Fault|Panic)\b(?::.*)?$")
_ELIXIR = re.compile(r"^\s*\*\* \([A-Z][\w.]*\)")
_ERROR_LINE = re.compile(r"^\s*(?:error(?:\[\w+\])?|fatal|panic|ERROR|FATAL|Error)\s*:")
_FAILED_TEST = re.compile(r"^\s*(?:FAILED|ERROR)\s+\S+::\S+|^\s*--- FAIL: \S+|^test \S+ \.\.\. FAILED|^\s*\d+\) test \S")
_LOCATION = re.compile(r"^\s*File \"[^\"]+\", line \d+|(?:^|\s)[\w.~/-]+\.[A-Za-z]\w{0,5}:\d+(?::\d+)?(?::|\s|$)")
_DECISION = re.compile(
    r"\b(?:must(?: not)?|never|always|don'?t|do not|instead|prefer|make sure|avoid|only use|should(?:n'?t)?|"
    r"we (?:decided|agreed|will|won'?t)|let'?s (?:use|go with|keep|not)|please (?:use|keep|don'?t|do not|avoid))\b"
    r"|不要|必须|别再|一定要|改用|就用|先别|务必|禁止|只能|不能", re.I)
_SHELL_READ = {"cat", "head", "tail", "less", "more", "bat", "wc"}


@dataclass(frozen=True)
class Line:
    """One line of the working set. `key` identifies what collapses (a file, a command, a text)."""

    group: str
    kind: int
    key: str
    text: str
    uids: tuple[int, ...]

    @property
    def newest(self) -> int:
        return self.uids[-1]

    def render(self, language: str = "") -> str:
        """`- text [#uids]`, the speaker label in `language` (the text keeps the English one: it is the key)."""
        shown = self.uids[-MAX_UIDS:]
        more = f" +{len(self.uids) - len(shown)}" if len(self.uids) > len(shown) else ""
        return f"- {lang.spoken(self.text, language)} [" + " ".join(f"#{u}" for u in shown) + more + "]"


@dataclass
class _File:
    path: str
    op: str
    tools: list[str] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)


@dataclass
class _Command:
    command: str
    tool: str = ""
    description: str = ""
    status: str = ""
    uids: list[int] = field(default_factory=list)


def _args(call: dict[str, Any]) -> dict[str, Any]:
    raw = (call.get("function") or {}).get("arguments") or ""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.findall(name)]


def file_op(tool: str, args: dict[str, Any]) -> str | None:
    """What a file tool does to its file: read, edited, created or deleted (None: not a file tool)."""
    verb = args.get("command")
    if isinstance(verb, str) and verb in _EDITOR_VERBS:
        return _EDITOR_VERBS[verb]
    words = set(_words(tool))
    for op, names in _OP_WORDS:
        if words & set(names):
            return op
    return None


def _shell_command(tool: str, args: dict[str, Any]) -> str | None:
    for key in _SHELL_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip() and value not in _EDITOR_VERBS and (
                key != "command" or _SHELL_TOOL.search(tool) or " " in value.strip()):
            return value.strip()
    return None


def _split_shell(command: str) -> list[list[str]]:
    out = []
    for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", command.splitlines()[0] if command else ""):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        if words:
            out.append(words)
    return out


def _looks_like_file(word: str) -> bool:
    return not word.startswith("-") and ("/" in word or re.search(r"\.[A-Za-z]\w{0,5}$", word) is not None) \
        and not word.startswith(("http://", "https://")) and len(word) > 2


def shell_files(command: str) -> list[tuple[str, str]]:
    """(path, op) for the few shell verbs whose effect on a file is plain."""
    out: list[tuple[str, str]] = []
    for words in _split_shell(command):
        verb, rest = words[0].rsplit("/", 1)[-1], [w for w in words[1:] if _looks_like_file(w)]
        if verb in _SHELL_READ:
            out += [(w, "read") for w in rest]
        elif verb == "rm":
            out += [(w, "deleted") for w in rest]
        elif verb == "touch":
            out += [(w, "created") for w in rest]
        elif verb == "sed" and any(w.startswith("-i") for w in words[1:]):
            out += [(w, "edited") for w in rest]
        elif verb in ("cp", "mv") and len(rest) >= 2:
            if verb == "mv":
                out += [(w, "deleted") for w in rest[:-1]]
            out.append((rest[-1], "created"))
    return out


def exit_status(result: str) -> str:
    """'exit N' when the result shows the exit status, 'failed' when it shows an error, else ''."""
    m = _EXIT.search(result[:2000]) or _EXIT.search(result[-2000:])
    if m:
        return f"exit {m.group(1)}"
    if result and any(_is_error(line) for line in result[:4000].splitlines()[:60]):
        return "failed"
    return ""


def call_line(tool: str, args: dict[str, Any], result: str) -> str:
    """`name(key=value, …) → start of the result`, short values only, cut to 200 characters."""
    shown = []
    for key, value in args.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False)
        value = " ".join(str(value).split())
        shown.append(f"{key}={value[:60] + '…' if len(value) > 60 else value}")
    inner = ", ".join(shown)
    outcome = " ".join(result.split())
    outcome = outcome if len(outcome) <= 50 else outcome[:49] + "…"
    room = max(40, LINE_CHARS - len(tool) - 2 - (len(outcome) + 3 if outcome else 0))
    text = f"{tool}(" + (inner if len(inner) <= room else inner[:room - 1] + "…") + ")"
    return cut(text + (" → " + outcome if outcome else ""))


def _is_error(line: str) -> bool:
    return bool(_EXCEPTION.match(line) or _ELIXIR.match(line) or _ERROR_LINE.match(line) or _FAILED_TEST.match(line))


def error_lines(result: str, limit: int = ERRORS_PER_RESULT) -> list[str]:
    """Error lines of one tool result, each with the location line right before it when there is one."""
    lines = result.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        if not _is_error(line):
            continue
        text = line.strip()
        for back in range(i - 1, max(-1, i - 4), -1):
            if _LOCATION.search(lines[back]):
                text = lines[back].strip() + " — " + text
                break
        text = cut(text)
        if text not in out:
            out.append(text)
        if len(out) >= limit:
            break
    return out


def lines_of(events: Sequence[Event], text_upto: int | None = None, tool_upto: int | None = None,
             skip_uids: Iterable[int] = (), outputs: int = 0) -> list[Line]:
    """The working set of `events`: tool lines of events up to `tool_upto`, text lines of user and
    assistant events up to `text_upto` (None: all), none from `skip_uids`. Collapsed, unbudgeted,
    except `outputs`: the fact track's lines of what the tools printed (ranked last), read from the
    newest tool result back until they pass that many tokens (the track cannot hold more, and a long
    history holds hundreds of thousands of them)."""
    skip = set(skip_uids)
    output = _printed(events, tool_upto, skip, OUTPUT_POOL * outputs) if outputs > 0 else {}
    files: dict[str, _File] = {}
    commands: dict[str, _Command] = {}
    calls: dict[str, tuple[int, str, list[int]]] = {}
    errors: dict[str, list[int]] = {}
    said: dict[str, tuple[int, list[int]]] = {}
    results = _results(events)
    for e in events:
        if e.uid in skip:
            continue
        tool_ok = tool_upto is None or e.uid <= tool_upto
        text_ok = text_upto is None or e.uid <= text_upto
        if e.role == "assistant" and e.tool_calls and tool_ok:
            for call in e.tool_calls:
                tool = (call.get("function") or {}).get("name") or ""
                args = _args(call)
                result = results.get((e.uid, str(call.get("id", ""))))
                command = _shell_command(tool, args)
                touched: list[tuple[str, str]] = []
                if command is not None:
                    line = cut(" ".join(command.split()) if "\n" not in command else command.splitlines()[0] + " …")
                    c = commands.setdefault(line, _Command(line, tool=tool))
                    desc = args.get("description")
                    if isinstance(desc, str) and desc.strip():
                        c.description = cut(" ".join(desc.split()))
                    c.status = exit_status(result.content) if result is not None else ""
                    if not c.uids or c.uids[-1] != e.uid:  # one event's lines come together: O(1), not a scan
                        c.uids.append(e.uid)
                    touched = shell_files(command)
                    tool_label = tool or "shell"
                else:
                    op = file_op(tool, args)
                    keys = _FILE_KEYS + (("pattern",) if op == "searched" else ())
                    paths = [args[k].strip() for k in keys if isinstance(args.get(k), str) and args[k].strip()]
                    if op == "searched":  # a search names the folder it searched and a file glob
                        paths = [p for p in paths if "/" in p or p.startswith("*.")]
                    touched = [(p, op) for p in (paths[:2] if op == "searched" else paths[:1])] if op else []
                    tool_label = tool or "tool"
                    if not touched and tool and tool not in MEMORY_TOOLS:
                        line = call_line(tool, args, result.content if result is not None else "")
                        kind = PATH if _LOOKUP.match(tool) else COMMAND
                        prev = calls.get(line)
                        calls[line] = (kind, line, (prev[2] if prev else []) + [e.uid])
                for path, op in touched:
                    f = files.get(path)
                    if f is None:
                        f = files[path] = _File(path, op)
                    elif op == "created" and f.op != "deleted":
                        op = "edited"  # a rewrite of a file this history already touched
                    if op in CHANGES or f.op not in CHANGES and (op != "searched" or f.op == "searched"):
                        f.op = op  # the latest change; a later read or search does not hide an edit
                    if tool_label not in f.tools:
                        f.tools.append(tool_label)
                    if not f.uids or f.uids[-1] != e.uid:
                        f.uids.append(e.uid)
        elif e.role == "tool" and tool_ok and e.name not in MEMORY_TOOLS:  # a recall repeats, it saw nothing new
            for text in (failed_lines(e.content) if e.name == CELLS and not e.tool_call_id else error_lines(e.content)):
                errors.setdefault(text, []).append(e.uid)
        if e.role in ("user", "assistant") and text_ok and e.content:
            for text, kind in said_lines(e.role, e.content):
                _add_said(said, text, kind, e.uid)
    out: list[Line] = []
    for text, uids in errors.items():
        out.append(Line("errors", ERROR, text, cut(TOOL + text), tuple(uids)))
    for c in commands.values():
        text = TOOL + (f"{c.tool}: " if c.tool else "$ ") + c.command + (f" — {c.description}" if c.description else "") + (f" → {c.status}" if c.status else "")
        out.append(Line("commands", COMMAND, c.command, cut(text) if len(text) > 260 else text, tuple(c.uids)))
    for kind, text, uids in calls.values():
        out.append(Line("calls", kind, text, cut(TOOL + text), tuple(dict.fromkeys(uids))))
    for f in files.values():
        text = f"{TOOL}{cut(f.path)} — {f.op} ({', '.join(f.tools)})"
        out.append(Line("files", PATH, f.path, text, tuple(f.uids)))
    for text, (kind, uids) in said.items():
        out.append(Line("said", kind, text, text, tuple(uids)))
    for text, (kind, uids) in output.items():
        out.append(Line("outputs", OUTPUT + kind, text, cut(TOOL + text), tuple(uids)))
    return out


def _printed(events: Sequence[Event], tool_upto: int | None, skip: set[int], tokens: int
             ) -> dict[str, tuple[int, list[int]]]:
    """What the tools printed, newest result first, until the lines pass `tokens`: {line: (kind, uids)}.
    Not the memory tools' results (a recall repeats what was said) nor the cell log's."""
    out: dict[str, tuple[int, list[int]]] = {}
    used = 0
    for e in reversed(events):
        if used > tokens:
            break
        if (e.role != "tool" or e.uid in skip or (tool_upto is not None and e.uid > tool_upto)
                or e.name in MEMORY_TOOLS or e.name == CELLS):
            continue
        for text, kind in output_lines(e.content):
            if text not in out:
                used += estimate_tokens(text) + 8
            uids = out.setdefault(text, (kind, []))[1]
            if e.uid not in uids:
                uids.insert(0, e.uid)
    return out


@functools.lru_cache(maxsize=OUTPUT_CACHE)
def output_lines(content: str) -> tuple[tuple[str, int], ...]:
    """The fact lines one tool result printed — commands, paths, numbers, word for word — less its
    error lines and the location lines beside them (the errors group carries those, `error_lines`).
    Cached like `said_lines`: the fact track is rebuilt at every compaction."""
    errors = error_lines(content, limit=len(content))
    return tuple((f.text, f.kind) for f in extract(content)
                 if not _is_error(f.text) and not any(f.text in x for x in errors))


@functools.lru_cache(maxsize=SAID_CACHE)
def said_lines(role: str, content: str) -> tuple[tuple[str, int], ...]:
    """The text lines one user or assistant message adds to the working set, with their kinds, in
    order: its fact lines (not the line that closes an attached document, none of the offline
    default's notice) and, for the user, its decisions and constraints. A function of the text
    alone, so it is cached: the fact track is rebuilt at every compaction from all the compacted
    history, and without the cache each rebuild ran the fact patterns over every message again
    (0.3–0.6 s a rebuild by chat 3,000, inside the turn that compacts)."""
    out: list[tuple[str, int]] = []
    mine: list[str] = []
    if role == "assistant" and canned(content):  # the offline default's notice: no model said it
        return ()
    content = markup_free(content, pointer=True)  # an attached document's closing line says nothing
    for fact in extract(content):
        mine.append(fact.text)
        out.append((f"{role}: {fact.text}", fact.kind))
    if role == "user":  # decisions and constraints: a line of their own, or a fact line ranked up
        for sentence in _sentences(content):
            if not _DECISION.search(sentence):
                continue
            overlapping = [t for t in mine if sentence in t or t.rstrip("…") in sentence]
            if not overlapping:
                out.append((f"user: {cut(sentence)}", COMMAND))
            out.extend((f"user: {t}", COMMAND) for t in overlapping)
    return tuple(out)


def _results(events: Sequence[Event]) -> dict[tuple[int, str], Event]:
    """Each call's result, keyed by (the calling event's uid, the call id): a result answers the
    latest call with its id before it (ids repeat across sessions and providers)."""
    latest: dict[str, int] = {}
    out: dict[tuple[int, str], Event] = {}
    for e in events:
        if e.role == "assistant":
            for call in e.tool_calls:
                latest[str(call.get("id", ""))] = e.uid
        elif e.role == "tool" and e.tool_call_id in latest:
            out.setdefault((latest[e.tool_call_id], e.tool_call_id), e)
    return out


def _add_said(said: dict[str, tuple[int, list[int]]], text: str, kind: int, uid: int) -> None:
    prev = said.get(text)
    if prev is None:
        said[text] = (kind, [uid])
        return
    if kind < prev[0]:
        said[text] = (kind, prev[1])
    if prev[1][-1] != uid:  # an event's lines are added together, so a uid seen is the last one: no scan of the list
        prev[1].append(uid)


_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])|\n+")


def _sentences(text: str) -> Iterable[str]:
    for s in _SENTENCE.split(text):
        s = s.strip()
        if len(s) >= 8:
            yield s


@dataclass(frozen=True)
class Budgeted:
    lines: list[Line]
    dropped: list[Line]
    language: str = ""  # of the captions, the note and the speaker labels (lang.py)

    def render(self) -> str:
        """The kept lines by group (errors, commands, files, said), each group oldest first, and
        one line naming what the budget left out."""
        out: list[str] = []
        for group in GROUPS:
            members = sorted((x for x in self.lines if x.group == group), key=lambda x: x.uids[0])
            if members:
                out.append(lang.text(f"facts_{group}", self.language))
                out += [x.render(self.language) for x in members]
        if self.dropped:
            out.append(dropped_note(self.dropped, self.language))
        return "\n".join(out)


def dropped_note(dropped: Sequence[Line], language: str = "") -> str:
    lo = min(x.uids[0] for x in dropped)
    hi = max(x.newest for x in dropped)
    counts = {g: sum(x.group == g for x in dropped) for g in GROUPS}
    what = ", ".join(lang.text(f"count_{g}", language, n=n) for g, n in counts.items() if n)
    return lang.text("facts_dropped", language, lo=lo, hi=hi, what=what)


def rank(lines: Sequence[Line]) -> list[Line]:
    """The order lines keep their place in when room is short, the first kept first: by kind (errors,
    then commands and decisions, paths, numbers, then what tools printed); within a kind by recency and
    reuse — a line's place among the kind's lines by its latest use, each further use of the same file,
    command or text counting as `REUSE` places newer (up to `REUSE_MAX` uses). So the line that goes
    first is the one least recently and least often used; the order the lines were met plays no part."""
    place = {id(x): i for i, x in enumerate(sorted(lines, key=lambda x: (x.kind, x.newest, x.key)))}
    return sorted(lines, key=lambda x: (x.kind, -(place[id(x)] + REUSE * (min(len(x.uids), REUSE_MAX) - 1)),
                                        -x.newest, x.key))


def budget(lines: Sequence[Line], max_tokens: int, max_lines: int | None = None, language: str = "") -> Budgeted:
    """Keep lines within `max_tokens` (and `max_lines`) in `rank`'s order. The note for what is dropped
    is paid for first. `language`: of the rendered labels (lang.py)."""
    order = rank(lines)
    reserve = 40 if len(lines) else 0
    kept: list[Line] = []
    tokens = (len(GROUPS) - all(x.group != "outputs" for x in lines)) * 4 + reserve  # a caption each
    for x in order:
        cost = estimate_tokens(x.render(language)) + 2
        if (max_lines is None or len(kept) < max_lines) and tokens + cost <= max_tokens:
            kept.append(x)
            tokens += cost
    chosen = set(kept)
    return Budgeted(kept, [x for x in lines if x not in chosen], language)


def without_shown(lines: Iterable[Line], shown_text: str) -> list[Line]:
    """Lines whose text is not already shown word for word (in a segment's fact list or prose, with
    its speaker label in English or in Chinese; a segment stored before tool lines said `tool:`
    shows them without it)."""
    return [x for x in lines if x.text not in shown_text and lang.spoken(x.text, lang.CHINESE) not in shown_text
            and not (x.text.startswith(TOOL) and x.text[len(TOOL):] in shown_text)]
