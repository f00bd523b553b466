"""A session as a file anyone can read without the package (`%mfs export`, `Session.export`).

Markdown or a notebook of markdown cells, with the same content: every message word for word
with its uid, role and turn; each segment (compaction, consolidation) placed where it was declared,
with the uids it covers; evictions where they happened; the ledger at the end. A chat then
survives a lost kernel, a deleted store, or a colleague without mfs_nb.

Known keys are removed (`redaction.redact`) from every block before it is written (before JSON escaping,
which would hide a key from the match), as from every other output.
The file is written next to its final name and renamed into place: never half a file.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..events import Event
from ..redaction import redact

FORMATS = (".md", ".ipynb")


def check_path(path: str | os.PathLike[str], overwrite: bool = False) -> Path:
    """The target of an export, or InputError with one line saying what is wrong with it."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise InputError("export needs a file name ending in .md or .ipynb, e.g. %mfs export chat.md")
    try:
        return _check(Path(path).expanduser(), overwrite)
    except (OSError, ValueError, RuntimeError) as exc:  # ~nobody, a NUL byte, a folder we may not read
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else " ".join(str(exc).split())
        raise InputError(f"cannot export to {str(path)[:200]!r}: {why}") from None


def _check(p: Path, overwrite: bool) -> Path:
    if "\x00" in str(p):
        raise ValueError("the name contains a NUL byte")
    if p.is_dir():
        raise InputError(f"{p} is a directory; give a file name inside it, e.g. {p / 'chat.md'}")
    if p.suffix.lower() not in FORMATS:
        raise InputError(f"export writes .md or .ipynb files, not {p.suffix or 'a name without a suffix'!r}")
    if not p.parent.is_dir():
        raise InputError(f"the folder {p.parent} does not exist")
    if p.exists() and not overwrite:
        raise InputError(f"{p} exists; nothing was written (overwrite=True, or %mfs export {p.name} --force)")
    return p


def blocks(name: str, events: Sequence[Event], declarations: Iterable[dict[str, Any]],
           ledger: Sequence[dict[str, Any]], header: str) -> list[tuple[str, dict[str, Any]]]:
    """The export as (markdown, metadata) blocks in reading order."""
    declared = sorted(declarations, key=lambda d: (d.get("time", ""), d.get("seq", 0)))
    out: list[tuple[str, dict[str, Any]]] = [(header, {"kind": "header", "session": name})]
    calls: dict[str, str] = {}
    pending = list(declared)
    for i, e in enumerate(events):
        out.append((_event(e, calls), {"kind": "event", "uid": e.uid, "role": e.role, "turn": e.turn}))
        # a declaration goes after the last event written before it (and never before what it covers)
        following = events[i + 1] if i + 1 < len(events) else None
        while pending and _due(pending[0], e, following):
            d = pending.pop(0)
            out.append((_declaration(d), {"kind": "declaration", "seq": d.get("seq")}))
    for d in pending:
        out.append((_declaration(d), {"kind": "declaration", "seq": d.get("seq")}))
    out.append((_ledger(ledger), {"kind": "ledger", "rows": len(ledger)}))
    return out


def _due(d: dict[str, Any], e: Event, following: Event | None) -> bool:
    covers = _covers(d)
    if covers and e.uid < covers[1]:
        return False
    return following is None or not following.created_at or following.created_at > d.get("time", "")


def _covers(d: dict[str, Any]) -> tuple[int, int] | None:
    seg = d.get("segment")
    if isinstance(seg, dict):
        return int(seg.get("uid_from", 0)), int(seg.get("uid_to", 0))
    return None


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in the text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text}\n{ticks}"


_FENCE_LINE = re.compile(r"^\s{0,3}(```|~~~)", re.M)
_HEADER_LIKE = re.compile(r"^#{1,6} #\d+ · ", re.M)


def _unsafe(text: str) -> bool:
    """Markdown that would swallow what follows (an unclosed fence) or pass for a message header."""
    return len(_FENCE_LINE.findall(text)) % 2 == 1 or bool(_HEADER_LIKE.search(text))


