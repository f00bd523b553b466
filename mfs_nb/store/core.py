"""The tables every part of the store shares: opening them, writing under one lock, folding versions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import StoreError
from .connection import (
    REMOTE_KEEP_S,
    lance_session,
    lancedb_module,
    resolve_uri,
    scrub,
    shown_uri,
    store_problem,
    table_names,
    unwritable,
)
from .files import TableFiles
from .salvage import layout
from .schemas import (
    COMPACTIONS_SCHEMA,
    EVENTS_SCHEMA,
    FILES_SCHEMA,
    FIRST_COMMIT,
    LEASES_SCHEMA,
    LEDGER_SCHEMA,
    SESSIONS_SCHEMA,
    VERBATIM_SCHEMA,
    create_table,
    ensure_event_indexes,
)

# A table accumulates one fragment per write; compacting now and then keeps reads fast.
_OPTIMIZE_EVERY = 200
# The tables a compaction reads several times (the lease, the protocol rows, the state row) are folded
# more often: a scan, and a keyed write, cost about 0.15 ms per fragment (20 ms at 100 fragments, 5 ms
# at 10), and these tables stay small, so a fold of them is cheap (about 1 ms a write at 25).
_FOLD_OFTEN = {"leases": 25, "compactions": 25, "sessions": 25}
# versions the in-turn fold keeps: every reader here reads the latest version (read_consistency_interval
# 0), so an older one is needed only by a read under way in another kernel, for a second or so. Kept
# longer, a session chatting fast (a replay, a benchmark) piles up thousands and every write slows
_FOLD_KEEP_S = 15.0
# the tables whose fold runs beside the turn, in a thread of its own: append-only, so an append that
# commits while a fold (which rewrites the table's fragments: all of them while the table is under
# LanceDB's million-row target, 0.2 s at 400 events and 0.5 s at 4,000 here) runs does not conflict
# with it; under appends a few ms apart the fold can still lose its commit race, and the next one
# takes the rows
_FOLD_BESIDE = ("events",)


def _read_only_mount(path: str) -> bool:
    """Whether the file system holding `path` is mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class StoreCore:
    """One LanceDB database holding any number of sessions."""

    def __init__(self, uri: str | os.PathLike[str] | None = None, *, read_only: bool = False):
        self.uri = resolve_uri(uri)
        # opened for reading only: asked for (`read_only`), or a local folder this process may not write
        # (a read-only mount, another user's folder); every write is refused before it starts, in one line
        self.asked_read_only = bool(read_only)
        self.read_only = self.asked_read_only or (self.is_local and os.path.isdir(self.uri)
                                                  and not os.access(self.uri, os.W_OK))
        try:
            lancedb = lancedb_module()

            # Every read sees the latest version, so another kernel's writes are never missed.
            self._db = lancedb.connect(self.uri, read_consistency_interval=timedelta(0), session=lance_session())
            self._check_core_tables()
            if self.read_only and not table_names(self._db):
                raise StoreError(f"there is no mfs_nb store at {self.shown} to read (no tables there); "
                                 "a store opened read-only is never created")
            self._events = self._table("events", EVENTS_SCHEMA, stable_ids=True)
            self._first_commit = (self._events.schema.metadata or {}).items() >= FIRST_COMMIT.items()
            if not self.read_only:
                ensure_event_indexes(self._events)
            self._sessions = self._table("sessions", SESSIONS_SCHEMA)
            self._ledger = self._table("ledger", LEDGER_SCHEMA)
            self._compactions = self._table("compactions", COMPACTIONS_SCHEMA)
            self._verbatim = self._table("verbatim", VERBATIM_SCHEMA)
            self._leases = self._table("leases", LEASES_SCHEMA)
            if not self.is_local:  # created now, not by the first snapshot's write (a race there is costlier)
                self._table("files", FILES_SCHEMA)
        except StoreError:
            raise
        except Exception as exc:  # lancedb raises many types; the user needs one line
            raise StoreError(store_problem(self.uri, "", exc)) from exc
        self._lock = threading.Lock()
        self._fold_lock = threading.Lock()  # one fold of a `_FOLD_BESIDE` table at a time (and not during `maintain`)
        self._folder: threading.Thread | None = None  # the fold running beside the turns, if any
        self._writes: dict[str, int] = {}  # per table, writes by this Store (see `_fold`)
        self._events_version: int | None = None  # the events table's version after our last append
        self._wrote_upto: dict[str, int] = {}  # per session, the highest uid this Store appended
        self._created: dict[str, str] = {}  # per session, when its state row was first written
        # tables opened on first use (they may not exist: a store never indexed, a session never charted)
        self._calls_table: Any = None
        self._recall_text_table: Any = None
        self._recall_windows_table: Any = None
        self._recall_state_table: Any = None
        self._recall_vector_tables: dict[str, Any] = {}
        self._recall_latent_tables: dict[str, Any] = {}
        self._ann: dict[str | None, bool] = {}  # per model, whether its vectors have an ANN index

    @property
    def shown(self) -> str:
        """The URI as messages, exports and status show it: never a password it may carry."""
        return shown_uri(self.uri)

    @property
    def files(self) -> Any:
        """Where snapshots go: a folder beside a local store's tables; on object storage a table of the
        store itself (one place for everything, nothing left on the machine that wrote it)."""
        from ..layers.snapshots import Folder

        if not self.is_local:
            return TableFiles(lambda: self._table("files", FILES_SCHEMA), self._lock, self._reading, self._writing)
        uri = self.uri

        class LocalFiles(Folder):
            """A folder whose writes on a read-only store say so in one line (`StoreError`)."""

            def touch(self, rel: str) -> None:
                with store._writing("attachments folder"), unwritable(uri, "attachments folder"):
                    super().touch(rel)

            def put(self, rel: str, data: bytes) -> None:
                with store._writing("attachments folder"), unwritable(uri, "attachments folder"):
                    super().put(rel, data)

            def remove(self, rel: str) -> None:
                with store._writing("attachments folder"), unwritable(uri, "attachments folder"):
                    super().remove(rel)

        store = self
        return LocalFiles(uri)

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    def writable(self) -> bool:
        """Whether this process may write the store: not when it was opened read-only, nor a folder it may
        not write (a read-only mount, a folder of another user); a store on object storage is taken as
        writable (a write says otherwise)."""
        return not self.read_only and (not self.is_local or os.access(self.uri, os.W_OK))

    def read_only_line(self) -> str:
        """The one line every write on a read-only store answers: why it is read-only, and how to go on."""
        if self.asked_read_only:
            why = "opened read-only"
        elif self.is_local and _read_only_mount(self.uri):
            why = "read-only (a read-only file system)"
        else:
            why = "read-only for this user (no permission to write its folder)"
        return (f"the store at {self.shown} is {why}: nothing new can be saved there; to go on, copy the session "
                "into a writable store with `%mfs fork NAME --store PATH` (or set MFS_STORE to a writable folder)")

    def _check_core_tables(self) -> None:
        """A store that has tables but lacks the events or sessions table is damaged: say so, naming
        the table, instead of creating it empty (which would restart uids at 1)."""
        names = table_names(self._db)
        if not names:
            return
        for core in ("events", "sessions"):
            # a store is created events first: events with no rows (or listed but not yet readable) and no
            # sessions table is another kernel creating the store this very moment, not damage
            if core not in names and (core != "sessions" or self._events_rows()):
                raise StoreError(f"table {core} is missing from the store at {self.shown} (it has "
                                 f"{', '.join(sorted(names))}); nothing was changed: run `mfs-nb doctor --store "
                                 f"{self.shown}` to see what can be recovered")

    def _events_rows(self) -> int:
        try:
            return int(self._db.open_table("events").count_rows())
        except Exception:  # listed, not yet readable: another kernel is creating it now
            return 0

    def _table(self, name: str, schema: pa.Schema, stable_ids: bool = False) -> Any:
        try:
            return self._db.open_table(name)
        except (FileNotFoundError, ValueError):
            if self.read_only:  # nothing is created in a store opened for reading
                raise StoreError(f"table {name} is not in the store at {self.shown}, which is read-only here, so it "
                                 "cannot be made; open the store writable once (a newer mfs_nb adds it)") from None
            try:
                return create_table(self._db, name, schema, stable_ids=stable_ids)
            except Exception as exc:  # another kernel created it between our two calls (a commit conflict on S3)
                for wait in (0.0, 0.1, 0.3, 1.0):  # ... whose first version may take a moment to be readable
                    time.sleep(wait)
                    try:
                        return self._db.open_table(name)
                    except Exception:
                        continue
                # it was not that: say why it could not be created (a read-only store)
                raise StoreError(store_problem(self.uri, name, exc)) from exc

    @contextmanager
    def _writing(self, table: str) -> Iterator[None]:
        """A failed write (read-only store, full disk, damaged table) is one line naming the table; on a
        store opened read-only the write is refused before it starts."""
        if self.read_only:
            raise StoreError(self.read_only_line())
        with self._reading(table):
            yield

    @contextmanager
    def _reading(self, table: str) -> Iterator[None]:
        """A failed read of the table (gone, damaged, unreachable) is one line naming it."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(store_problem(self.uri, table, exc)) from exc

    def _fold(self, table: Any, name: str) -> None:
        """Every _OPTIMIZE_EVERY writes of this Store to the table `name` (`_FOLD_OFTEN` for the small ones a
        compaction reads), fold it (see `_after_write`); for every table written turn by turn: the log, the
        state row, leases, compactions, ledger, verdicts, vectors. The log's fold grows with the log, so it
        runs beside the turn (`_fold_beside`); the others are small, or grow slowly, and fold in place."""
        self._writes[name] = n = self._writes.get(name, 0) + 1
        if self.read_only:
            return
        if n % _FOLD_OFTEN.get(name, _OPTIMIZE_EVERY) == 0:
            if name in _FOLD_BESIDE:
                self._fold_beside(name)
                return
            try:
                table.optimize(cleanup_older_than=self._keep())
            except Exception:  # compaction is an optimisation; a failure loses nothing
                pass

    def _fold_beside(self, name: str) -> None:
        """Fold the table `name` in a thread of its own, with a handle of its own, so the write that made
        it due returns at once (in a 5,000-chat session the fold inline was the slowest part of one chat
        in a hundred, and grew with the log). One at a time: while one runs, a due fold is skipped (the
        next one, 200 writes on, takes these rows too); `settle` waits for it."""
        if not self._fold_lock.acquire(blocking=False):
            return

        def work() -> None:
            try:
                self._db.open_table(name).optimize(cleanup_older_than=self._keep())
            except Exception:  # compaction is an optimisation; a failure loses nothing
                pass
            finally:
                self._fold_lock.release()

        try:
            self._folder = threading.Thread(target=work, daemon=True, name=f"mfs-fold-{name}")
            self._folder.start()
        except Exception:  # no thread to be had (interpreter shutting down): no fold this time
            self._fold_lock.release()

    def settle(self, wait_s: float | None = None) -> bool:
        """Wait up to `wait_s` seconds (None: as long as it takes) for a fold running beside the turns;
        whether none is left running."""
        folder = self._folder
        if folder is not None:
            folder.join(wait_s)
        return folder is None or not folder.is_alive()

    def _keep(self, keep_s: float | None = None) -> timedelta:
        """How old a version must be for a fold to remove it: `keep_s`, and on object storage at least
        `REMOTE_KEEP_S` (machines' clocks may differ)."""
        keep_s = _FOLD_KEEP_S if keep_s is None else keep_s
        return timedelta(seconds=keep_s if self.is_local else max(keep_s, REMOTE_KEEP_S))

    # -- table maintenance (`%mfs optimize`) --------------------------------------------------
    def maintain(self, keep_s: float = 86_400.0, stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Compact every table's small fragments and remove versions older than `keep_s` seconds (a
        reader or writer still on an older version, and `mfs-nb doctor`'s salvage, need them no longer
        than that); on object storage, shared by machines whose clocks may differ, versions are kept
        at least `REMOTE_KEEP_S` (an hour) whatever `keep_s` says. Returns, per
        table, versions, fragments and bytes before and after; a table that fails is reported, the
        others go on. Nothing a session reads is changed: only how the tables are laid out. `stop()`
        true between two tables ends it there (`stopped` in the report)."""
        if self.read_only:
            raise StoreError(self.read_only_line())
        started = time.monotonic()
        report: dict[str, Any] = {"tables": {}, "errors": {}, "stopped": False}
        for name in sorted(table_names(self._db)):
            if stop is not None and stop():
                report["stopped"] = True
                break
            try:
                table = self._db.open_table(name)
                before = layout(table, Path(self.uri) / f"{name}.lance" if self.is_local else None)
                with self._fold_lock, self._lock:
                    table.optimize(cleanup_older_than=self._keep(keep_s))
                after = layout(table, Path(self.uri) / f"{name}.lance" if self.is_local else None)
                report["tables"][name] = {"before": before, "after": after}
            except Exception as exc:  # maintenance is an optimisation; a failure loses nothing
                report["errors"][name] = scrub(" ".join(str(exc).split()))[:200]
        for key in ("versions", "fragments", "bytes"):
            report[key] = [sum(t["before"][key] for t in report["tables"].values()),
                           sum(t["after"][key] for t in report["tables"].values())]
        report["seconds"] = round(time.monotonic() - started, 3)
        return report

