"""The LanceDB boundary (docs/architecture.md, "Storage"): the only package that imports lancedb.

Tables:
- ``events``   the append-only log; one row per (session, uid); never updated or deleted.
- ``sessions`` one row per session: saved settings (never secrets) and the usage anchor.
- ``ledger``   one row per memory-layer action (clearing, compaction, rejection, failure).

Every row has a stable key, so a retried write never duplicates. Two kernels on one store cannot
overwrite each other's events: an event is appended only when its key is new (one writer at a time
under a lock file on a local store), and on object storage, where two machines can append one key at
the same moment, each checks afterwards that the row that counts is its own (else `UidConflict`).

`Store` is one façade over the table families, one module each: `core` (opening, the write lock,
folding versions, maintenance), `eventlog` (the log), `state` (the small tables), `recall` (the recall
index); `schemas` names the tables and their indexes, `connection` opens a store and words its errors,
`salvage` reads a damaged one, `files` keeps snapshots on object storage.
"""

from __future__ import annotations

from .connection import DEFAULT_STORE, lancedb_module, read_only_error, resolve_uri, shown_uri
from .eventlog import EventLog, UidConflict
from .recall_tables import RecallTables
from .records import StateTables
from .schemas import ANN_MIN_ROWS, EVENTS_SCHEMA, SESSIONS_SCHEMA, VECTOR_TYPE, vectors_table_name

__all__ = ["ANN_MIN_ROWS", "DEFAULT_STORE", "EVENTS_SCHEMA", "SESSIONS_SCHEMA", "VECTOR_TYPE", "Store",
           "UidConflict", "lancedb_module", "read_only_error", "resolve_uri", "shown_uri", "vectors_table_name"]


class Store(EventLog, StateTables, RecallTables):
    """One LanceDB database holding any number of sessions."""
