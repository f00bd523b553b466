"""The tables' schemas and names, and the indexes each is given (created once, folded in later)."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import pyarrow as pa

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

# The compaction lease (compaction/lease.py): claim / renew / release rows, appended only.
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


def vectors_schema(model_id: str, dim: int) -> pa.Schema:
    """One vectors table per embedding model: its id is in the table's metadata, so two vector
    spaces never share a table."""
    return pa.schema([("key", pa.string()), ("session", pa.string()), ("uid", pa.int64()),
                      ("vector", pa.list_(VECTOR_TYPE, dim))],
                     metadata={"embedding_model": model_id, "dim": str(dim)})


def vectors_table_name(model_id: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", model_id).strip("_").lower()
    return f"vectors_{slug}_{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"

# An events table created with stable row ids says so in its schema: there, of two rows under one key
# the first committed wins (its row id is smaller, and stays so through compaction).
FIRST_COMMIT = {b"mfs.duplicate_key_winner": b"first_commit"}


def create_table(db: Any, name: str, schema: pa.Schema, *, stable_ids: bool = False, data: pa.Table | None = None) -> Any:
    """A new table; `stable_ids`: row ids in commit order that compaction keeps, said in the schema
    (the events table: see `winner`)."""
    if not stable_ids:
        return db.create_table(name, data=data, schema=schema)
    return db.create_table(name, data=data, schema=schema.with_metadata(FIRST_COMMIT),
                           storage_options={"new_table_enable_stable_row_ids": "true"})


def winner(rows: list[dict[str, Any]], first_commit: bool = False) -> dict[str, Any] | None:
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


def quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"

RECALL_TEXT = "recall_text"
RECALL_WINDOWS = "recall_windows"  # the coarse index: windows of events, one full-text document each
RECALL_STATE = "recall_state"
# Below this many vectors a flat scan is exact and fast enough (measured: `mfs-nb bench recall`).
ANN_MIN_ROWS = 50_000

RECALL_TEXT_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("session", pa.string()),
        ("kind", pa.string()),  # event | segment (| window, in RECALL_WINDOWS)
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

def recall_vectors_schema(model_id: str, dim: int) -> pa.Schema:
    return pa.schema([("key", pa.string()), ("session", pa.string()), ("kind", pa.string()), ("uid", pa.int64()),
                      ("uid_to", pa.int64()), ("turn", pa.int64()), ("role", pa.string()), ("chunk", pa.int64()),
                      ("vector", pa.list_(VECTOR_TYPE, dim))],
                     metadata={"embedding_model": model_id, "dim": str(dim)})


def recall_vectors_name(model_id: str) -> str:
    return "recall_" + vectors_table_name(model_id)


def recall_latent_name(model_id: str) -> str:
    return "recall_latent_" + vectors_table_name(model_id)[len("vectors_"):]


# an embedder's sparse "latent terms" of each indexed row: feature ids and their weights, each weight
# as a multiple of `scale` / LATENT_STEPS (one byte instead of float16's two: 128 terms of a row are
# then 128 bytes, not 256; a score moves by at most 0.4 % of the row's largest weight per shared term).
# Tables an older mfs_nb made hold float16 weights and no `scale`, and are read and written as they are.
LATENT_STEPS = 127
RECALL_LATENT_SCHEMA = pa.schema([("key", pa.string()), ("session", pa.string()), ("kind", pa.string()),
                                  ("uid", pa.int64()), ("uid_to", pa.int64()), ("turn", pa.int64()),
                                  ("role", pa.string()), ("chunk", pa.int64()), ("terms", pa.list_(pa.int32())),
                                  ("weights", pa.list_(pa.int8())), ("scale", pa.float32())])


def quantized(weights: list[float]) -> dict[str, Any]:
    """`weights` as whole steps of their largest magnitude (`RECALL_LATENT_SCHEMA`)."""
    finite = [float(w) if math.isfinite(float(w)) else 0.0 for w in weights]  # a NaN weighs nothing
    scale = max(map(abs, finite), default=0.0)
    if not scale:
        return {"weights": [0] * len(finite), "scale": 0.0}
    return {"weights": [round(w / scale * LATENT_STEPS) for w in finite], "scale": scale}


def create_index(table: Any, column: str, config: Any) -> None:
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


def ensure_event_indexes(table: Any) -> None:
    """BTree indexes on the log's key, session and uid: a write looks its keys up, a load, a recall and
    a projection read one session's rows, without scanning the table. Created once (an old store's
    on its first open, in well under a second at 100k events); rows written since are folded in by
    `optimize`. A store that cannot take them (read-only) is still read, by scanning."""
    from lancedb.index import BTree

    for column in ("key", "session", "uid"):
        try:
            create_index(table, column, BTree())
        except Exception:  # an index is an optimisation; reading works without it
            return


def ensure_scalar_indexes(table: Any) -> None:
    """BTree indexes on session and uid: filtered searches read only the matching rows."""
    from lancedb.index import BTree

    for column in ("session", "uid"):
        create_index(table, column, BTree())


def ensure_text_indexes(table: Any) -> None:
    """Word index on `text` (English stemming), n-gram index on `cjk` (Chinese/Japanese/Korean),
    created with the empty table; rows written later are searched until `optimize` folds them in."""
    from lancedb.index import FTS

    create_index(table, "text", FTS(remove_stop_words=False))
    create_index(table, "cjk", FTS(base_tokenizer="ngram", ngram_min_length=2, ngram_max_length=3,
                                    stem=False, remove_stop_words=False, ascii_folding=False))
    ensure_scalar_indexes(table)

