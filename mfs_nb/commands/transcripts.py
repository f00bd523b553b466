"""Other assistants' transcripts read as OpenAI-format messages: Claude Code session files, Codex CLI
rollouts and plain OpenAI-format JSONL (what `mfs-nb replay` reads). Pure: text in, messages out.

Reading is forgiving where a transcript is damaged and strict where it is not a transcript: a line that
is not JSON, or not a message, is counted and named by its line number and the rest is read; a file in
which no line is a message is refused. Thinking blocks, progress and bookkeeping lines are not part of
the conversation and are left out; tool calls keep their ids, so each result pairs with its call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..events import ROLES

FORMATS = ("claude-code", "codex", "openai")


@dataclass
class Message:
    """One recorded message, normalised to OpenAI format (`created_at`: the transcript's own time, if any;
    `origin`: "meta" for what the host wrote into the user's turn, "summary" for its own compaction)."""

    role: str
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""
    created_at: str = ""
    origin: str = ""
    documents: list[tuple[str, str]] = field(default_factory=list)  # (file name, text) attached to it


@dataclass
class Transcript:
    """What one file held: its messages, its format, an id of its own (the host's session id when it has
    one), and the line numbers that could not be read."""

    path: str
    format: str
    messages: list[Message]
    source_id: str = ""
    bad_lines: list[int] = field(default_factory=list)
    title: str = ""  # an account export's conversation: its title, last activity and session name
    updated: str = ""
    name: str = ""

    def suggested_name(self) -> str:
        """A session name from the transcript: `claude-<id>`, `codex-<id>`, else the file's name (an account
        export's conversation: from its title, `accounts.session_name`)."""
        if self.name:
            return self.name
        prefix = {"claude-code": "claude-", "codex": "codex-"}.get(self.format, "")
        base = self.source_id[:8] if self.source_id and prefix else Path(self.path).stem
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", prefix + base).strip("-.") or "imported"
        return name[:64] if name[0].isalnum() else ("t" + name)[:64]


def normalise(raw: list[Any], places: list[str] | None = None) -> list[Message]:
    """OpenAI-format dicts → Messages; tool calls get ids and results get their call's id."""
    places = places or [f"message {i}" for i in range(1, len(raw) + 1)]
    out: list[Message] = []
    pending: list[str] = []
    counter = 0
    for item, place in zip(raw, places):
        if not isinstance(item, dict):
            raise InputError(f"{place}: expected a JSON object with role and content")
        role = item.get("role")
        if role not in ROLES:
            raise InputError(f"{place}: role must be one of {', '.join(ROLES)}, got {role!r}")
        content = _text(item.get("content"), place)
        calls: list[dict[str, Any]] = []
        for call in item.get("tool_calls") or []:
            if not isinstance(call, dict):
                raise InputError(f"{place}: tool_calls must be a list of objects")
            fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
            counter += 1
            calls.append(tool_call(call.get("id") or f"call_r{counter}", fn.get("name"), fn.get("arguments", "")))
        if role == "assistant" and calls:
            pending = [str(c["id"]) for c in calls]
        call_id = str(item.get("tool_call_id") or "")
        if role == "tool":
            if not call_id and pending:
                call_id = pending[0]
            if call_id in pending:
                pending.remove(call_id)
        out.append(Message(role, content, calls, call_id, str(item.get("name") or ""),
                           str(item.get("created_at") or item.get("timestamp") or "")))
    return out


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """An OpenAI-format tool call (`arguments` JSON text; anything else is written as JSON)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": str(call_id), "type": "function", "function": {"name": str(name or ""), "arguments": arguments}}


def _text(content: Any, place: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    raise InputError(f"{place}: content must be text or a list of parts, got {type(content).__name__}")


# -- reading a file -------------------------------------------------------------------------------
def load_rows(path: Path, strict: bool = False) -> tuple[list[tuple[int, Any]], list[int], str]:
    """The JSON rows of a transcript file with their line (JSONL) or item (a JSON list) numbers, the numbers
    of the lines that are not JSON, and which of "line"/"item" numbers them. `strict`: a line that is not
    JSON raises InputError instead of being counted."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (bad byte at {exc.start})") from None
    if text.lstrip().startswith("["):
        try:
            listed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
        return list(enumerate(listed if isinstance(listed, list) else [], 1)), [], "item"
    rows, bad = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except (json.JSONDecodeError, RecursionError) as exc:
            if strict:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise InputError(f"{path}: line {n} is not JSON ({why})") from None
            bad.append(n)
    return rows, bad, "line"


def read(path: str | Path, fmt: str = "auto") -> Transcript:
    """The transcript in `path` (JSONL, or a JSON list of OpenAI-format messages). `fmt`: one of FORMATS,
    or "auto" to tell them apart by their lines. Raises InputError when nothing in it is a message."""
    path = Path(path)
    rows, bad, _ = load_rows(path)
    if fmt == "auto":
        fmt = detect(row for _, row in rows)
    if fmt not in FORMATS:
        raise InputError(f"unknown transcript format {fmt!r}; use one of {', '.join(FORMATS)}")
    reader = {"claude-code": _claude_code, "codex": _codex, "openai": _openai}[fmt]
    messages, source_id = reader(rows, bad)
    if not messages:
        what = f"{len(bad)} unreadable line(s)" if bad else "no message"
        raise InputError(f"{path}: no {fmt} messages found ({what}); is it a transcript?")
    return Transcript(str(path), fmt, messages, source_id, sorted(bad))


