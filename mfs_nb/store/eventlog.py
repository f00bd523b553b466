"""The event log: append only, one row per (session, uid), never updated; two writers settle a key."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock; the after-write check still holds
    fcntl = None  # type: ignore[assignment]

from ..errors import StoreError
from ..events import Event
from .connection import store_problem
from .core import StoreCore
from .schemas import EVENTS_SCHEMA, quote, winner


class UidConflict(StoreError):
    """Another writer already holds some of these uids; reload and append again."""



class EventLog(StoreCore):
    # -- events: append only -------------------------------------------------------------
    def append_events(self, events: Iterable[Event], writer: str) -> None:
        """Insert events whose keys are new. Retrying the same write is a no-op.

        Raises `UidConflict` when a key already holds a row from another writer or with
        other content: the caller must reload and take fresh uids. Nothing is overwritten.
        """
        rows = [e.to_row(writer) for e in events]
        if not rows:
            return
        if self.read_only:
            raise StoreError(self.read_only_line())
        with self._lock, self._exclusive() as alone:
            self._append(rows, alone)

    def _append(self, rows: list[dict[str, Any]], alone: bool) -> None:
        """Look the keys up (BTree), then append the new rows as they are: a plain append is a few ms
        at any size, where `merge_insert` joins against the whole table (and commits a version even
        when it inserts nothing). A key that is already ours with the same content is a retry and is
        skipped; another writer's is a `UidConflict`.

        `alone`: under the lock file, no other process can append between the look-up and the
        append. Without it (object storage, shared by machines), two writers can both append a key;
        each then reads the key again and keeps going only if its row is the one that counts
        (`winner`: the first committed), so exactly one of them is told its event is saved."""
        if not alone and not self._first_commit and self._events.count_rows():
            raise StoreError(f"the events table of the store at {self.shown} was made by an older mfs_nb, whose rows "
                             "cannot settle a race between two machines; it can be read but not written on object "
                             "storage: export its sessions (`%mfs export`) and go on in a new store")
        keys = ", ".join(quote(r["key"]) for r in rows)
        with self._writing("events"):
            # alone, nobody committed since our own last append, and every uid is past those we wrote:
            # the keys cannot exist, and the look-up (most of a write's time) is skipped
            fresh = (alone and self._events_version is not None and self._events.version == self._events_version
                     and all(r["uid"] > self._wrote_upto.get(r["session"], 0) for r in rows))
            found = {} if fresh else self._rows_under(keys)
            new = []
            for row in rows:
                have = self._winner(found.get(row["key"], []))
                if have is None:
                    new.append(row)
                elif have["writer"] != row["writer"] or have["sha256"] != row["sha256"]:
                    raise UidConflict(f"uid {row['uid']} of session {row['session']!r} was written by another kernel")
            self._events_version = None  # unknown until the append below has committed
            if new:
                self._events.add(pa.Table.from_pylist(new, schema=EVENTS_SCHEMA))
            for r in rows:
                self._wrote_upto[r["session"]] = max(self._wrote_upto.get(r["session"], 0), r["uid"])
            if new and not alone:
                self._check_own(new)
        self._after_write()
        if alone:
            self._events_version = self._events.version

    def _rows_under(self, keys: str) -> dict[str, list[dict[str, Any]]]:
        """The rows stored under the quoted `keys`, with what decides between two of them."""
        found: dict[str, list[dict[str, Any]]] = {}
        if not self._events.count_rows():
            return found
        query = self._events.search().where(f"key IN ({keys})").select(["key", "writer", "sha256", "created_at"])
        for r in query.with_row_id(True).limit(None).to_list():
            found.setdefault(r["key"], []).append(r)
        return found

    def _winner(self, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        return winner(rows, self._first_commit)

    @contextmanager
    def _exclusive(self) -> Iterator[bool]:
        """Across processes on one machine, one event write at a time (a lock file beside the tables);
        yields whether it holds that lock.

        Object-storage stores have no such lock (it would not protect two machines); there `_append`
        settles a race after the fact."""
        if not self.is_local or fcntl is None:
            yield False
            return
        try:  # a read-only or unwritable store fails here, before anything is written
            fh = open(Path(self.uri) / ".events.lock", "a+b")  # noqa: SIM115 (closed by the with below)
        except OSError as exc:
            raise StoreError(store_problem(self.uri, "events", exc)) from exc
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _check_own(self, rows: list[dict[str, Any]]) -> None:
        """Each key must now resolve to our row. Two writers that appended one key both read it again
        after their commits; the later committer sees the earlier one's row, and only one wins."""
        stored = self._rows_under(", ".join(quote(r["key"]) for r in rows))
        for row in rows:
            have = self._winner(stored.get(row["key"], []))
            if have is None or have["writer"] != row["writer"] or have["sha256"] != row["sha256"]:
                raise UidConflict(
                    f"uid {row['uid']} of session {row['session']!r} was written by another kernel"
                )

    def _after_write(self) -> None:
        """Every _OPTIMIZE_EVERY writes, fold the new rows into the table's fragments and its
        key/session/uid indexes (rows written since are scanned: a few hundred at most), and remove
        versions older than `_FOLD_KEEP_S`: every write is a version, and with all of them kept a
        write, and the fold itself, grew slower as the log grew (a fold took 0.7 s at 4,000 versions).
        Not after each big write: `optimize` also merges the fragments, and an import of 100k events
        in batches of 5,000 then rewrote the table 20 times (177 MB of versions for 15 MB of text).
        The fold runs beside the turn (`_fold_beside`): it rewrites the whole table, so inline it grew
        with the log."""
        self._fold(self._events, "events")

    def load_events(self, session: str, uid_from: int | None = None, uid_to: int | None = None) -> list[Event]:
        """Events of a session in uid order, optionally within [uid_from, uid_to]."""
        where = f"session = {quote(session)}"
        if uid_from is not None:
            where += f" AND uid >= {int(uid_from)}"
        if uid_to is not None:
            where += f" AND uid <= {int(uid_to)}"
        try:
            table = self._events.search().where(where).limit(None).to_arrow() if self._events.count_rows() else None
        except Exception as exc:  # a damaged data file: one line that names the table and what to do
            raise StoreError(store_problem(self.uri, "events", exc)) from exc
        if table is None or not table.num_rows:
            return []
        columns = table.to_pydict()
        keys = columns["key"]
        if len(set(keys)) == len(keys):  # the usual case: one row per key, read column-wise
            events = Event.from_columns(columns)
        else:  # a race between two kernels left two rows under a key: the winner's row counts
            by_key: dict[str, list[dict[str, Any]]] = {}
            with self._writing("events"):  # read again with the row ids that decide (only here: they cost)
                rows = self._events.search().where(where).with_row_id(True).limit(None).to_list()
            for r in rows:
                by_key.setdefault(r["key"], []).append(r)
            events = [Event.from_row(r) for r in (self._winner(g) for g in by_key.values()) if r is not None]
        events.sort(key=lambda e: e.uid)
        return events

    def sessions(self) -> list[str]:
        """Every session name that has events or saved settings."""
        names = set()
        if self._events.count_rows():
            names.update(self._events.to_arrow().column("session").unique().to_pylist())
        if self._sessions.count_rows():
            names.update(self._sessions.to_arrow().column("session").to_pylist())
        return sorted(names)
