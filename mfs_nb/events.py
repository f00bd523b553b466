"""The event: one immutable entry of the append-only log (docs/architecture.md, "The log").

An event never changes once written; what the model receives is a projection of these
(`view.py`). Events are plain frozen dataclasses so the memory core never touches storage.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .window.tokens import message_tokens

ROLES = ("system", "user", "assistant", "tool")


def content_hash(content: str) -> str:
    """sha256 of the content as UTF-8."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Make any Python str storable as UTF-8: each lone surrogate becomes one U+FFFD, the rest is kept.
    (User messages with surrogates are refused before this, with a one-line error.)"""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


@dataclass(frozen=True)
class Event:
    """One message of the log, with its place (uid, turn) and where it came from (origin)."""

    uid: int
    session: str
    turn: int
    role: str
    content: str
    origin: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""
    name: str = ""
    turn_start: bool = False
    created_at: str = ""
    sha256: str = field(default="")

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {', '.join(ROLES)}")
        if not self.sha256:
            object.__setattr__(self, "sha256", content_hash(self.content))

    @property
    def tool_call_ids(self) -> tuple[str, ...]:
        """Ids of the tool calls this assistant event makes (empty for other events)."""
        return tuple(str(c.get("id", "")) for c in self.tool_calls)

    @cached_property
    def tokens(self) -> int:
        """Estimated tokens of this event as a chat message (`to_message`), counted once: the cold-range
        choice sums them over the whole raw tail on every call past the warn line."""
        return message_tokens(self.to_message())

    def to_message(self) -> dict[str, Any]:
        """This event as an OpenAI-format chat message."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.role == "tool":
            msg["tool_call_id"] = self.tool_call_id
            if self.name:
                msg["name"] = self.name
        return msg

    def to_row(self, writer: str) -> dict[str, Any]:
        """The LanceDB row for this event; `writer` identifies the Session that wrote it."""
        return {
            "key": event_key(self.session, self.uid),
            "session": self.session,
            "uid": self.uid,
            "turn": self.turn,
            "turn_start": self.turn_start,
            "role": self.role,
            "origin": self.origin,
            "content": self.content,
            "tool_calls": json.dumps(list(self.tool_calls), ensure_ascii=False, sort_keys=True)
            if self.tool_calls
            else "",
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "sha256": self.sha256,
            "created_at": self.created_at,
            "writer": writer,
        }

    @classmethod
    def from_columns(cls, columns: dict[str, list[Any]]) -> list[Event]:
        """Events from a table's columns (what the store read back): rows it validated when it wrote
        them, so they are not checked again; a 100k-event log loads in a fraction of `from_row`'s time."""
        out = []
        new = object.__new__
        n = len(columns["uid"])
        get = {k: columns.get(k) or [None] * n for k in ("origin", "tool_calls", "tool_call_id", "name", "turn_start",
                                                         "created_at")}
        for i in range(n):
            e = new(cls)
            calls = get["tool_calls"][i]
            e.__dict__.update(uid=int(columns["uid"][i]), session=columns["session"][i], turn=int(columns["turn"][i]),
                              role=columns["role"][i], content=columns["content"][i], origin=get["origin"][i] or "",
                              tool_calls=tuple(json.loads(calls)) if calls else (),
                              tool_call_id=get["tool_call_id"][i] or "", name=get["name"][i] or "",
                              turn_start=bool(get["turn_start"][i]), created_at=get["created_at"][i] or "",
                              sha256=columns["sha256"][i])
            out.append(e)
        return out

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Event:
        calls = tuple(json.loads(row["tool_calls"])) if row.get("tool_calls") else ()
        return cls(
            uid=int(row["uid"]),
            session=row["session"],
            turn=int(row["turn"]),
            role=row["role"],
            content=row["content"],
            origin=row.get("origin") or "",
            tool_calls=calls,
            tool_call_id=row.get("tool_call_id") or "",
            name=row.get("name") or "",
            turn_start=bool(row.get("turn_start")),
            created_at=row.get("created_at") or "",
            sha256=row["sha256"],
        )


def event_key(session: str, uid: int) -> str:
    """The stable merge key of an event: one row per (session, uid), whoever retries the write."""
    return f"{session}\x1f{uid:012d}"


# A session's events are in uid order (the log's order); these read the end of it without a pass over
# all of it, so a turn's work does not grow with the history.
def after(events: Sequence[Event], uid: int) -> Sequence[Event]:
    """The events with a uid above `uid`."""
    return events[bisect_right(events, uid, key=_uid):]


class Retries:
    """Turns that got no reply (the call failed or was stopped) and were asked again at once, word for word.

    Each of their events maps to the uid of the question asked again: what the model is sent leaves them out,
    so the retry takes the failed turn's place; the log keeps both, and a recall marks the first. A notebook
    cell record (a tool result no call asked for) in between stays in the payload. Read incrementally, like
    `after`: each call looks at the events added since the last one."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.found: dict[int, int] = {}
        self._seen = 0  # events read so far
        self._last_uid = 0
        self._start: int | None = None  # index of the last user message that opened a turn

    def of(self, events: Sequence[Event]) -> dict[int, int]:
        if self._seen > len(events) or (self._seen and events[self._seen - 1].uid != self._last_uid):
            self._reset()  # another log than the one read: read it again
        for i in range(self._seen, len(events)):
            e = events[i]
            if e.role != "user" or not e.turn_start:
                continue
            start = self._start
            if start is not None and e.content == events[start].content and not _answered(events[start:i]):
                for x in events[start:i]:
                    if not _cell_record(x):
                        self.found[x.uid] = e.uid
            self._start = i
        if events:
            self._seen, self._last_uid = len(events), events[-1].uid
        return self.found


def _cell_record(event: Event) -> bool:
    return event.role == "tool" and not event.tool_call_id


def _answered(turn: Sequence[Event]) -> bool:
    """A turn ends answered when its last event (less cell records) is the model's reply, not a tool round."""
    last = next((e for e in reversed(turn) if not _cell_record(e)), None)
    return last is not None and last.role == "assistant" and not last.tool_calls


def replies_before(events: Sequence[Event], uid: int, n: int) -> list[tuple[int, str]]:
    """(uid, content) of the last `n` non-empty assistant messages before `uid`, oldest first."""
    out: list[tuple[int, str]] = []
    for i in range(bisect_left(events, uid, key=_uid) - 1, -1, -1):
        if len(out) == n:
            break
        e = events[i]
        if e.role == "assistant" and e.content.strip():
            out.append((e.uid, e.content))
    return out[::-1]


def _uid(event: Event) -> int:
    return event.uid


def now_iso() -> str:
    """UTC time with milliseconds, from one clock reading (two readings could straddle a second)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
