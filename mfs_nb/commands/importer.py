"""`mfs-nb import`: other assistants' transcripts (`transcripts.py`) brought into sessions of a store,
word for word and recallable by uid, with their own times.

One session per transcript. Importing is idempotent and resumable: a session that already holds the
transcript's messages gets only those past them (a transcript that grew since is topped up; one imported
twice adds nothing), and a session that holds another conversation is refused before anything is
written. Keys are removed from every message (`redaction.redact`) before it is stored. The full-text
index is built before the command returns (it is cheap); vectors are built in the background by the
next process that opens the session (`mfs-nb mcp`, a notebook). `compact=True` runs the memory layer
over the messages as they are written, as `mfs-nb replay` does, so the session has its segments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from ..events import clean_text, content_hash
from ..redaction import redact
from ..store import Store
from .transcripts import Message, Transcript


def open_store(uri: str | None, create: bool) -> Store:
    """The store at `uri`, refusing before anything is written a local path that is not a store: a file, or
    a folder that holds other things. `create` False: the store must exist already."""
    from pathlib import Path

    from ..store import resolve_uri

    where = resolve_uri(uri)
    if "://" not in where:
        path = Path(where)
        if path.is_file():
            raise InputError(f"{where} is a file, not an mfs_nb store (a folder of LanceDB tables)")
        listed = {p.name for p in path.iterdir()} if path.is_dir() else set()
        if listed and "events.lance" not in listed:
            raise InputError(f"{where} is not an mfs_nb store (it has no events table); choose an empty or new folder")
        if not listed and not create:
            raise InputError(f"there is no store at {where}; make one with `mfs-nb import` or a notebook first")
    return Store(uri)


def _clean(message: Message) -> Message:
    """Keys removed; an attached file's text (an account export's) as the chat attaches a document: its
    snapshot named in the message (the path is its content's hash, so the same at every import) and the
    first `INLINE_CHARS` of it there."""
    from ..layers.origin import attachment_block
    from ..layers.snapshots import snapshot_path
    from .accounts import INLINE_CHARS

    calls = [{**c, "function": {**c["function"], "arguments": redact(c["function"]["arguments"])}}
             for c in message.tool_calls]
    content = redact(message.content)
    documents = [(name, clean_text(redact(text))) for name, text in message.documents]
    for name, text in documents:
        rel = snapshot_path(content_hash_bytes(text), name)
        inline = text if len(text) <= INLINE_CHARS else (
            text[:INLINE_CHARS] + f"\n[truncated: {INLINE_CHARS:,} of {len(text):,} chars are inline; the snapshot "
            f"{rel} holds all of it]")
        content = "\n\n".join(([content] if content.strip() else []) + [attachment_block(rel, len(text), inline)])
    return Message(message.role, clean_text(content), calls, message.tool_call_id, message.name,
                   message.created_at, message.origin, documents)


def content_hash_bytes(text: str) -> str:
    """The sha256 a snapshot of `text` is stored under (`snapshots.write`)."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _resume_at(existing: list[Any], messages: list[Message], name: str, shown: str) -> int:
    """How many of `messages` the session already holds (they must be its first events, in order)."""
    for event, message in zip(existing, messages):
        if event.role != message.role or event.sha256 != content_hash(message.content):
            raise InputError(f"session {name!r} in {shown} holds another conversation (its uid {event.uid} differs "
                             "from the transcript); choose another name with --session")
    return min(len(existing), len(messages))


def import_transcript(transcript: Transcript, store: Store, session: str | None = None, *, compact: bool = False,
                      window: int | None = None, model: str | None = None,
                      on_message: Callable[[int, int], None] | None = None, fold: bool = True,
                      names: set[str] | None = None) -> dict[str, Any]:
    """Write the transcript's messages into `session` (default: its suggested name); return what was done:
    {session, format, messages, added, kept, bad_lines, uids, segments}. Many transcripts in a row (an
    account export): `fold` False leaves the full-text index's fold to the caller, once at the end
    (`fold_index`), and `names`, the store's sessions, read once, saves reading them for each (the new
    session's name is added to it)."""
    from ..layers import snapshots
    from ..session import Session, valid_session_name

    name = session or transcript.suggested_name()
    if not valid_session_name(name):
        raise InputError(f"session name {name!r} is invalid: use 1-64 letters, digits, '.', '_' or '-'")
    messages = [_clean(m) for m in transcript.messages]
    existing = store.load_events(name) if name in (store.sessions() if names is None else names) else []
    start = _resume_at(existing, messages, name, store.shown)
    tail = messages[start:]
    report: dict[str, Any] = {"session": name, "format": transcript.format, "messages": len(messages),
                              "added": len(tail), "kept": start, "bad_lines": transcript.bad_lines}
    if not tail:
        report.update(uids=[existing[0].uid, existing[-1].uid] if existing else [], segments=None)
        return report
    settings: dict[str, Any] = {"background_compaction": False} if compact else {"recall_index": False}
    s = Session(name, store=store, model=model, window_tokens=window, transient=list(settings), **settings)
    try:
        first = s.last_uid + 1
        for i, m in enumerate(tail, 1):
            if compact and m.role == "assistant":
                s.prepare_call()  # the call the model would have had here: what compacts, as in a replay
            for doc_name, text in m.documents:  # the snapshot the message names, before the message
                snapshots.write(store.files, text, doc_name)
            # word for word: not through the chat's channel, which would make a long paste a snapshot
            s.record(m.role, m.content, tool_calls=m.tool_calls or None, tool_call_id=m.tool_call_id, name=m.name,
                     origin=m.origin or m.role, new_turn=m.role == "user", created_at=m.created_at)
            if on_message:
                on_message(i, len(tail))
        s.indexer.catch_up(vectors=False)  # full text now; vectors where the session is next opened
        if names is not None:
            names.add(name)
        if fold and (why := fold_index(store)):
            report["fold_failed"] = why
        report.update(uids=[first, s.last_uid], segments=len(s.compactor.segments) if compact else None)
    finally:
        s.indexer.close(wait_s=30)
    return report


def fold_index(store: Store) -> str | None:
    """The imported rows into the full-text index itself (unfolded, every search reads them all: 20 ms, not
    5); None, or why it failed (an optimisation: search still finds them, and the next fold folds them)."""
    try:
        store.optimize_recall(None)
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None


def describe(report: dict[str, Any]) -> str:
    """One line for the person who ran the import."""
    name, added, kept = report["session"], report["added"], report["kept"]
    if not added:
        line = f"{name}: nothing new ({kept} messages already imported)"
    else:
        uids = report["uids"]
        line = (f"{name}: {added} messages imported as uids {uids[0]}–{uids[1]}"
                + (f" ({kept} were already there)" if kept else "")
                + (f", {report['segments']} segments" if report.get("segments") is not None else ""))
    if report.get("fold_failed"):
        line += f"; the full-text index was not folded ({report['fold_failed']}): search reads the new rows directly"
    bad = report["bad_lines"]
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (f" (+{len(bad) - 10})" if len(bad) > 10 else "")
        line += f"; {len(bad)} unreadable line(s) skipped: {shown}"
    return line


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, ensure_ascii=False)
