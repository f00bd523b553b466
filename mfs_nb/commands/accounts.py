"""Account data exports read as transcripts (`mfs-nb import`): ChatGPT's and claude.ai's
`conversations.json`, alone or inside the export's zip. Pure: a file in, one `Transcript` per
conversation out, in the export's order.

ChatGPT keeps a conversation as a tree (`mapping`: each message with its parent and children; a
regenerated answer or an edited question is a branch); what the person last saw is the path from the
root to `current_node`, and that path is what is read. A tree with a cycle or a missing parent is read
along its longest path that reaches the root (the branch that ends at `current_node` when it does), with
one notice. claude.ai keeps a flat list of messages. Tool and browsing steps become compact tool calls
and results (a call whose result came without one gets one, so each result pairs with a call);
thinking, hidden context and empty placeholders are left out; attached files are named in the message,
and a file whose text the export holds travels with it as a document (a snapshot, `importer`).

The file is read one conversation at a time, so a damaged or truncated export yields every
conversation before the first bad one, and that one is named (`Reading.problem`)."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import InputError
from .transcripts import Message, Transcript, tool_call

KINDS = ("chatgpt", "claude-ai")
_HIDDEN_TYPES = {"thoughts", "reasoning_recap", "user_editable_context", "model_editable_context"}
INLINE_CHARS = 4_000  # an attached file's text shown in the message; the snapshot keeps all of it


@dataclass
class Reading:
    """What an export held: its conversations (each a Transcript, `source_id` the conversation's id,
    `title` its title, `updated` its last activity), the notices about trees read along another path,
    and the first conversation that could not be read (None: all were)."""

    path: str
    kind: str
    conversations: list[Transcript]
    notices: list[str] = field(default_factory=list)
    problem: str | None = None


def is_account_export(path: str | Path) -> bool:
    """Whether `path` looks like an account export: a zip holding conversations.json, or a JSON list whose
    first item is a ChatGPT or claude.ai conversation."""
    path = Path(path)
    if not path.is_file():
        return False
    if zipfile.is_zipfile(path):
        return True
    with path.open("rb") as fh:
        head = fh.read(4096).decode("utf-8", "replace").lstrip()
    return head.startswith("[") and bool(re.search(r'"(mapping|chat_messages|current_node)"\s*:', head)) or (
        head.startswith("[") and path.name == "conversations.json")


def read_export(path: str | Path) -> Reading:
    """Every conversation of the export at `path` (conversations.json, or the export's zip)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    text = _export_text(path)
    items, problem = _items(text, path)
    kind = _kind(items[0][1]) if items else "chatgpt"
    out = Reading(str(path), kind, [])
    titles: list[str] = []
    for n, item in items:
        try:
            if not isinstance(item, dict):
                raise InputError("not a JSON object")
            item_kind = _kind(item)
            if item_kind is None:
                raise InputError(f"not a ChatGPT or claude.ai conversation (keys: {', '.join(sorted(item)[:8])})")
            t = _chatgpt(item, path, out.notices) if item_kind == "chatgpt" else _claude(item, path)
        except (InputError, KeyError, TypeError, ValueError, AttributeError) as exc:
            why = exc if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
            problem = (f"{path}: conversation {n}{_after(titles)} cannot be read ({why}); the {len(out.conversations)} "
                       "before it are read, and importing the file again once it is whole adds only what is new")
            break
        titles.append(t.title)
        if t.messages:
            out.conversations.append(t)
    out.problem = problem
    if not out.conversations and problem is None and not items:
        raise InputError(f"{path}: no conversations in it; is it a ChatGPT or claude.ai conversations.json?")
    return out


def _after(titles: list[str]) -> str:
    return f" (after {titles[-1]!r})" if titles and titles[-1] else ""


def _export_text(path: Path) -> str:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.rsplit("/", 1)[-1] == "conversations.json"]
            if not names:
                raise InputError(f"{path}: the zip holds no conversations.json; is it a ChatGPT or claude.ai export?")
            data = z.read(min(names, key=len))
    else:
        data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (bad byte at {exc.start})") from None


def _items(text: str, path: Path) -> tuple[list[tuple[int, Any]], str | None]:
    """The items of the top-level JSON list, one at a time: those before a damaged or missing part, and
    a line naming where it broke (None when the whole list was read)."""
    decoder = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text[i:i + 1] == "[":
        raise InputError(f"{path}: expected a JSON list of conversations (conversations.json)")
    i += 1
    items: list[tuple[int, Any]] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i < len(text) and text[i] == "]":
            return items, None
        n = len(items) + 1
        if i >= len(text):
            return items, (f"{path}: the file ends inside its list, before conversation {n} (truncated?); the {n - 1} "
                           "before it are read, and importing the whole file again adds only what is new")
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            return items, (f"{path}: conversation {n} is damaged ({exc.msg} at character {exc.pos:,}); the {n - 1} "
                           "before it are read, and importing the file again once it is whole adds only what is new")
        items.append((n, item))


