"""The recall index's tables: text rows with full-text indexes, vectors and latent terms per model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import StoreError
from ..events import now_iso
from ..layers.origin import unit
from .connection import read_only_error
from .core import StoreCore
from .schemas import (
    ANN_MIN_ROWS,
    LATENT_STEPS,
    RECALL_LATENT_SCHEMA,
    RECALL_STATE,
    RECALL_STATE_SCHEMA,
    RECALL_TEXT,
    RECALL_TEXT_SCHEMA,
    RECALL_WINDOWS,
    ensure_scalar_indexes,
    ensure_text_indexes,
    quantized,
    quote,
    recall_latent_name,
    recall_vectors_name,
    recall_vectors_schema,
    vectors_schema,
    vectors_table_name,
)


class RecallTables(StoreCore):
    # -- recall index ("Recall" in docs/architecture.md): text rows with full-text indexes, vectors per
    # embedding model --------------------------------------------------------------------------------
    def _recall_text(self, create: bool = True, name: str = RECALL_TEXT) -> Any:
        """The text table of the recall index (or, `name` RECALL_WINDOWS, of its coarse index: a table
        of its own, so the long windows do not weigh on the events' word statistics); without `create`,
        None when it does not exist (a search of a store that was never indexed, which may be read-only,
        finds nothing instead of failing)."""
        attr = "_recall_windows_table" if name == RECALL_WINDOWS else "_recall_text_table"
        if getattr(self, attr) is None:
            with self._lock:
                if create:
                    table = self._table(name, RECALL_TEXT_SCHEMA)
                else:
                    try:
                        table = self._db.open_table(name)
                    except (FileNotFoundError, ValueError):
                        return None
                try:
                    ensure_text_indexes(table)
                except Exception as exc:
                    if create or not read_only_error(exc):
                        raise
                setattr(self, attr, table)
        return getattr(self, attr)

    def _recall_vectors(self, model_id: str, dim: int | None = None) -> Any:
        """The vector table of one embedding model (None when it does not exist and `dim` is None)."""
        name = recall_vectors_name(model_id)
        tables = self._recall_vector_tables
        if name in tables:
            return tables[name]
        try:
            table = self._db.open_table(name)
        except (FileNotFoundError, ValueError):
            if dim is None:
                return None
            with self._lock:
                table = self._table(name, recall_vectors_schema(model_id, dim))
                ensure_scalar_indexes(table)
        meta = table.schema.metadata or {}
        if meta.get(b"embedding_model", b"").decode() != model_id:
            raise StoreError(f"table {name} holds another vector space than {model_id}; nothing read or written")
        tables[name] = table
        return table

    def index_text(self, rows: list[dict[str, Any]]) -> None:
        """Text rows of the recall index (idempotent on their key): the columns of RECALL_TEXT_SCHEMA only,
        so an older table's `words` stays empty."""
        for name in (RECALL_TEXT, RECALL_WINDOWS):  # the coarse index's windows to their own table
            part = [{k: r.get(k) for k in RECALL_TEXT_SCHEMA.names} for r in rows
                    if (r["kind"] == "window") == (name == RECALL_WINDOWS)]
            if part:
                with self._writing(name):
                    table = self._recall_text(name=name)
                    table.merge_insert("key").when_not_matched_insert_all().execute(
                        pa.Table.from_pylist(part, schema=table.schema))

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
        tables = self._recall_latent_tables
        if name not in tables:
            try:
                tables[name] = self._db.open_table(name)
            except (FileNotFoundError, ValueError):
                if not create:
                    return None
                with self._lock:
                    table = self._table(name, RECALL_LATENT_SCHEMA)
                    ensure_scalar_indexes(table)
                tables[name] = table
        return tables[name]

    def index_latent(self, model_id: str, rows: list[dict[str, Any]]) -> None:
        """Latent-term rows (same keys as the text rows: terms and weights) of `model_id`; written once.
        The weights are written as `LATENT_STEPS` steps of the row's largest (`scale`), where the
        table has that column."""
        if rows:
            with self._writing(recall_latent_name(model_id)):
                table = self._recall_latent(model_id, create=True)
                if "scale" in table.schema.names:
                    rows = [r | quantized(r["weights"]) for r in rows]
                table.merge_insert("key").when_not_matched_insert_all().execute(
                    pa.Table.from_pylist(rows, schema=table.schema))

    def latent_rows(self, model_id: str, where: str, uids: list[int]) -> list[dict[str, Any]]:
        """The latent-term rows of these uids (events and segments that start there) under a search's
        filter, their terms (int64) and weights (float64) as numpy arrays: a search scores a few
        hundred rows of 128 terms each, which as Python lists took more time than reading them."""
        table = self._recall_latent(model_id) if uids else None
        if table is None:
            return []
        where = f"{where} AND uid IN ({', '.join(str(int(u)) for u in uids)})"
        scaled = "scale" in table.schema.names
        found = (table.search().where(where).select(["key", "kind", "uid", "uid_to", "turn", "role", "chunk", "terms",
                                                     "weights"] + (["scale"] if scaled else [])).limit(None).to_arrow())
        if not found.num_rows:
            return []
        lengths = pc.list_value_length(found["terms"]).fill_null(0).to_numpy(zero_copy_only=False)
        if not np.array_equal(lengths, pc.list_value_length(found["weights"]).fill_null(0).to_numpy(zero_copy_only=False)):
            raise StoreError(f"the latent table of {model_id} has rows whose terms and weights differ in length")
        ends = np.cumsum(lengths)
        terms = pc.list_flatten(found["terms"]).to_numpy(zero_copy_only=False).astype(np.int64)
        weights = pc.list_flatten(found["weights"]).to_numpy(zero_copy_only=False).astype(np.float64)
        if scaled:  # whole steps of the row's largest weight, back to weights
            steps = found["scale"].fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64) / LATENT_STEPS
            weights *= np.repeat(steps, lengths)
        rows = found.drop_columns(["terms", "weights"] + (["scale"] if scaled else [])).to_pylist()
        for r, end, n in zip(rows, ends.tolist(), lengths.tolist()):
            r["terms"], r["weights"] = terms[end - n:end], weights[end - n:end]
        return rows

    def recall_state(self, session: str, model_id: str) -> tuple[int, int]:
        """(events_upto, segments_upto) indexed for a session: model "" is the full-text side,
        a model id its vectors. A restart resumes after these."""
        return self.recall_states(session, [model_id])[model_id]

    def recall_states(self, session: str, model_ids: list[str]) -> dict[str, tuple[int, int]]:
        """`recall_state` of several models in one read (a search asks for the text and vector sides)."""
        keys = ", ".join(quote(session + chr(31) + m) for m in model_ids)
        table = self._recall_state(create=False)
        rows = [] if table is None else table.search().where(f"key IN ({keys})").limit(len(model_ids)).to_list()
        found = {r["model"]: (int(r["events_upto"]), int(r["segments_upto"])) for r in rows}
        return {m: found.get(m, (0, 0)) for m in model_ids}

    def _recall_state(self, create: bool = True) -> Any:
        """The watermarks' table, opened once (every search reads it); without `create`, None when it
        does not exist (nothing indexed yet: a read-only store is read, not changed)."""
        if self._recall_state_table is None:
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
        """One watermark per (session, model); model "" is the text (full-text) side. It only moves
        forward: an indexer that read the watermark before another one (another kernel, a closing
        thread) saved a later one must not move it back, or a search would read indexed events twice."""
        row = {"key": session + "\x1f" + model_id, "session": session, "model": model_id,
               "events_upto": int(events_upto), "segments_upto": int(segments_upto), "updated_at": now_iso()}
        with self._writing(RECALL_STATE):
            table = self._recall_state()
            table.merge_insert("key").when_matched_update_all(
                where="source.events_upto >= target.events_upto AND source.segments_upto >= target.segments_upto"
            ).when_not_matched_insert_all().execute(pa.Table.from_pylist([row], schema=RECALL_STATE_SCHEMA))

    def search_text(self, where: str, query: str, cjk: bool, limit: int, windows: bool = False
                    ) -> list[dict[str, Any]]:
        """Full-text search on the word column (or the CJK n-gram column), filtered first; of the
        coarse index's windows with `windows`."""
        table = self._recall_text(create=False, name=RECALL_WINDOWS if windows else RECALL_TEXT)
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
                    ensure_text_indexes(table)
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
        if self._ann.get(model_id):
            q = q.nprobes(nprobes)
        return q.to_list()

    def index_texts(self, keys: list[str]) -> dict[str, str]:
        """The text of index rows by key (for snippets of hits that only the vector side found)."""
        table = self._recall_text(create=False) if keys else None
        if table is None:
            return {}
        rows = (table.search().where(f"key IN ({', '.join(quote(k) for k in keys)})")
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
        where = f"session = {quote(session)} AND kind = 'event' AND chunk IN (-1, 0) AND " + (
            f"uid IN ({', '.join(str(int(u)) for u in uids)})" if uids is not None else "role = 'user'")
        columns = ["uid", "chunk"] + (["vector"] if select else [])
        rows = table.search().where(where).select(columns).limit(None if uids is None else 2 * len(uids)).to_list()
        out: dict[int, list[float]] = {}
        for r in sorted(rows, key=lambda r: -int(r["chunk"])):  # a plain row wins over a chunk with context
            if int(r["chunk"]) == -1 or int(r["uid"]) == 1:
                out.setdefault(int(r["uid"]), list(r["vector"]) if select else [])
        return out

    def optimize_recall(self, model_id: str | None, between: Callable[[], None] = lambda: None) -> dict[str, Any]:
        """Fold new rows into the indexes and remove versions older than `_FOLD_KEEP_S`, as a turn's
        fold does (`_fold`); build the ANN index once the vectors table is big enough. Returns what was
        done (for the ledger and the docs).

        The versions matter: each write of the index is one, and a fold rewrites the table's data, so
        until they are removed every fold leaves a full copy behind (they were kept until the next
        quiet moment, which a session whose index is still catching up does not reach). `between` is
        called before each table's fold (the background indexer waits there while a turn runs)."""
        if self.read_only:
            raise StoreError(self.read_only_line())
        done: dict[str, Any] = {}
        keep = self._keep()
        between()
        text = self._recall_text()
        text.optimize(cleanup_older_than=keep)
        done["text_rows"] = text.count_rows()
        windows = self._recall_text(create=False, name=RECALL_WINDOWS)
        if windows is not None:
            between()
            windows.optimize(cleanup_older_than=keep)
        table = self._recall_vectors(model_id) if model_id else None
        if table is not None:
            between()
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
            self._ann[model_id] = has_ann
        latent = self._recall_latent(model_id) if model_id else None
        if latent is not None:
            between()
            latent.optimize(cleanup_older_than=keep)
        return done

    def save_vectors(self, model_id: str, session: str, vectors: list[tuple[int, list[float]]]) -> None:
        """The origin vectors of user messages, in the table of their embedding model."""
        if not vectors:
            return
        dim = len(vectors[0][1])
        schema = vectors_schema(model_id, dim)
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
        rows = table.search().where(f"session = {quote(session)}").limit(None).to_list()
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
        rows = table.search().where(f"session = {quote(session)}").select(["uid"]).limit(None).to_list()
        return have | {int(r["uid"]) for r in rows}

    def has_ann(self, model_id: str) -> bool:
        table = self._recall_vectors(model_id)
        found = table is not None and any(i.index_type.startswith("IVF") for i in table.list_indices())
        self._ann[model_id] = found
        return found

