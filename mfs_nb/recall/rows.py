"""The rows of a session's recall index (docs/architecture.md, "Recall"): what each event and each
segment's prose becomes in the text table (cut into chunks, each with its place: kind, uids, turn,
role), the coarse index's windows of events, the fields a vector or latent-terms row shares with a
text row, and whether a segment row is still in force. Pure: the writer (`index`) and the reader
(`searcher`) both build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..events import Event, now_iso
from . import ranking as S

if TYPE_CHECKING:
    from ..layers.segments import Segment

def event_text(e: Event) -> str:
    """What of an event is indexed: its content, and the tool calls an assistant made."""
    text = e.content or ""
    for c in e.tool_calls:
        fn = c.get("function") or {}
        text += f"\n[{fn.get('name', '?')}({(fn.get('arguments') or '')[:300]})]"
    return text.strip()


def rows_for_event(e: Event, before: Event | None = None) -> list[dict[str, Any]]:
    """The index rows of one event. The first chunk also carries the event before it: `words` (the
    chunk after the end of that event) and `before` (that event's last piece, whose vector and latent
    terms the indexer pools with the chunk's own), so an answer is also found by the meaning of the
    question it answers; the word index reads the chunk alone, so a short reply is not found by its
    predecessor's words."""
    context = S.context_tail(event_text(before)) if before is not None else ""
    rows = [_row(e.session, "event", e.uid, e.uid, e.turn, e.role, i, c, context if i == 0 else "")
            for i, c in enumerate(S.chunks(event_text(e)))]
    if rows and context and before is not None:  # its own vector and terms stand for the context (`index`)
        rows[0]["before"] = S.chunks(event_text(before))[-1]
    return rows


def rows_for_events(events: Sequence[Event], previous: Event | None = None) -> list[dict[str, Any]]:
    rows = []
    for e in events:
        rows += rows_for_event(e, previous)
        previous = e
    return rows


def plain_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a user message indexed with context, one more vector row of its own words alone
    (chunk -1): the user-verbatim track's classifier reads it instead of embedding the text again."""
    return [{k: v for k, v in r.items() if k != "before"} | {"key": r["key"][:-4] + "plain", "chunk": -1,
                                                             "words": r["text"]}
            for r in rows if r["role"] == "user" and r["chunk"] == 0 and r["words"] != r["text"]]


def rows_for_segment(session: str, seg: Segment, turn: int) -> list[dict[str, Any]]:
    """A segment's rows; the key ends with the segment's id, so a later segment over the same uids
    (a consolidation, or a compaction again after an undo) gets rows of its own."""
    return [{**r, "key": f"{r['key']}\x1f{seg.id}"} for r in
            (_row(session, "segment", seg.uid_from, seg.uid_to, turn, "segment", i, c)
             for i, c in enumerate(S.chunks(seg.prose)))]


def rows_for_window(session: str, lo: int, events: Sequence[Event | None]) -> list[dict[str, Any]]:
    """The coarse index's row for the window of uids lo .. lo + len(events) - 1: the events' texts (a
    uid missing from the log stands as an empty text, so the i-th part is always uid lo + i), each cut
    to `search.WINDOW_EVENT_CHARS`, joined by `search.WINDOW_SEP`, as one full-text document (no
    vector, no latent terms)."""
    present = [e for e in events if e is not None]
    if not present:
        return []
    text = S.WINDOW_SEP.join(event_text(e)[:S.WINDOW_EVENT_CHARS].replace(S.WINDOW_SEP, " ") if e else ""
                             for e in events)
    return [_row(session, "window", lo, lo + len(events) - 1, present[-1].turn, "window", 0, text)]


def segment_in_force(row: dict[str, Any], ids: set[int], ranges: set[tuple[int, int]]) -> bool:
    """Whether a segment row belongs to a segment now in the payload: by the id in its key, or (rows
    written before keys carried it) by its uid range. Retracted and merged segments are not found."""
    parts = str(row["key"]).split("\x1f")
    if len(parts) >= 5 and parts[4].isdigit():
        return int(parts[4]) in ids
    return (int(row["uid"]), int(row["uid_to"])) in ranges


def _row(session: str, kind: str, uid: int, uid_to: int, turn: int, role: str, chunk: int, text: str,
         context: str = "") -> dict[str, Any]:
    words = f"{context}\n{text}" if context else text
    return {"key": f"{session}\x1f{kind}\x1f{uid:012d}\x1f{chunk:04d}", "session": session, "kind": kind, "uid": uid,
            "uid_to": uid_to, "turn": turn, "role": role, "chunk": chunk, "text": text, "words": words,
            "cjk": S.cjk_text(text), "created_at": now_iso()}


INDEX_FIELDS = ("key", "session", "kind", "uid", "uid_to", "turn", "role", "chunk")


def latent_row(row: dict[str, Any], terms: tuple[list[int], list[float]]) -> dict[str, Any]:
    return {k: row[k] for k in INDEX_FIELDS} | {"terms": terms[0], "weights": terms[1]}
