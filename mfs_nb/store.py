"""The LanceDB boundary (docs/architecture.md, "Storage"): the only module that imports lancedb.

Tables:
- ``events``   the append-only log; one row per (session, uid); never updated or deleted.
- ``sessions`` one row per session: saved settings (never secrets) and the usage anchor.
- ``ledger``   one row per memory-layer action (clearing, compaction, rejection, failure).

Every row has a stable key, so a retried write never duplicates. Two kernels on one store cannot
overwrite each other's events: an event is appended only when its key is new (one writer at a time
under a lock file on a local store), and on object storage, where two machines can append one key at
the same moment, each checks afterwards that the row that counts is its own (else `UidConflict`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock; the after-write check still holds
    fcntl = None  # type: ignore[assignment]

from .errors import StoreError
from .events import Event, now_iso
from .origin import unit

DEFAULT_STORE = ".mfs"
_REMOTE_KEEP_S = 3600.0  # object storage: old versions outlive any clock skew between machines

_REST_CLIENT = "lance_namespace_urllib3_client"
_import_lock = threading.Lock()


def lancedb_module() -> Any:
    """`import lancedb`, about 1 s faster (issue 17: the first reply after `%load_ext` waits on it).

    `import lancedb` pulls in `lance_namespace`, which imports the models of the generated REST
    client for remote namespaces; the client package's `__init__` also imports its nine API
    modules, whose pydantic validators take about 1.2 s of the 1.7 s import on this machine. A
    local or object-store database never calls them. So, unless something already imported the
    client, the package is registered with its real search path but without running its
    `__init__`: submodules (`.models`, `.api.table_api`) import normally, and the first access to
    anything the `__init__` defines runs it for real. If the package is not where it is expected,
    nothing is changed.
    """
    with _import_lock:
        if "lancedb" not in sys.modules and _REST_CLIENT not in sys.modules:
            _defer_package_init(_REST_CLIENT)
        import lancedb

    return lancedb


def _defer_package_init(name: str) -> None:
    import importlib.util
    import types

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return

    class Deferred(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            self.__class__ = types.ModuleType  # from here on an ordinary module
            spec.loader.exec_module(self)  # type: ignore[union-attr]
            return getattr(self, attr)

    module = Deferred(name)
    module.__spec__ = spec
    module.__path__ = list(spec.submodule_search_locations)
    module.__file__ = spec.origin
    module.__package__ = name
    module.__loader__ = spec.loader
    sys.modules[name] = module


EVENTS_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("uid", pa.int64()),
        ("turn", pa.int64()),
        ("turn_start", pa.bool_()),
        ("role", pa.string()),
        ("origin", pa.string()),
        ("content", pa.large_string()),
        ("tool_calls", pa.large_string()),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
        ("sha256", pa.string()),
        ("created_at", pa.string()),
        ("writer", pa.string()),
    ]
)
NOTEBOOKS_SCHEMA = pa.schema([("notebook", pa.string()), ("data", pa.string()), ("updated_at", pa.string())])

SESSIONS_SCHEMA = pa.schema(
    [
        ("session", pa.string()),
        ("settings", pa.string()),
        ("anchor", pa.string()),
        ("created_at", pa.string()),
        ("updated_at", pa.string()),
    ]
)
LEDGER_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("seq", pa.int64()),
        ("time", pa.string()),
        ("kind", pa.string()),
        ("data", pa.string()),
    ]
)

COMPACTIONS_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("seq", pa.int64()),
        ("phase", pa.string()),
        ("time", pa.string()),
        ("data", pa.large_string()),
    ]
)

# The compaction lease (lease.py): claim / renew / release rows, appended only.
LEASES_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("claim", pa.string()),
        ("kind", pa.string()),
        ("owner", pa.string()),
        ("expires", pa.float64()),
        ("time", pa.string()),
    ]
)

CALLS_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("call", pa.int64()),
        ("data", pa.string()),
    ]
)

VERBATIM_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("uid", pa.int64()),
        ("disposition", pa.string()),
        ("source", pa.string()),
        ("data", pa.large_string()),
        ("model", pa.string()),
        ("created_at", pa.string()),
    ]
)


# Vectors and latent weights are stored as float16: half the bytes of float32 (a 384-d vector is 768
# bytes, for a chat message of ~120), and cosine ranks agree to about 1e-3. Tables an older mfs_nb made
# in float32 are read and written as they are (every write takes the table's own schema).
VECTOR_TYPE = pa.float16()


def _vectors_schema(model_id: str, dim: int) -> pa.Schema:
    """One vectors table per embedding model: its id is in the table's metadata, so two vector
    spaces never share a table."""
    return pa.schema([("key", pa.string()), ("session", pa.string()), ("uid", pa.int64()),
                      ("vector", pa.list_(VECTOR_TYPE, dim))],
                     metadata={"embedding_model": model_id, "dim": str(dim)})


def vectors_table_name(model_id: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", model_id).strip("_").lower()
    return f"vectors_{slug}_{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"


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


class UidConflict(StoreError):
    """Another writer already holds some of these uids; reload and append again."""


# An events table created with stable row ids says so in its schema: there, of two rows under one key
# the first committed wins (its row id is smaller, and stays so through compaction).
_FIRST_COMMIT = {b"mfs.duplicate_key_winner": b"first_commit"}


def _create(db: Any, name: str, schema: pa.Schema, *, stable_ids: bool = False, data: pa.Table | None = None) -> Any:
    """A new table; `stable_ids`: row ids in commit order that compaction keeps, said in the schema
    (the events table: see `_winner`)."""
    if not stable_ids:
        return db.create_table(name, data=data, schema=schema)
    return db.create_table(name, data=data, schema=schema.with_metadata(_FIRST_COMMIT),
                           storage_options={"new_table_enable_stable_row_ids": "true"})


def _winner(rows: list[dict[str, Any]], first_commit: bool = False) -> dict[str, Any] | None:
    """The row that holds a key, the same for every reader at any time.

    Only a race between two writers without a shared lock (object storage) leaves two rows under one
    key; the loser notices at once (`Store._check_own`) and appends its event again under a fresh
    uid, so nothing is lost. The winner is the first committed row: any reader that sees the later
    row sees the earlier one too, so nobody ever sees a winner that is later replaced. Tables made
    before stable row ids fall back to the earliest stamp (ties by writer id).
    """
    if not rows:
        return None
    if first_commit and all("_rowid" in r for r in rows):
        return min(rows, key=lambda r: r["_rowid"])
    return min(rows, key=lambda r: (r["created_at"], r["writer"]))


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# environment variables whose values must never reach a message (object-storage credentials)
_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AZURE_STORAGE_ACCOUNT_KEY",
                "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN",
                "AZURE_STORAGE_TOKEN", "AZURE_CLIENT_SECRET", "GOOGLE_SERVICE_ACCOUNT_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS")


def shown_uri(uri: str) -> str:
    """A store URI fit to print: a `user:password@` part removed (an Azure `container@account` stays)."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@:]*:[^/@]*@", r"\1", uri, flags=re.I)