def detect(rows: Iterable[Any]) -> str:
    """The format of a transcript's rows, from the first ones that say."""
    for row in rows:
        if not isinstance(row, dict):
            continue
        if "sessionId" in row or "parentUuid" in row or (row.get("type") in ("user", "assistant")
                                                          and isinstance(row.get("message"), dict)):
            return "claude-code"
        if "payload" in row and row.get("type") in ("session_meta", "response_item", "event_msg", "turn_context",
                                                      "compacted"):
            return "codex"
        if row.get("type") in ("message", "function_call", "function_call_output") and "role" not in row:
            return "codex"
        if "role" in row:
            return "openai"
    return "openai"


def _openai(rows: list[tuple[int, Any]], bad: list[int]) -> tuple[list[Message], str]:
    good: list[Any] = []
    places: list[str] = []
    for n, row in rows:
        try:
            normalise([row], [f"line {n}"])
        except InputError:
            bad.append(n)
            continue
        good.append(row)
        places.append(f"line {n}")
    return normalise(good, places), ""


_META_USER = re.compile(r"^\s*<(local-command-caveat|command-name|local-command-stdout|local-command-stderr|"
                        r"system-reminder|environment_context|user_instructions|user_shell_command)\b")


def _claude_code(rows: list[tuple[int, Any]], bad: list[int]) -> tuple[list[Message], str]:
    """Claude Code session files: one line per message block. An assistant message streamed over several
    lines (one per block, the same message id) becomes one message; each tool_result block becomes a
    tool message paired with its tool_use by id. Side chains (sub-agents) are their own files."""
    out: list[Message] = []
    source = ""
    open_id = None  # the message id of the assistant message being assembled
    for n, row in rows:
        if not isinstance(row, dict):
            bad.append(n)
            continue
        kind = row.get("type")
        if kind not in ("user", "assistant") or row.get("isSidechain"):
            continue  # progress, snapshots, queue and system bookkeeping
        msg = row.get("message")
        if not isinstance(msg, dict):
            bad.append(n)
            continue
        source = source or str(row.get("sessionId") or "")
        when = str(row.get("timestamp") or "")
        content = msg.get("content")
        if kind == "assistant":
            text, calls = [], []
            for block in content if isinstance(content, list) else [{"type": "text", "text": content or ""}]:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and block.get("text", "").strip():
                    text.append(block["text"])
                elif block.get("type") == "tool_use":
                    calls.append(tool_call(block.get("id") or f"toolu_line{n}", block.get("name"), block.get("input", {})))
            if not text and not calls:
                continue  # a thinking block or an empty delta
            mid = msg.get("id") or row.get("uuid")
            if out and open_id == mid and out[-1].role == "assistant":
                last = out[-1]
                last.content = "\n\n".join(x for x in (last.content, *text) if x)
                last.tool_calls.extend(calls)
            else:
                out.append(Message("assistant", "\n\n".join(text), calls, created_at=when))
                open_id = mid
            continue
        open_id = None
        if isinstance(content, str):
            origin = "summary" if row.get("isCompactSummary") else ("meta" if row.get("isMeta") or
                                                                    _META_USER.match(content) else "")
            out.append(Message("user", content, created_at=when, origin=origin))
            continue
        words = []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                out.append(Message("tool", _block_text(block.get("content")), [], str(block.get("tool_use_id") or ""),
                                   created_at=when))
            elif block.get("type") == "text":
                words.append(str(block.get("text") or ""))
            elif block.get("type") == "image":
                words.append("[image]")
        if words:
            joined = "\n".join(words)
            meta = bool(row.get("isMeta") or _META_USER.match(joined))
            out.append(Message("user", joined, created_at=when, origin="meta" if meta else ""))
    return out, source


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "[image]" if p.get("type") == "image" else ""))
                         if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _codex(rows: list[tuple[int, Any]], bad: list[int]) -> tuple[list[Message], str]:
    """Codex CLI rollouts: `response_item` lines hold the conversation (messages, function calls and their
    outputs, by call id); `event_msg` lines repeat it for the screen and are left out. Older rollouts wrote
    the items themselves, one per line, after a line of session metadata."""
    out: list[Message] = []
    source = ""
    for n, row in rows:
        if not isinstance(row, dict):
            bad.append(n)
            continue
        when = str(row.get("timestamp") or "")
        kind = row.get("type")
        if kind == "session_meta":
            source = source or str((row.get("payload") or {}).get("id") or "")
            continue
        if kind == "compacted":
            text = str((row.get("payload") or {}).get("message") or "")
            if text:
                out.append(Message("user", text, created_at=when, origin="summary"))
            continue
        item = row.get("payload") if kind == "response_item" else (row if "payload" not in row else None)
        if not isinstance(item, dict):
            continue
        if "id" in item and "instructions" in item and "type" not in item:
            source = source or str(item["id"])  # an older rollout's first line
            continue
        itype = item.get("type")
        if itype == "message":
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role")))
            if role not in ROLES:
                bad.append(n)
                continue
            text = "\n".join(str(p.get("text") or "") for p in item.get("content") or [] if isinstance(p, dict))
            if not text.strip():
                continue
            origin = "meta" if role == "user" and _META_USER.match(text) else ""
            out.append(Message(role, text, created_at=when, origin=origin))
        elif itype in ("function_call", "custom_tool_call", "local_shell_call"):
            args = item.get("arguments", item.get("input", item.get("action", "")))
            call = tool_call(item.get("call_id") or item.get("id") or f"call_line{n}", item.get("name") or itype, args)
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls.append(call)
            else:
                out.append(Message("assistant", "", [call], created_at=when))
        elif itype in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            if isinstance(output, dict):
                output = output.get("content", json.dumps(output, ensure_ascii=False))
            out.append(Message("tool", _block_text(output), [], str(item.get("call_id") or ""), created_at=when))
    return out, source