def _indented(text: str) -> str:
    """An indented code block: word for word after the four spaces, and no line of it starts like
    a header or a fence, for a renderer or for someone reading the file line by line."""
    return "\n".join("    " + line for line in text.split("\n"))


def _event(e: Event, calls: dict[str, str]) -> str:
    when = f" · {e.created_at}" if e.created_at else ""
    if e.role == "tool":
        name = e.name or calls.get(e.tool_call_id, "")
        head = f"### #{e.uid} · tool result{f' `{name}`' if name else ''} · turn {e.turn}{when}"
        return f"{head}\n\n{_fence(e.content)}"
    head = f"### #{e.uid} · {e.role} · turn {e.turn}{when}"
    parts = [head]
    if e.content:
        parts.append(_indented(e.content) if _unsafe(e.content) else e.content)
    for c in e.tool_calls:
        fn = c.get("function") or {}
        calls[str(c.get("id", ""))] = fn.get("name", "")
        parts.append(f"tool call `{fn.get('name', '?')}` (id {c.get('id', '?')}):\n\n{_fence(fn.get('arguments') or '')}")
    return "\n\n".join(parts)


def _declaration(d: dict[str, Any]) -> str:
    kind = d.get("type") or "compaction"
    when = d.get("time", "")
    if kind == "retract":
        return (f"> **Undo** ({when}): segment #{d.get('segment_id', '?')} was retracted (`%compact --undo`); "
                f"uids {d.get('uid_from', '?')}–{d.get('uid_to', '?')} went back into the payload as raw messages.")
    if kind == "evict":
        ids = ", ".join(f"#{i}" for i in d.get("segment_ids", []))
        return (f"> **Eviction** ({when}): segments {ids} left the payload; their uids stay recallable "
                "word for word (and are all above).")
    seg = d.get("segment") or {}
    what = {"compaction": "Segment", "upgrade": "Segment upgraded", "consolidate": "Consolidated segment"}.get(kind, kind)
    members = f", replacing segments {', '.join(f'#{i}' for i in d['segment_ids'])}" if d.get("segment_ids") else ""
    lines = [f"**{what} #{seg.get('id', '?')}** declared {when}: uids {seg.get('uid_from', '?')}–{seg.get('uid_to', '?')}"
             f", level {seg.get('level', 0)}{' (degraded)' if seg.get('degraded') else ''}{members}. "
             "From here on the model saw this instead of those messages:", "", (seg.get("prose") or "").strip()]
    if (seg.get("facts") or "").strip():
        lines += ["", "Facts (verbatim):", "", seg["facts"].strip()]
    return "\n".join("> " + line if line else ">" for line in "\n".join(lines).split("\n"))


def _ledger(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "## Ledger\n\nNo memory-layer actions."
    out = ["## Ledger", "", "| seq | time | kind | details |", "|---|---|---|---|"]
    for r in rows:
        rest = {k: v for k, v in r.items() if k not in ("seq", "time", "kind")}
        detail = json.dumps(rest, ensure_ascii=False, sort_keys=True, default=str)
        detail = " ".join(detail.replace("|", "\\|").split())
        out.append(f"| {r.get('seq', '')} | {r.get('time', '')} | {r.get('kind', '')} | {detail} |")
    return "\n".join(out)


def markdown(parts: Sequence[tuple[str, dict[str, Any]]]) -> str:
    return "\n\n".join(redact(text) for text, _ in parts) + "\n"


def notebook(parts: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """nbformat 4.5: one markdown cell per block, its place in the session in the cell's metadata."""
    cells = [{"cell_type": "markdown", "id": uuid.uuid5(uuid.NAMESPACE_OID, f"{i}:{meta}").hex[:12],
              "metadata": {"mfs_nb": meta}, "source": redact(text)} for i, (text, meta) in enumerate(parts)]
    nb = {"cells": cells, "metadata": {"mfs_nb": {"export": 1}}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, ensure_ascii=False, indent=1) + "\n"


def write(path: Path, text: str) -> Path:
    """Write atomically (a temporary file in the same folder, then a rename); one-line errors."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot write in {path.parent}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)  # already redacted block by block (after JSON escaping a key would not match)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