def _scrub(text: str) -> str:
    for var in _SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    text = re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]*:[^/@\s]*@", r"\1", text)  # user:password@ in a URI
    return re.sub(r"(?i)\b(signature|credential|token|secret|password|sig|key)=[^&\s\"]+", r"\1=***", text)


def read_only_error(exc: BaseException) -> bool:
    """Whether `exc` (or its cause) says the store cannot be written: a read-only file system, or a
    folder this user may not write (EROFS, EACCES, EPERM), however lance or the OS words it."""
    import errno

    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return True
        if isinstance(exc, PermissionError) or re.search(
                r"read-only file system|permission denied|operation not permitted|os error (30|13|1)\b", str(exc), re.I):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


@contextmanager
def _unwritable(uri: str, what: str) -> Iterator[None]:
    """An OSError that says the store cannot be written becomes a `StoreError` with one line; any
    other error passes as it is."""
    try:
        yield
    except OSError as exc:
        if not read_only_error(exc):
            raise
        raise StoreError(_store_problem(uri, what, exc)) from exc


def _store_problem(uri: str, table: str, exc: BaseException) -> str:
    """One line for a store that cannot be read or written, naming the store but never a secret."""
    full = _scrub(" ".join(f"{exc} {exc.__cause__ or ''}".split()))
    text = full[:200]
    uri = shown_uri(uri)
    where = f"table {table} of the store at {uri}" if table else f"the store at {uri}"
    if re.search(r"NoSuchBucket|bucket does not exist|ContainerNotFound|bucket.{0,40}not found", full, re.I):
        return (f"{where}: the bucket does not exist (or these credentials cannot see it); create it or fix the "
                "store URI (MFS_STORE or the `store` setting)")
    if re.search(r"credentials|InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|status: 40[13]\b", full, re.I):
        return (f"{where}: the credentials are missing or refused; set them in the environment (for S3 "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL for another S3 server) — they "
                "are read from there and never saved")
    if re.search(r"connection refused|tcp connect|timed? ?out|dns error|failed to lookup address|"
                 r"error sending request", full, re.I) and "://" in uri:
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the provider's endpoint"
        return (f"{where}: {endpoint} cannot be reached (refused or timed out); check the endpoint "
                "(AWS_ENDPOINT_URL) and the network, then re-run")
    if read_only_error(exc):
        what = (f", {table}" if table.endswith(" folder") else f", table {table}") if table else ""
        if re.search(r"read-only file system|os error 30", full, re.I):
            said = f"is read-only (a read-only file system{what})"
        else:
            said = f"is read-only or not accessible to this user (permission denied{what})"
        return (f"the store at {uri} {said}: nothing new can be saved there; make the folder writable, or set "
                "MFS_STORE to a writable folder (a copy of this one keeps its sessions)")
    if "://" not in uri and Path(uri).exists() and not Path(uri).is_dir():
        return (f"{uri} is a file, not a store folder: set MFS_STORE (or --store) to the folder that holds the "
                "store's tables, or to a new folder")
    if re.search(r"no space|os error 28|disk full|quota", text, re.I):
        return f"{where}: the disk is full; free space and re-run (nothing acknowledged was lost) ({text})"
    return f"{where} cannot be read or written ({text}); run `mfs-nb doctor --store {uri}`"


# LanceDB caches the metadata of every table version it reads, and a chat writes a version per event:
# with its default cache a process grew by 0.38 MB a chat. Each Store gets a bounded cache of its own
# (its own, not one per process: the cache also holds the object-store client of each bucket, which
# must follow the credentials and endpoint in the environment when a Store is opened). Entries of past
# versions are never read again (every read here takes the latest one) but keep the cache full: at
# 128/64 MB it was the largest part of a long session's growth (metadata full by chat 600, the index part
# +0.8 MB per 100 chats); at 16/16 MB the growth by chat 1,000 halved (110 → 56 MB).
_CACHE_MB = {"index": 32, "metadata": 16}


def _lance_session() -> Any:
    return lancedb_module().Session(index_cache_size_bytes=_CACHE_MB["index"] << 20,
                                    metadata_cache_size_bytes=_CACHE_MB["metadata"] << 20)


def resolve_uri(store: str | os.PathLike[str] | None) -> str:
    """The store location: the argument, else ``MFS_STORE``, else ``./.mfs``. URIs pass through."""
    uri = str(store) if store else os.environ.get("MFS_STORE") or DEFAULT_STORE
    if "://" in uri:
        return uri
    return str(Path(uri).expanduser().resolve())