def _kind(item: Any) -> str | None:
    if isinstance(item, dict) and "mapping" in item:
        return "chatgpt"
    if isinstance(item, dict) and "chat_messages" in item:
        return "claude-ai"
    return None


def _iso(value: Any) -> str:
    """An export's time (seconds since the epoch, or an ISO string) as the log writes times."""
    if value in (None, ""):
        return ""
    if isinstance(value, (int, float)):
        when = datetime.fromtimestamp(float(value), tz=timezone.utc)
    else:
        try:
            when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return ""
        when = when.astimezone(timezone.utc) if when.tzinfo else when.replace(tzinfo=timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{when.microsecond // 1000:03d}Z"


def session_name(prefix: str, title: str, conversation_id: str) -> str:
    """`chatgpt-<title words>-<id>`: from the title, made unique (and the same at every import) by the
    conversation's id."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-")
    tail = re.sub(r"[^A-Za-z0-9]", "", conversation_id)[:8] or "x"
    return "-".join(p for p in (prefix, slug, tail) if p)[:64]


def _transcript(kind: str, path: Path, title: str, conversation_id: str, updated: str,
                messages: list[Message]) -> Transcript:
    return Transcript(str(path), kind, messages, conversation_id, title=title, updated=updated,
                      name=session_name("chatgpt" if kind == "chatgpt" else "claude", title, conversation_id))


# -- ChatGPT ----------------------------------------------------------------------------------------
def _chatgpt(conv: dict[str, Any], path: Path, notices: list[str]) -> Transcript:
    mapping = conv["mapping"]
    if not isinstance(mapping, dict):
        raise InputError("its mapping is not an object")
    title = str(conv.get("title") or "untitled")
    cid = str(conv.get("conversation_id") or conv.get("id") or _fallback_id(conv))
    nodes, broken = _branch(mapping, conv.get("current_node"))
    if broken:
        notices.append(f"conversation {title!r}: its tree has {broken}; read along its longest path that reaches "
                       f"the start ({len(nodes)} nodes)")
    messages: list[Message] = []
    pending: list[str] = []
    calls = 0
    for node in nodes:
        m = node.get("message")
        if not isinstance(m, dict) or (m.get("metadata") or {}).get("is_visually_hidden_from_conversation"):
            continue
        role = (m.get("author") or {}).get("role")
        content = m.get("content") or {}
        ctype = content.get("content_type", "text") if isinstance(content, dict) else "text"
        if ctype in _HIDDEN_TYPES or role == "system":
            continue
        text = _chatgpt_text(content)
        when = _iso(m.get("create_time"))
        if role == "user":
            text += _attachments((m.get("metadata") or {}).get("attachments"))
            if text.strip():
                messages.append(Message("user", text, created_at=when))
        elif role == "assistant":
            recipient = m.get("recipient") or "all"
            if recipient != "all":  # the model calling a tool (python, browser, an image model)
                calls += 1
                call = tool_call(f"call_c{calls}", recipient, text)
                pending = [call["id"]]
                messages.append(Message("assistant", "", [call], created_at=when))
            elif text.strip():
                messages.append(Message("assistant", text, created_at=when))
        elif role == "tool":
            name = str((m.get("author") or {}).get("name") or "tool")
            if not pending:  # a result with no call before it (browsing, a plugin): its call, made here
                calls += 1
                call = tool_call(f"call_c{calls}", name, "")
                messages.append(Message("assistant", "", [call], created_at=when))
                pending = [call["id"]]
            messages.append(Message("tool", text or f"[{ctype}]", tool_call_id=pending.pop(0), name=name,
                                    created_at=when))
    return _transcript("chatgpt", path, title, cid, _iso(conv.get("update_time") or conv.get("create_time")),
                       messages)


def _branch(mapping: dict[str, Any], current: Any) -> tuple[list[dict[str, Any]], str]:
    """The nodes from the root to `current` (what the person last saw), and "" — or, when that path breaks
    (a cycle, a parent not in the tree, no current node), the longest path from the root to any node, and
    what broke."""
    def up(start: str) -> tuple[list[str], str]:
        path, seen, node = [], set(), start
        while node is not None:
            if node in seen:
                return path, "a cycle"
            if node not in mapping:
                return path, "a missing parent"
            seen.add(node)
            path.append(node)
            node = (mapping[node] or {}).get("parent")
        return path, ""

    if isinstance(current, str) and current in mapping:
        path, broken = up(current)
        if not broken:
            return [mapping[n] for n in reversed(path)], ""
    else:
        broken = "no current node"
    best: list[str] = []
    for node in mapping:
        path, why = up(node)
        if not why and len(path) > len(best):
            best = path
    return [mapping[n] for n in reversed(best)], broken


def _chatgpt_text(content: Any) -> str:
    if not isinstance(content, dict):
        return str(content or "")
    ctype = content.get("content_type", "text")
    if ctype == "tether_quote":
        return (f"[quote from {content.get('title') or content.get('domain') or 'a page'} {content.get('url') or ''}]"
                f"\n{content.get('text') or ''}").strip()
    if "parts" in content:
        parts = []
        for part in content.get("parts") or []:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = str(part.get("content_type") or "part").replace("_asset_pointer", "")
                parts.append(part.get("text") or f"[{kind}]")
        return "\n".join(p for p in parts if p)
    for key in ("text", "result", "summary"):
        if isinstance(content.get(key), str):
            return content[key]
    return f"[{ctype}]"


def _attachments(listed: Any) -> str:
    lines = []
    for a in listed or []:
        if isinstance(a, dict) and a.get("name"):
            size = f", {int(a['size']):,} bytes" if isinstance(a.get("size"), (int, float)) else ""
            mime = a.get("mime_type") or a.get("mimeType") or ""
            lines.append(f"[attached file {a['name']}" + (f" ({mime}{size})" if mime or size else "") + "]")
    return ("\n\n" + "\n".join(lines)) if lines else ""


def _fallback_id(conv: dict[str, Any]) -> str:
    return hashlib.sha256(f"{conv.get('title')}\x1f{conv.get('create_time')}".encode()).hexdigest()[:12]


# -- claude.ai --------------------------------------------------------------------------------------
def _claude(conv: dict[str, Any], path: Path) -> Transcript:
    listed = conv["chat_messages"]
    if not isinstance(listed, list):
        raise InputError("its chat_messages is not a list")
    title = str(conv.get("name") or "untitled")
    cid = str(conv.get("uuid") or _fallback_id({"title": title, "create_time": conv.get("created_at")}))
    messages: list[Message] = []
    calls = 0
    for m in listed:
        if not isinstance(m, dict):
            raise InputError("a message is not an object")
        role = {"human": "user", "assistant": "assistant"}.get(m.get("sender"))
        if role is None:
            continue
        when = _iso(m.get("created_at"))
        texts: list[str] = []
        pending: list[str] = []
        blocks = m.get("content") if isinstance(m.get("content"), list) and m.get("content") else None
        for block in blocks or [{"type": "text", "text": m.get("text") or ""}]:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and block.get("text"):
                texts.append(block["text"])
            elif kind == "tool_use":
                calls += 1
                call = tool_call(block.get("id") or f"call_a{calls}", block.get("name") or "tool",
                             json.dumps(block.get("input") or {}, ensure_ascii=False, sort_keys=True))
                messages.append(Message("assistant", "\n".join(texts), [call], created_at=when))
                texts, pending = [], [*pending, call["id"]]
            elif kind == "tool_result":
                body = block.get("content")
                result = ("\n".join(b.get("text", "") for b in body if isinstance(b, dict))
                          if isinstance(body, list) else str(body or ""))
                call_id = pending.pop(0) if pending else None
                if call_id is None:
                    calls += 1
                    call = tool_call(f"call_a{calls}", block.get("name") or "tool", "")
                    messages.append(Message("assistant", "", [call], created_at=when))
                    call_id = call["id"]
                messages.append(Message("tool", result or "[no output]", tool_call_id=call_id,
                                        name=str(block.get("name") or ""), created_at=when))
        named = [f"[attached file {f.get('file_name')}]" for f in m.get("files") or []
                 if isinstance(f, dict) and f.get("file_name")]
        documents = [(str(a.get("file_name") or "attachment"), a["extracted_content"]) for a in m.get("attachments") or []
                     if isinstance(a, dict) and isinstance(a.get("extracted_content"), str) and a["extracted_content"].strip()]
        named += [f"[attached file {a.get('file_name')}]" for a in m.get("attachments") or []
                  if isinstance(a, dict) and a.get("file_name") and not (a.get("extracted_content") or "").strip()]
        text = "\n".join(texts) + (("\n\n" + "\n".join(named)) if named else "")
        if text.strip() or documents:
            messages.append(Message(role, text, created_at=when, documents=documents))
    return _transcript("claude-ai", path, title, cid, _iso(conv.get("updated_at") or conv.get("created_at")), messages)