class Store:
    """One LanceDB database holding any number of sessions."""

    def __init__(self, uri: str | os.PathLike[str] | None = None):
        self.uri = resolve_uri(uri)
        try:
            lancedb = lancedb_module()

            # Every read sees the latest version, so another kernel's writes are never missed.
            self._db = lancedb.connect(self.uri, read_consistency_interval=timedelta(0), session=_lance_session())
            self._check_core_tables()
            self._events = self._table("events", EVENTS_SCHEMA, stable_ids=True)
            self._first_commit = (self._events.schema.metadata or {}).items() >= _FIRST_COMMIT.items()
            _ensure_event_indexes(self._events)
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
            raise StoreError(_store_problem(self.uri, "", exc)) from exc
        self._lock = threading.Lock()
        self._writes: dict[str, int] = {}  # per table, writes by this Store (see `_fold`)
        self._events_version: int | None = None  # the events table's version after our last append
        self._wrote_upto: dict[str, int] = {}  # per session, the highest uid this Store appended
        self._created: dict[str, str] = {}  # per session, when its state row was first written

    @property
    def shown(self) -> str:
        """The URI as messages, exports and status show it: never a password it may carry."""
        return shown_uri(self.uri)

    @property
    def files(self) -> Any:
        """Where snapshots go: a folder beside a local store's tables; on object storage a table of the
        store itself (one place for everything, nothing left on the machine that wrote it)."""
        from .snapshots import Folder

        if not self.is_local:
            return TableFiles(self)
        uri = self.uri

        class LocalFiles(Folder):
            """A folder whose writes on a read-only store say so in one line (`StoreError`)."""

            def touch(self, rel: str) -> None:
                with _unwritable(uri, "attachments folder"):
                    super().touch(rel)

            def put(self, rel: str, data: bytes) -> None:
                with _unwritable(uri, "attachments folder"):
                    super().put(rel, data)

            def remove(self, rel: str) -> None:
                with _unwritable(uri, "attachments folder"):
                    super().remove(rel)

        return LocalFiles(uri)

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    def writable(self) -> bool:
        """Whether this process may write the store's folder (a read-only mount, or a folder of another
        user, says no); a store on object storage is taken as writable (a write says otherwise)."""
        return not self.is_local or os.access(self.uri, os.W_OK)

    def _check_core_tables(self) -> None:
        """A store that has tables but lacks the events or sessions table is damaged: say so, naming
        the table, instead of creating it empty (which would restart uids at 1)."""
        names = _table_names(self._db)
        if not names:
            return
        for core in ("events", "sessions"):
            # a store is created events first: events with no rows and no sessions table is another
            # kernel creating the store this very moment, not damage
            if core not in names and (core != "sessions" or self._db.open_table("events").count_rows()):
                raise StoreError(f"table {core} is missing from the store at {self.shown} (it has "
                                 f"{', '.join(sorted(names))}); nothing was changed: run `mfs-nb doctor --store "
                                 f"{self.shown}` to see what can be recovered")

    def _table(self, name: str, schema: pa.Schema, stable_ids: bool = False) -> Any:
        try:
            return self._db.open_table(name)
        except (FileNotFoundError, ValueError):
            try:
                return _create(self._db, name, schema, stable_ids=stable_ids)
            except Exception as exc:  # another kernel created it between our two calls (a commit conflict on S3)
                try:
                    return self._db.open_table(name)
                except Exception:  # it was not that: say why it could not be created (a read-only store)
                    raise StoreError(_store_problem(self.uri, name, exc)) from exc

    # -- events: append only -------------------------------------------------------------
    def append_events(self, events: Iterable[Event], writer: str) -> None:
        """Insert events whose keys are new. Retrying the same write is a no-op.

        Raises `UidConflict` when a key already holds a row from another writer or with
        other content: the caller must reload and take fresh uids. Nothing is overwritten.
        """
        rows = [e.to_row(writer) for e in events]
        if not rows:
            return
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
        (`_winner`: the first committed), so exactly one of them is told its event is saved."""
        if not alone and not self._first_commit and self._events.count_rows():
            raise StoreError(f"the events table of the store at {self.shown} was made by an older mfs_nb, whose rows "
                             "cannot settle a race between two machines; it can be read but not written on object "
                             "storage: export its sessions (`%mfs export`) and go on in a new store")
        keys = ", ".join(_quote(r["key"]) for r in rows)
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
        return _winner(rows, self._first_commit)

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
            raise StoreError(_store_problem(self.uri, "events", exc)) from exc
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextmanager
    def _writing(self, table: str) -> Iterator[None]:
        """A failed write (read-only store, full disk, damaged table) is one line naming the table."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(_store_problem(self.uri, table, exc)) from exc

    def _check_own(self, rows: list[dict[str, Any]]) -> None:
        """Each key must now resolve to our row. Two writers that appended one key both read it again
        after their commits; the later committer sees the earlier one's row, and only one wins."""
        stored = self._rows_under(", ".join(_quote(r["key"]) for r in rows))
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
        in batches of 5,000 then rewrote the table 20 times (177 MB of versions for 15 MB of text)."""
        self._fold(self._events, "events")

    def _fold(self, table: Any, name: str) -> None:
        """Every _OPTIMIZE_EVERY writes of this Store to the table `name` (`_FOLD_OFTEN` for the small ones a
        compaction reads), fold it (see `_after_write`); for every table written turn by turn: the log, the
        state row, leases, compactions, ledger, verdicts, vectors."""
        self._writes[name] = n = self._writes.get(name, 0) + 1
        if n % _FOLD_OFTEN.get(name, _OPTIMIZE_EVERY) == 0:
            try:
                table.optimize(cleanup_older_than=self._keep(_FOLD_KEEP_S))
            except Exception:  # compaction is an optimisation; a failure loses nothing
                pass

    def _keep(self, keep_s: float) -> timedelta:
        """How old a version must be for a fold to remove it: `keep_s`, and on object storage at least
        `_REMOTE_KEEP_S` (machines' clocks may differ)."""
        return timedelta(seconds=keep_s if self.is_local else max(keep_s, _REMOTE_KEEP_S))

    def load_events(self, session: str, uid_from: int | None = None, uid_to: int | None = None) -> list[Event]:
        """Events of a session in uid order, optionally within [uid_from, uid_to]."""
        where = f"session = {_quote(session)}"
        if uid_from is not None:
            where += f" AND uid >= {int(uid_from)}"
        if uid_to is not None:
            where += f" AND uid <= {int(uid_to)}"
        try:
            table = self._events.search().where(where).limit(None).to_arrow() if self._events.count_rows() else None
        except Exception as exc:  # a damaged data file: one line that names the table and what to do
            raise StoreError(_store_problem(self.uri, "events", exc)) from exc
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

    # -- sessions: settings and anchor (state, not log) -----------------------------------
    def load_meta(self, session: str) -> dict[str, Any]:
        if not self._sessions.count_rows():
            return {}
        rows = self._sessions.search().where(f"session = {_quote(session)}").limit(None).to_list()
        if not rows:
            return {}
        row = rows[0]
        return {
            "settings": json.loads(row["settings"] or "{}"),
            "anchor": json.loads(row["anchor"] or "null"),
            "created_at": row["created_at"],
        }

    def save_meta(self, session: str, *, settings: dict[str, Any], anchor: Any) -> None:
        """Write the session's settings and anchor (secrets must already be removed)."""
        created = self._created.get(session)
        if created is None:  # read once per session: a turn's save does not read the table
            created = self._created[session] = self.load_meta(session).get("created_at") or now_iso()
        row = {
            "session": session,
            "settings": json.dumps(settings, sort_keys=True),
            "anchor": json.dumps(anchor, sort_keys=True),
            "created_at": created,
            "updated_at": now_iso(),
        }
        with self._lock, self._writing("sessions"):
            (
                self._sessions.merge_insert("session")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist([row], schema=SESSIONS_SCHEMA))
            )
            self._fold(self._sessions, "sessions")

    # -- notebooks: what follows the person across sessions and kernel restarts ------------
    def load_notebook(self, key: str) -> dict[str, Any]:
        """A notebook's record: the session `%%chat` talks to and the settings every session of that
        notebook uses (model, endpoint), as `save_notebook` wrote them; {} when there is none."""
        try:
            table = self._db.open_table("notebooks")
        except (FileNotFoundError, ValueError):
            return {}
        rows = table.search().where(f"notebook = {_quote(key)}").limit(None).to_list()
        return json.loads(rows[0]["data"] or "{}") if rows else {}

    def save_notebook(self, key: str, data: dict[str, Any]) -> None:
        """Replace a notebook's record (secrets must already be removed: it holds names, not keys)."""
        row = {"notebook": key, "data": json.dumps(data, sort_keys=True), "updated_at": now_iso()}
        with self._lock, self._writing("notebooks"):
            table = self._table("notebooks", NOTEBOOKS_SCHEMA)
            table.merge_insert("notebook").when_matched_update_all().when_not_matched_insert_all().execute(
                pa.Table.from_pylist([row], schema=NOTEBOOKS_SCHEMA))
            self._fold(table, "notebooks")

    # -- compactions: the protocol (docs/architecture.md, "The compaction protocol"), append only --
    def append_compaction(self, session: str, seq: int, phase: str, data: dict[str, Any]) -> None:
        """One protocol step (started | summary_completed | declared | finished | aborted)."""
        row = {"key": f"{session}\x1f{seq:08d}\x1f{phase}", "session": session, "seq": seq, "phase": phase,
               "time": now_iso(), "data": json.dumps(data, sort_keys=True, ensure_ascii=False)}
        with self._lock, self._writing("compactions"):
            (
                self._compactions.merge_insert("key")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist([row], schema=COMPACTIONS_SCHEMA))
            )
            self._fold(self._compactions, "compactions")

    def load_compactions(self, session: str) -> list[dict[str, Any]]:
        if not self._compactions.count_rows():
            return []
        rows = self._compactions.search().where(f"session = {_quote(session)}").limit(None).to_list()
        order = {"started": 0, "summary_completed": 1, "declared": 2, "finished": 3, "aborted": 3}
        rows.sort(key=lambda r: (r["seq"], order.get(r["phase"], 9)))
        return [{"seq": r["seq"], "phase": r["phase"], "time": r["time"], **json.loads(r["data"])} for r in rows]

    # -- the compaction lease (lease.py) ----------------------------------------------------
    def append_lease(self, session: str, claim: str, kind: str, owner: str, expires: float, n: int = 0) -> None:
        row = {"key": f"{session}\x1f{claim}\x1f{kind}\x1f{n}", "session": session, "claim": claim, "kind": kind,
               "owner": owner, "expires": float(expires), "time": now_iso()}
        with self._lock:
            try:
                (
                    self._leases.merge_insert("key")
                    .when_not_matched_insert_all()
                    .execute(pa.Table.from_pylist([row], schema=LEASES_SCHEMA))
                )
            except Exception as exc:
                raise StoreError(_store_problem(self.uri, "leases", exc)) from exc
            self._fold(self._leases, "leases")

    def load_leases(self, session: str) -> list[dict[str, Any]]:
        """The rows that can still matter: those whose expiry has not passed (a release row carries
        the longest lease lifetime, so it outlives its claim). A session tries the lease at every turn
        past the warn line, and reading all of its rows made a turn slower as the session grew."""
        if not self._leases.count_rows():
            return []
        where = f"session = {_quote(session)} AND expires > {time.time() - 1.0!r}"
        return self._leases.search().where(where).limit(None).to_list()

    # -- ledger ---------------------------------------------------------------------------
    def append_ledger(self, session: str, seq: int, kind: str, data: dict[str, Any], writer: str = "") -> dict[str, Any]:
        """One ledger row; the key carries the writer, so two kernels never overwrite each other's rows."""
        row = {
            "key": f"{session}\x1f{seq:012d}\x1f{writer}",
            "session": session,
            "seq": seq,
            "time": now_iso(),
            "kind": kind,
            "data": json.dumps(data, sort_keys=True, ensure_ascii=False),
        }
        with self._lock, self._writing("ledger"):
            (
                self._ledger.merge_insert("key")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist([row], schema=LEDGER_SCHEMA))
            )
            self._fold(self._ledger, "ledger")
        return {"seq": seq, "time": row["time"], "kind": kind, **data}

    def load_ledger(self, session: str) -> list[dict[str, Any]]:
        if not self._ledger.count_rows():
            return []
        rows = self._ledger.search().where(f"session = {_quote(session)}").limit(None).to_list()
        rows.sort(key=lambda r: (r["seq"], r["time"]))  # one writer's order is its seq; kernels interleave by time
        return [{"seq": r["seq"], "time": r["time"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]


    # -- table maintenance (`%mfs optimize`) --------------------------------------------------
    def maintain(self, keep_s: float = 86_400.0, stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Compact every table's small fragments and remove versions older than `keep_s` seconds (a
        reader or writer still on an older version, and `mfs-nb doctor`'s salvage, need them no longer
        than that); on object storage, shared by machines whose clocks may differ, versions are kept
        at least `_REMOTE_KEEP_S` (an hour) whatever `keep_s` says. Returns, per
        table, versions, fragments and bytes before and after; a table that fails is reported, the
        others go on. Nothing a session reads is changed: only how the tables are laid out. `stop()`
        true between two tables ends it there (`stopped` in the report)."""
        started = time.monotonic()
        report: dict[str, Any] = {"tables": {}, "errors": {}, "stopped": False}
        for name in sorted(_table_names(self._db)):
            if stop is not None and stop():
                report["stopped"] = True
                break
            try:
                table = self._db.open_table(name)
                before = _layout(table, Path(self.uri) / f"{name}.lance" if self.is_local else None)
                with self._lock:
                    table.optimize(cleanup_older_than=self._keep(keep_s))
                after = _layout(table, Path(self.uri) / f"{name}.lance" if self.is_local else None)
                report["tables"][name] = {"before": before, "after": after}
            except Exception as exc:  # maintenance is an optimisation; a failure loses nothing
                report["errors"][name] = _scrub(" ".join(str(exc).split()))[:200]
        for key in ("versions", "fragments", "bytes"):
            report[key] = [sum(t["before"][key] for t in report["tables"].values()),
                           sum(t["after"][key] for t in report["tables"].values())]
        report["seconds"] = round(time.monotonic() - started, 3)
        return report

    # -- the per-call history (the ledger chart): small rows appended in batches ---------------
    def _calls(self, create: bool) -> Any:
        """The calls table (None when it does not exist and `create` is false); a writer holds `_lock`."""
        if getattr(self, "_calls_table", None) is None:
            if not create and "calls" not in _table_names(self._db):
                return None
            self._calls_table = self._table("calls", CALLS_SCHEMA)
        return self._calls_table

    def append_calls(self, session: str, rows: list[dict[str, Any]], writer: str,
                     timeout: float | None = None) -> bool:
        """Insert history rows (`call`, `turn`, `tokens`, `tier`, `acted`) whose keys are new. With
        `timeout`, gives up (False) when another thread holds the store that long."""
        if not rows:
            return True
        table = [{"key": f"{session}\x1f{int(r['call']):012d}\x1f{writer}", "session": session, "call": int(r["call"]),
                  "data": json.dumps(r, sort_keys=True)} for r in rows]
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            with self._writing("calls"):
                (
                    self._calls(True).merge_insert("key")
                    .when_not_matched_insert_all()
                    .execute(pa.Table.from_pylist(table, schema=CALLS_SCHEMA))
                )
        finally:
            self._lock.release()
        return True

    def load_calls(self, session: str, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` history rows of a session, oldest first."""
        table = self._calls(False)
        if table is None or not table.count_rows():
            return []
        rows = table.search().where(f"session = {_quote(session)}").select(["call", "data"]).limit(None).to_list()
        out = [json.loads(r["data"]) for r in rows]
        out.sort(key=lambda r: (r.get("at", ""), r["call"]))  # kernels number their own calls: by time
        return out[-limit:]

    # -- verbatim track: one classification per user message, written once ------------------
    def save_verdicts(self, session: str, rows: list[dict[str, Any]]) -> None:
        """Insert classifications whose (session, uid) is new; the first one written stays, so a
        restart or another kernel renders the same track."""
        if not rows:
            return
        table = [{"key": f"{session}\x1f{int(r['uid']):012d}", "session": session, "uid": int(r["uid"]),
                  "disposition": r["disposition"], "source": r["source"],
                  "data": json.dumps(r["data"], sort_keys=True, ensure_ascii=False), "model": r.get("model") or "",
                  "created_at": now_iso()} for r in rows]
        with self._lock, self._writing("verbatim"):
            (
                self._verbatim.merge_insert("key")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist(table, schema=VERBATIM_SCHEMA))
            )
            self._fold(self._verbatim, "verbatim")

    def load_verdicts(self, session: str) -> dict[int, dict[str, Any]]:
        if not self._verbatim.count_rows():
            return {}
        rows = self._verbatim.search().where(f"session = {_quote(session)}").limit(None).to_list()
        out: dict[int, dict[str, Any]] = {}
        for r in sorted(rows, key=lambda r: r["created_at"]):
            out.setdefault(int(r["uid"]), {**json.loads(r["data"]), "model": r["model"]})
        return out

    def save_vectors(self, model_id: str, session: str, vectors: list[tuple[int, list[float]]]) -> None:
        """The origin vectors of user messages, in the table of their embedding model."""
        if not vectors:
            return
        dim = len(vectors[0][1])
        schema = _vectors_schema(model_id, dim)
        rows = [{"key": f"{session}\x1f{uid:012d}", "session": session, "uid": uid, "vector": list(v)}
                for uid, v in vectors]
        with self._lock:
            table = self._table(vectors_table_name(model_id), schema)
            meta = table.schema.metadata or {}
            if meta.get(b"embedding_model", b"").decode() != model_id or meta.get(b"dim", b"").decode() != str(dim):
                raise StoreError(f"vectors table for {model_id} holds another vector space; nothing written")
            table.merge_insert("key").when_not_matched_insert_all().execute(
                pa.Table.from_pylist(rows, schema=table.schema))
            self._fold(table, "vectors")

    def load_vectors(self, model_id: str, session: str) -> dict[int, list[float]]:
        """The origin vectors of a session's user messages (unit length): the recall index's vector of
        a message's own words where it has one (that vector is the origin vector, stored once), else
        the row the classifier wrote to `vectors_<model>` (the index off, or behind)."""
        out = {uid: list(unit(v)) for uid, v in self.own_word_vectors(model_id, session).items()}
        try:
            table = self._db.open_table(vectors_table_name(model_id))
        except (FileNotFoundError, ValueError):
            return out
        rows = table.search().where(f"session = {_quote(session)}").limit(None).to_list()
        out.update((int(r["uid"]), list(r["vector"])) for r in rows)
        return out

    def vector_uids(self, model_id: str, session: str) -> set[int]:
        """The uids of a session's user messages that have an origin vector in this model's space
        (in the recall index's own-words rows or in the `vectors_<model>` table)."""
        have = set(self.own_word_vectors(model_id, session, select=False))
        try:
            table = self._db.open_table(vectors_table_name(model_id))
        except (FileNotFoundError, ValueError):
            return have
        rows = table.search().where(f"session = {_quote(session)}").select(["uid"]).limit(None).to_list()
        return have | {int(r["uid"]) for r in rows}

    def texts_naming(self, needle: str) -> list[str]:
        """Event contents and verbatim rows (of every session) that contain `needle` (`%` and `_` act
        as LIKE wildcards, so the answer may hold more; callers filter it exactly)."""
        like = needle.replace("'", "''")
        out: list[str] = []
        for table, column in ((self._events, "content"), (self._verbatim, "data")):
            if table.count_rows():
                rows = table.search().where(f"{column} LIKE '%{like}%'").select([column]).limit(None).to_list()
                out += [r[column] for r in rows]
        return out

    # -- recall index ("Recall" in docs/architecture.md): text rows with full-text indexes, vectors per
    # embedding model --------------------------------------------------------------------------------
    def _recall_text(self, create: bool = True) -> Any:
        """The text table of the recall index; without `create`, None when it does not exist (a search
        of a store that was never indexed, which may be read-only, finds nothing instead of failing)."""
        if getattr(self, "_recall_text_table", None) is None:
            with self._lock:
                if create:
                    table = self._table(RECALL_TEXT, RECALL_TEXT_SCHEMA)
                else:
                    try:
                        table = self._db.open_table(RECALL_TEXT)
                    except (FileNotFoundError, ValueError):
                        return None
                try:
                    _ensure_text_indexes(table)
                except Exception as exc:
                    if create or not read_only_error(exc):
                        raise
                self._recall_text_table = table
        return self._recall_text_table

    def _recall_vectors(self, model_id: str, dim: int | None = None) -> Any:
        """The vector table of one embedding model (None when it does not exist and `dim` is None)."""
        name = recall_vectors_name(model_id)
        tables: dict[str, Any] = self.__dict__.setdefault("_recall_vector_tables", {})
        if name in tables:
            return tables[name]
        try:
            table = self._db.open_table(name)
        except (FileNotFoundError, ValueError):
            if dim is None:
                return None
            with self._lock:
                table = self._table(name, _recall_vectors_schema(model_id, dim))
                _ensure_scalar_indexes(table)
        meta = table.schema.metadata or {}
        if meta.get(b"embedding_model", b"").decode() != model_id:
            raise StoreError(f"table {name} holds another vector space than {model_id}; nothing read or written")
        tables[name] = table
        return table

    def index_text(self, rows: list[dict[str, Any]]) -> None:
        """Text rows of the recall index (idempotent on their key): the columns of RECALL_TEXT_SCHEMA only,
        so an older table's `words` stays empty."""
        if rows:
            with self._writing(RECALL_TEXT):
                table = self._recall_text()
                rows = [{k: r.get(k) for k in RECALL_TEXT_SCHEMA.names} for r in rows]
                table.merge_insert("key").when_not_matched_insert_all().execute(
                    pa.Table.from_pylist(rows, schema=table.schema))

    def index_vectors(self, model_id: str, rows: list[dict[str, Any]]) -> None:
        """Vector rows (same keys as the text rows) into the table of `model_id`; written once."""
        if not rows:
            return
        dim = len(rows[0]["vector"])
        with self._writing(recall_vectors_name(model_id)):
            table = self._recall_vectors(model_id, dim)
            schema = table.schema
            if schema.field("vector").type.list_size != dim:
                raise StoreError(f"vectors of {model_id} have {dim} dims, the table holds another size; nothing written")
            table.merge_insert("key").when_not_matched_insert_all().execute(pa.Table.from_pylist(rows, schema=schema))

    def _recall_latent(self, model_id: str, create: bool = False) -> Any:
        """The latent-terms table of one embedding model (None when it does not exist and not `create`)."""
        name = recall_latent_name(model_id)
        tables: dict[str, Any] = self.__dict__.setdefault("_recall_latent_tables", {})
        if name not in tables:
            try:
                tables[name] = self._db.open_table(name)
            except (FileNotFoundError, ValueError):
                if not create:
                    return None
                with self._lock:
                    table = self._table(name, RECALL_LATENT_SCHEMA)
                    _ensure_scalar_indexes(table)
                tables[name] = table
        return tables[name]

    def index_latent(self, model_id: str, rows: list[dict[str, Any]]) -> None:
        """Latent-term rows (same keys as the text rows: terms and weights) of `model_id`; written once.
        The weights are written as `_LATENT_STEPS` steps of the row's largest (`scale`), where the
        table has that column."""
        if rows:
            with self._writing(recall_latent_name(model_id)):
                table = self._recall_latent(model_id, create=True)
                if "scale" in table.schema.names:
                    rows = [r | _quantized(r["weights"]) for r in rows]
                table.merge_insert("key").when_not_matched_insert_all().execute(
                    pa.Table.from_pylist(rows, schema=table.schema))

    def latent_rows(self, model_id: str, where: str, uids: list[int]) -> list[dict[str, Any]]:
        """The latent-term rows of these uids (events and segments that start there) under a search's filter."""
        table = self._recall_latent(model_id) if uids else None
        if table is None:
            return []
        where = f"{where} AND uid IN ({', '.join(str(int(u)) for u in uids)})"
        scaled = "scale" in table.schema.names
        rows = (table.search().where(where).select(["key", "kind", "uid", "uid_to", "turn", "role", "chunk", "terms",
                                                    "weights"] + (["scale"] if scaled else [])).limit(None).to_list())
        for r in rows if scaled else ():
            step = float(r.pop("scale") or 0.0) / _LATENT_STEPS
            r["weights"] = [q * step for q in r["weights"]]
        return rows

    def recall_state(self, session: str, model_id: str) -> tuple[int, int]:
        """(events_upto, segments_upto) indexed for a session: model "" is the full-text side,
        a model id its vectors. A restart resumes after these."""
        return self.recall_states(session, [model_id])[model_id]

    def recall_states(self, session: str, model_ids: list[str]) -> dict[str, tuple[int, int]]:
        """`recall_state` of several models in one read (a search asks for the text and vector sides)."""
        keys = ", ".join(_quote(session + chr(31) + m) for m in model_ids)
        table = self._recall_state(create=False)
        rows = [] if table is None else table.search().where(f"key IN ({keys})").limit(len(model_ids)).to_list()
        found = {r["model"]: (int(r["events_upto"]), int(r["segments_upto"])) for r in rows}
        return {m: found.get(m, (0, 0)) for m in model_ids}

    def _recall_state(self, create: bool = True) -> Any:
        """The watermarks' table, opened once (every search reads it); without `create`, None when it
        does not exist (nothing indexed yet: a read-only store is read, not changed)."""
        if getattr(self, "_recall_state_table", None) is None:
            with self._lock:
                if create:
                    self._recall_state_table = self._table(RECALL_STATE, RECALL_STATE_SCHEMA)
                else:
                    try:
                        self._recall_state_table = self._db.open_table(RECALL_STATE)
                    except (FileNotFoundError, ValueError):
                        return None
        return self._recall_state_table

    def save_recall_state(self, session: str, model_id: str, events_upto: int, segments_upto: int) -> None:
        """One watermark per (session, model); model "" is the text (full-text) side."""
        row = {"key": session + "\x1f" + model_id, "session": session, "model": model_id,
               "events_upto": int(events_upto), "segments_upto": int(segments_upto), "updated_at": now_iso()}
        with self._writing(RECALL_STATE):
            table = self._recall_state()
            table.merge_insert("key").when_matched_update_all().when_not_matched_insert_all().execute(
                pa.Table.from_pylist([row], schema=RECALL_STATE_SCHEMA))

    def search_text(self, where: str, query: str, cjk: bool, limit: int) -> list[dict[str, Any]]:
        """Full-text search on the word column (or the CJK n-gram column), filtered first."""
        table = self._recall_text(create=False)
        if table is None:  # nothing was ever indexed
            return []
        column = "cjk" if cjk else "text"
        cols = ["key", "kind", "uid", "uid_to", "turn", "role", "chunk", "text", "_score"]
        try:
            return (table.search(query, query_type="fts", fts_columns=column).where(where, prefilter=True)
                    .select(cols).limit(limit).to_list())
        except ValueError as exc:  # e.g. a query the parser rejects: no full-text answer, not a crash
            if "index" in str(exc).lower() and "not" in str(exc).lower():
                try:
                    _ensure_text_indexes(table)
                except Exception as inner:  # a read-only store: no full-text answer until it is writable
                    if not read_only_error(inner):
                        raise
            return []

    def search_vectors(self, model_id: str, where: str, vector: list[float], limit: int,
                       nprobes: int = 20) -> list[dict[str, Any]]:
        """Nearest rows by cosine distance in the model's table, filtered first; [] when none."""
        table = self._recall_vectors(model_id)
        if table is None:
            return []
        q = (table.search(vector, vector_column_name="vector").distance_type("cosine").where(where, prefilter=True)
             .select(["key", "kind", "uid", "uid_to", "turn", "role", "chunk", "_distance"]).limit(limit))
        if getattr(self, "_ann", {}).get(model_id):
            q = q.nprobes(nprobes)
        return q.to_list()

    def index_texts(self, keys: list[str]) -> dict[str, str]:
        """The text of index rows by key (for snippets of hits that only the vector side found)."""
        table = self._recall_text(create=False) if keys else None
        if table is None:
            return {}
        rows = (table.search().where(f"key IN ({', '.join(_quote(k) for k in keys)})")
                .select(["key", "text"]).limit(len(keys)).to_list())
        return {r["key"]: r["text"] for r in rows}

    def stored_vectors(self, model_id: str, session: str, uids: list[int]) -> dict[int, list[float]]:
        """Vectors of events' own words (no context before them), as the index stored them: the
        first chunk of an event that starts a session, else its plain row (chunk -1, user messages).
        The origin classifier reads these instead of embedding the text again."""
        return self.own_word_vectors(model_id, session, uids) if uids else {}

    def own_word_vectors(self, model_id: str, session: str, uids: list[int] | None = None,
                         select: bool = True) -> dict[int, list[float]]:
        """`stored_vectors` of these uids, or (None) of every user message the index holds; with
        `select` False the vectors are not read (the values are empty lists)."""
        table = self._recall_vectors(model_id)
        if table is None:
            return {}
        where = f"session = {_quote(session)} AND kind = 'event' AND chunk IN (-1, 0) AND " + (
            f"uid IN ({', '.join(str(int(u)) for u in uids)})" if uids is not None else "role = 'user'")
        columns = ["uid", "chunk"] + (["vector"] if select else [])
        rows = table.search().where(where).select(columns).limit(None if uids is None else 2 * len(uids)).to_list()
        out: dict[int, list[float]] = {}
        for r in sorted(rows, key=lambda r: -int(r["chunk"])):  # a plain row wins over a chunk with context
            if int(r["chunk"]) == -1 or int(r["uid"]) == 1:
                out.setdefault(int(r["uid"]), list(r["vector"]) if select else [])
        return out

    def optimize_recall(self, model_id: str | None) -> dict[str, Any]:
        """Fold new rows into the indexes and remove versions older than `_FOLD_KEEP_S`, as a turn's
        fold does (`_fold`); build the ANN index once the vectors table is big enough. Returns what was
        done (for the ledger and the docs).

        The versions matter: each write of the index is one, and a fold rewrites the table's data, so
        until they are removed every fold leaves a full copy behind (they were kept until the next
        quiet moment, which a session whose index is still catching up does not reach)."""
        done: dict[str, Any] = {}
        keep = self._keep(_FOLD_KEEP_S)
        text = self._recall_text()
        text.optimize(cleanup_older_than=keep)
        done["text_rows"] = text.count_rows()
        table = self._recall_vectors(model_id) if model_id else None
        if table is not None:
            rows = table.count_rows()
            done["vector_rows"] = rows
            has_ann = any(i.index_type.startswith("IVF") for i in table.list_indices())
            if not has_ann and rows >= ANN_MIN_ROWS:
                from lancedb.index import IvfPq

                dim = table.schema.field("vector").type.list_size
                table.create_index("vector", config=IvfPq(distance_type="cosine",
                                                          num_partitions=max(16, int(rows ** 0.5) // 2),
                                                          num_sub_vectors=max(1, dim // 8)))
                has_ann = done["ann_built"] = True
            else:
                table.optimize(cleanup_older_than=keep)
            self.__dict__.setdefault("_ann", {})[model_id] = has_ann
        latent = self._recall_latent(model_id) if model_id else None
        if latent is not None:
            latent.optimize(cleanup_older_than=keep)
        return done

    def has_ann(self, model_id: str) -> bool:
        table = self._recall_vectors(model_id)
        found = table is not None and any(i.index_type.startswith("IVF") for i in table.list_indices())
        self.__dict__.setdefault("_ann", {})[model_id] = found
        return found


RECALL_TEXT = "recall_text"
RECALL_STATE = "recall_state"
# Below this many vectors a flat scan is exact and fast enough (measured: `mfs-nb bench recall`).
ANN_MIN_ROWS = 50_000

RECALL_TEXT_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("kind", pa.string()),  # event | segment
        ("uid", pa.int64()),  # an event's uid; a segment's first uid
        ("uid_to", pa.int64()),
        ("turn", pa.int64()),
        ("role", pa.string()),  # user | assistant | tool | segment
        ("chunk", pa.int64()),
        ("text", pa.large_string()),  # the chunk itself: the word index reads it, snippets show it
        # (no `words`, what the embedder read: it is rebuilt from the log whenever it is needed; an older
        # store's table has that column, and the rows written since leave it empty)
        ("cjk", pa.large_string()),  # the CJK runs of `text`, for the n-gram index
        ("created_at", pa.string()),
    ]
)
RECALL_STATE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("model", pa.string()),
        ("events_upto", pa.int64()),
        ("segments_upto", pa.int64()),
        ("updated_at", pa.string()),
    ]
)


FILES_SCHEMA = pa.schema([("path", pa.string()), ("data", pa.large_binary()), ("size", pa.int64()),
                          ("mtime", pa.float64())])


class TableFiles:
    """Snapshots of a store on object storage, as rows of its `files` table (path, bytes, mtime). A
    snapshot is content-addressed, so a path's bytes never change: writing one twice is a no-op."""

    def __init__(self, store: Store):
        self.store = store

    def _table(self) -> Any:
        return self.store._table("files", FILES_SCHEMA)

    def exists(self, rel: str) -> bool:
        with self.store._writing("files"):
            return bool(self._table().count_rows(f"path = {_quote(rel)}"))

    def touch(self, rel: str) -> None:
        with self.store._lock, self.store._writing("files"):
            self._table().update(where=f"path = {_quote(rel)}", values={"mtime": time.time()})

    def put(self, rel: str, data: bytes) -> None:
        row = pa.Table.from_pylist([{"path": rel, "data": data, "size": len(data), "mtime": time.time()}],
                                   schema=FILES_SCHEMA)
        with self.store._lock, self.store._writing("files"):
            self._table().merge_insert("path").when_not_matched_insert_all().execute(row)

    def listing(self) -> list[tuple[str, int, float]]:
        with self.store._writing("files"):
            table = self._table()
            if not table.count_rows():
                return []
            rows = table.search().select(["path", "size", "mtime"]).limit(None).to_list()
        return sorted((r["path"], r["size"], r["mtime"]) for r in rows)

    def remove(self, rel: str) -> None:
        with self.store._lock, self.store._writing("files"):
            self._table().delete(f"path = {_quote(rel)}")


def _recall_vectors_schema(model_id: str, dim: int) -> pa.Schema:
    return pa.schema([("key", pa.string()), ("session", pa.string()), ("kind", pa.string()), ("uid", pa.int64()),
                      ("uid_to", pa.int64()), ("turn", pa.int64()), ("role", pa.string()), ("chunk", pa.int64()),
                      ("vector", pa.list_(VECTOR_TYPE, dim))],
                     metadata={"embedding_model": model_id, "dim": str(dim)})


def recall_vectors_name(model_id: str) -> str:
    return "recall_" + vectors_table_name(model_id)


def recall_latent_name(model_id: str) -> str:
    return "recall_latent_" + vectors_table_name(model_id)[len("vectors_"):]


# an embedder's sparse "latent terms" of each indexed row: feature ids and their weights, each weight
# as a multiple of `scale` / _LATENT_STEPS (one byte instead of float16's two: 128 terms of a row are
# then 128 bytes, not 256; a score moves by at most 0.4 % of the row's largest weight per shared term).
# Tables an older mfs_nb made hold float16 weights and no `scale`, and are read and written as they are.
_LATENT_STEPS = 127
RECALL_LATENT_SCHEMA = pa.schema([("key", pa.string()), ("session", pa.string()), ("kind", pa.string()),
                                  ("uid", pa.int64()), ("uid_to", pa.int64()), ("turn", pa.int64()),
                                  ("role", pa.string()), ("chunk", pa.int64()), ("terms", pa.list_(pa.int32())),
                                  ("weights", pa.list_(pa.int8())), ("scale", pa.float32())])


def _quantized(weights: list[float]) -> dict[str, Any]:
    """`weights` as whole steps of their largest magnitude (`RECALL_LATENT_SCHEMA`)."""
    finite = [float(w) if math.isfinite(float(w)) else 0.0 for w in weights]  # a NaN weighs nothing
    scale = max(map(abs, finite), default=0.0)
    if not scale:
        return {"weights": [0] * len(finite), "scale": 0.0}
    return {"weights": [round(w / scale * _LATENT_STEPS) for w in finite], "scale": scale}


def _create_index(table: Any, column: str, config: Any) -> None:
    """Create an index unless it exists; when another writer (a kernel, a thread) creates one on the
    same table at the same moment, lance refuses the later commit: look again, and retry once."""
    for attempt in range(2):
        if column in {c for i in table.list_indices() for c in i.columns}:
            return
        try:
            table.create_index(column, config=config)
            return
        except RuntimeError as exc:
            if attempt or "commit conflict" not in str(exc).lower():
                raise
            table.checkout_latest()


def _ensure_event_indexes(table: Any) -> None:
    """BTree indexes on the log's key, session and uid: a write looks its keys up, a load, a recall and
    a projection read one session's rows, without scanning the table. Created once (an old store's
    on its first open, in well under a second at 100k events); rows written since are folded in by
    `optimize`. A store that cannot take them (read-only) is still read, by scanning."""
    from lancedb.index import BTree

    for column in ("key", "session", "uid"):
        try:
            _create_index(table, column, BTree())
        except Exception:  # an index is an optimisation; reading works without it
            return


def _ensure_scalar_indexes(table: Any) -> None:
    """BTree indexes on session and uid: filtered searches read only the matching rows."""
    from lancedb.index import BTree

    for column in ("session", "uid"):
        _create_index(table, column, BTree())


def _ensure_text_indexes(table: Any) -> None:
    """Word index on `text` (English stemming), n-gram index on `cjk` (Chinese/Japanese/Korean),
    created with the empty table; rows written later are searched until `optimize` folds them in."""
    from lancedb.index import FTS

    _create_index(table, "text", FTS(remove_stop_words=False))
    _create_index(table, "cjk", FTS(base_tokenizer="ngram", ngram_min_length=2, ngram_max_length=3,
                                    stem=False, remove_stop_words=False, ascii_folding=False))
    _ensure_scalar_indexes(table)


# -- damaged stores (doctor.py decides; these read and write the tables) ----------------------
def _layout(table: Any, folder: Path | None) -> dict[str, int]:
    """Versions, fragments and bytes on disk (local stores) of one table."""
    stats = table.stats()
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder is not None else 0
    return {"versions": len(table.list_versions()), "fragments": int(stats["fragment_stats"]["num_fragments"]),
            "bytes": size}


def _table_names(db: Any) -> set[str]:
    """Every table name (all pages; lancedb's table_names is deprecated and stops at 10)."""
    names: set[str] = set()
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.update(page.tables)
        token = page.page_token
        if not token:
            return names


def table_report(uri: str) -> dict[str, dict[str, Any]]:
    """Every table of a store: whether it reads in full, its row count and its versions."""
    lancedb = lancedb_module()

    db = lancedb.connect(resolve_uri(uri))
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(_table_names(db)):
        info: dict[str, Any] = {"ok": False, "rows": None, "versions": [], "error": ""}
        try:
            table = db.open_table(name)
            info["versions"] = [int(v["version"]) for v in table.list_versions()]
            info["rows"] = table.count_rows()
            table.to_arrow()
            info["ok"] = True
        except Exception as exc:
            info["error"] = " ".join(str(exc).split())[:200]
        out[name] = info
    return out


def salvage_rows(uri: str, name: str, chunk: int = 64) -> tuple[list[dict[str, Any]], int]:
    """The rows of a table that still read, row groups first, then one by one; and how many did not."""
    lancedb = lancedb_module()

    table = lancedb.connect(resolve_uri(uri)).open_table(name)
    total = table.count_rows()
    good: list[dict[str, Any]] = []
    bad = 0
    stack = [(i, min(i + chunk, total)) for i in range(0, total, chunk)]
    while stack:
        a, b = stack.pop(0)
        try:
            good += table.take_offsets(list(range(a, b))).to_arrow().to_pylist()
        except Exception:
            if b - a == 1:
                bad += 1
            else:
                mid = (a + b) // 2
                stack[:0] = [(a, mid), (mid, b)]
    return good, bad


def rewrite_events(uri: str, rows: list[dict[str, Any]]) -> None:
    """Write the salvaged events as a new version of the events table (older versions stay)."""
    lancedb = lancedb_module()

    db = lancedb.connect(resolve_uri(uri))
    if "events" in _table_names(db):
        table = db.open_table("events")
        # the table's own schema, with its metadata: which row of two under a key counts stays the same
        table.add(pa.Table.from_pylist(rows, schema=table.schema), mode="overwrite")
    else:
        _create(db, "events", EVENTS_SCHEMA, stable_ids=True, data=pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA))
