"""Index on write and hybrid search for one session (docs/architecture.md, "Recall").

`Indexer` keeps the recall index of a session up to date in a background thread: every event
(user, assistant, tool result, attached document, cut into chunks) and every segment's prose
gets a text row (full-text indexed at once; every `search.WINDOW_EVENTS` events also make one row of
the coarse index, in a table of its own) and, in batches, a vector row in the table of the
session's embedding model, with its latent terms. The encoder reads each text once (`row_vectors`,
`pooled`): a first chunk takes the event before it into account by pooling with that event's
vector and terms, not by a second pass. A turn only wakes the thread; it never waits for it. Watermarks in
the store (`recall_state`) make a restart resume where indexing stopped, and a vector table per
model means that changing the embedder re-indexes into a fresh table instead of mixing spaces.

`search` fuses the full-text and the vector rankings, a re-ranking of their candidates by latent
terms (the embedder's sparse head) and, for a query that names a date, the same searches within
the events written then, by reciprocal rank (search.fuse). Rows the vectors have not reached yet
are still found by full text, and the results say so.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import StoreError
from ..events import Event
from ..models.embed import LATENT_TERMS
from . import ranking as S
from .pacing import Pacing, lower_priority
from .ranking import Results
from .rows import INDEX_FIELDS, latent_row, plain_rows, rows_for_events, rows_for_segment, rows_for_window
from .searcher import Searcher

if TYPE_CHECKING:
    from ..host import Host
    from ..layers.segments import Segment

# The background thread embeds one text per call on one core at the lowest priority (`limit_this_thread`;
# the indexers of all sessions of a process take turns on that core, `pacing.BACKGROUND_CORE`), so a turn or a
# search keeps the other cores, and before each text it waits while a turn or a search runs; vectors are
# written every WRITE_ROWS rows, so the store sees a few writes a minute instead of one per text. A write
# cannot be stopped once begun, and a turn that starts during one shares the machine with it (at 32 rows
# written whenever they were ready, one turn in ten overlapped a write in a profile of `recall_speed`'s turns): so
# while turns keep coming, rows wait (up to HOLD_ROWS) for the moment right after a turn or a search
# ends (`pacing.SHADOW_S`), the furthest from the next one, and each commit of a write waits while a turn runs.
BATCH = 1
WRITE_ROWS = 128
HOLD_ROWS = 4 * WRITE_ROWS  # rows embedded and not written yet, at most, while waiting for that moment
TEXT_EVENTS = 1_000  # events per full-text write when a backlog is indexed
CONTEXT_WEIGHT = 0.5  # a first chunk's vector: its own plus this much of the event before's (LoCoMo: 0.3-1.0 tried)
LATENT_SEEN = 256  # texts whose latent terms the indexer keeps (the event before a row was usually just read)
OPTIMIZE_EVERY = 2_000  # rows written (text and vector rows) between index optimisations
LATENT = "#latent"  # the latent terms' watermark is the model's, with this suffix
WINDOWS = "#windows"  # the coarse index's watermark: the last uid of the last window written
LATENT_EVENTS = 8  # events per step when latent terms are filled in for an older store
RATE_WINDOW_S = 600  # the indexing rate a status line shows is measured over the last ten minutes of writes




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
        self._latent_sync = False  # the latent watermark agrees with the vectors' (set by each catch-up)
        self.failed: str | None = None  # why vectors stopped (the embedder failed); text goes on
        self.latent_failed: str | None = None  # why latent terms stopped; search fuses the other two
        self.notices: list[str] = []
        self.reader = Searcher(self)  # the hybrid search over what this writes
        self._flushes: deque[tuple[float, int]] = deque(maxlen=64)  # (when, vector watermark) at each write
        self._latent_seen: OrderedDict[tuple[str, str], Any] = OrderedDict()  # (model, text) -> the latent terms
        # how the background thread shares the machine (one core while the session is in use, …)
        self.pacing = Pacing(host, lambda: threading.current_thread() is self._thread, lambda: self._stop)

    # -- writing -----------------------------------------------------------------------------
    def kick(self, force: bool = False) -> None:
        """Something new was written: index it soon, off the caller's thread. With indexing on write
        switched off (`recall_index=false`) only a search (`force`) starts it. Nothing on a store that is
        read-only here: search reads what is indexed, and says how far that is."""
        if (not self.enabled and not force) or self.host.store.read_only:
            return
        self.pacing.touch()
        with self._start_lock:
            self._idle.clear()
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=f"mfs-index-{self.host.name}", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        lower_priority()  # the embedder's threads start from this one and inherit it
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
                if isinstance(exc, StoreError) and not self.host.store.writable():
                    pass  # a read-only store: every search says so itself (`search`)
                elif isinstance(exc, StoreError):
                    self.note(f"indexing paused ({exc}); search answers from what is indexed")
                else:
                    self.note(f"indexing paused ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
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
            states = store.recall_states(name, ["", WINDOWS])
            text_upto, text_seg = states[""]
            win_upto = states[WINDOWS][0]
            by_uid = {e.uid: e for e in events}
            n_rows = 0
            while win_upto + S.WINDOW_EVENTS <= text_upto:  # an older store's windows, in steps
                if self._stop:
                    return {"text_rows": n_rows, "vector_rows": 0}
                self.pacing.yield_to_turn()
                rows = window_rows(name, by_uid, win_upto, min(text_upto, win_upto + TEXT_EVENTS))
                if not rows:  # events this process has not read yet: their windows wait
                    break
                store.index_text(rows)
                win_upto = rows[-1]["uid_to"]
                store.save_recall_state(name, WINDOWS, win_upto, 0)
                n_rows += len(rows)
            new_events = [e for e in events if e.uid > text_upto]
            new_segs = [x for x in segments if x.id > text_seg]
            before = next((e for e in reversed(events) if e.uid <= text_upto), None)
            for i in range(0, max(len(new_events), 1), TEXT_EVENTS):  # a long backlog in steps, between turns
                if self._stop:
                    return {"text_rows": n_rows, "vector_rows": 0}
                self.pacing.yield_to_turn()
                step = new_events[i:i + TEXT_EVENTS]
                rows = rows_for_events(step, before)
                last = i + TEXT_EVENTS >= len(new_events)
                if last:
                    rows += [r for x in new_segs for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
                wins = window_rows(name, by_uid, win_upto, max([text_upto] + [e.uid for e in step]))
                rows += wins
                if rows:
                    store.index_text(rows)
                    self.pacing.yield_to_turn()
                if step or (last and new_segs):
                    text_upto = max([text_upto] + [e.uid for e in step])
                    if last:
                        text_seg = max([text_seg] + [x.id for x in new_segs])
                    store.save_recall_state(name, "", text_upto, text_seg)
                if wins:  # a window is complete every WINDOW_EVENTS events: one more small write then
                    win_upto = wins[-1]["uid_to"]
                    store.save_recall_state(name, WINDOWS, win_upto, 0)
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
            info = self.host.store.optimize_recall(embedder.model_id if embedder is not None else None,
                                                   between=self.pacing.yield_to_turn)
        except Exception as exc:  # a fold is an optimisation: nothing is lost, and indexing goes on
            self.host.log("recall_fold_skipped", error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            return
        if info.get("ann_built"):
            self.host.log("recall_index", ann_built=True, vector_rows=info.get("vector_rows"))

    def _vectors(self, embedder: Any, events: Sequence[Event], segments: Sequence[Segment],
                 turns: dict[int, int], progress: Any, size: int = BATCH, plain: bool = True) -> int:
        """Embed what the model's table lacks, `size` texts per call, and write the vectors (with
        the watermark) every `max(size, WRITE_ROWS)` rows. In the background thread it embeds one
        text at a time and waits while a turn or a search runs, before every text and every commit,
        and while turns keep coming it holds up to `HOLD_ROWS` rows for the moment right after one
        (`Pacing.time_to_write`)."""
        store, name, model_id = self.host.store, self.host.name, embedder.model_id
        upto, seg_upto = store.recall_state(name, model_id)
        # latent terms are written with the vectors; rows embedded before (an older store, a head that
        # failed) get theirs first, and only then does the latent watermark follow the vectors'
        self._latent_sync = self._latent_backfill(embedder, events, segments, turns, (upto, seg_upto))
        new_events = [e for e in events if e.uid > upto]
        before = next((e for e in reversed(events) if e.uid <= upto), None)
        written = 0
        for i in range(0, len(new_events), TEXT_EVENTS):  # rows are built a step at a time, between turns
            self.pacing.yield_to_turn()
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
            self.pacing.yield_to_turn()
            self.pacing.set_threads()
            batch = todo[i:i + size]
            with self.pacing.core():
                try:
                    vectors = row_vectors(embedder, batch)
                    if not np.all(np.isfinite(vectors)):
                        raise ValueError("the embedder returned NaN or infinity")
                except Exception as exc:
                    self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                    self.host.log("recall_index_failure", model=model_id, error=self.failed)
                    self.note(f"the embedder failed ({self.failed}); search uses full text only until the session "
                               "is reopened; nothing is lost")
                    return written, upto, seg_upto
                pending += zip(batch, vectors, self._latent(embedder, batch))
            rest = todo[i + size:]
            if rest and (len(pending) < every or len(pending) < max(every, HOLD_ROWS) and not self.pacing.time_to_write()):
                continue
            self.pacing.yield_to_turn()  # and before each commit: a turn that starts meanwhile overlaps one, not three
            store.index_latent(model_id, [latent_row(r, t) for r, _, t in pending if t is not None])
            self.pacing.yield_to_turn()
            store.index_vectors(model_id, [{k: r[k] for k in INDEX_FIELDS} | {"vector": v.tolist()}
                                           for r, v, _ in pending])
            self.pacing.yield_to_turn()
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
            self._flushes.append((time.monotonic(), upto))
            if self._latent_sync and all(t is not None for r, _, t in flushed if r["chunk"] >= 0):
                store.save_recall_state(name, model_id + LATENT, upto, seg_upto)
            self._wrote(len(flushed), embedder)
        return written, upto, seg_upto

    def _latent_backfill(self, embedder: Any, events: Sequence[Event], segments: Sequence[Segment],
                         turns: dict[int, int], vectors: tuple[int, int]) -> bool:
        """Latent terms for rows whose vectors are stored but whose terms are not (the latent
        watermark is behind the vectors'), a few events at a time between turns. True when the two
        watermarks agree afterwards (new rows then move both)."""
        if S.latent_of(embedder) is None or self.latent_failed:
            return False
        store, name, model_id = self.host.store, self.host.name, embedder.model_id
        upto, seg_upto = store.recall_state(name, model_id + LATENT)
        todo = [e for e in events if upto < e.uid <= vectors[0]]
        before = next((e for e in reversed(events) if e.uid <= upto), None)
        for i in range(0, len(todo), LATENT_EVENTS):
            if self._stop:
                return False
            self.pacing.yield_to_turn()
            step = todo[i:i + LATENT_EVENTS]
            rows = rows_for_events(step, todo[i - 1] if i else before)
            with self.pacing.core():
                terms = self._latent(embedder, rows)
            if any(t is None for t in terms):
                return False
            self.pacing.yield_to_turn()
            store.index_latent(model_id, [latent_row(r, t) for r, t in zip(rows, terms)])
            upto = step[-1].uid
            store.save_recall_state(name, model_id + LATENT, upto, seg_upto)
        segs = [x for x in segments if seg_upto < x.id <= vectors[1]]
        rows = [r for x in segs for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
        if rows:
            with self.pacing.core():
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
        latent = S.latent_of(embedder)
        if latent is None or self.latent_failed:
            return [None] * len(rows)
        want = [r for r in rows if r["chunk"] >= 0]
        self.pacing.set_threads()
        try:
            texts = list(dict.fromkeys([r["text"] for r in want] + [r["before"] for r in want if r.get("before")]))
            seen = self._latent_seen
            need = [t for t in texts if (embedder.model_id, t) not in seen]
            got = dict(zip(need, latent(need))) if need else {}
            if len(got) != len(need):
                raise ValueError(f"{len(got)} latent rows for {len(need)} texts")
            own = {t: got[t] if t in got else seen[embedder.model_id, t] for t in texts}
            for t, v in got.items():
                seen[embedder.model_id, t] = v
                while len(seen) > LATENT_SEEN:
                    seen.popitem(last=False)
            found = iter([pooled(own[r["text"]], own[r["before"]] if r.get("before") else None) for r in want])
        except Exception as exc:  # the dense vectors and full text still work: say so, lose nothing
            self.latent_failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            self.note(f"latent terms are unavailable ({self.latent_failed}); search fuses full text and vectors only")
            return [None] * len(rows)
        return [next(found) if r["chunk"] >= 0 else None for r in rows]

    def last_uid(self) -> int:
        events = self.host.events()
        return events[-1].uid if events else 0

    def note(self, text: str) -> None:
        if text not in self.notices:
            self.notices.append(text)

    def progress(self, load: bool = True) -> dict[str, Any]:
        """How much of the session is indexed: by full text, and by the current embedder (with
        `load` False, only if the embedder is already loaded: `%mfs status` must stay instant)."""
        store, name = self.host.store, self.host.name
        embedder = self.model() if load else (self.host.embedder(False) if not self.failed else None)
        states = store.recall_states(name, ["", WINDOWS] + ([embedder.model_id] if embedder is not None else []))
        text_upto = states[""][0]
        vec_upto = states[embedder.model_id][0] if embedder is not None else 0
        last = self.last_uid()
        rate = self.rate() if embedder is not None and vec_upto < last else None
        return {"last_uid": last, "text_upto": text_upto, "windows_upto": states[WINDOWS][0],
                "vectors_upto": vec_upto if embedder else None,
                "model": embedder.model_id if embedder is not None else None, "failed": self.failed,
                "rate": rate, "eta_s": (last - vec_upto) / rate if rate else None}

    def rate(self) -> float | None:
        """Messages a second the vectors have advanced over the last `RATE_WINDOW_S` of writes, or None
        (fewer than two writes in that time: nothing to tell from)."""
        now = time.monotonic()
        recent = [(t, uid) for t, uid in self._flushes if now - t <= RATE_WINDOW_S]
        if len(recent) < 2 or recent[-1][0] <= recent[0][0] or recent[-1][1] <= recent[0][1]:
            return None
        return (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])

    # -- reading (searcher.Searcher) ---------------------------------------------------------
    def search(self, query: Any, k: Any = S.PAGE, **options: Any) -> Results:
        """Hybrid search over this session's index (`Searcher.search`)."""
        return self.reader.search(query, k, **options)

    def query_vector(self, embedder: Any, query: str) -> np.ndarray:
        return self.reader.query_vector(embedder, query)

    def embed_queries(self, embedder: Any, queries: Sequence[str], keep: int = 512) -> None:
        self.reader.embed_queries(embedder, queries, keep)




def window_rows(session: str, by_uid: dict[int, Event], after: int, upto: int) -> list[dict[str, Any]]:
    """The coarse index's rows of the windows that start after `after` (a window's end, on the grid of
    `search.WINDOW_EVENTS` from uid 1) and end by `upto` and by the newest event this process knows
    (another kernel may have indexed events it has not read yet: their window waits for them)."""
    n, known = S.WINDOW_EVENTS, max(by_uid, default=0)
    rows = []
    for lo in range(after + 1, min(upto, known) - n + 2, n):
        rows += rows_for_window(session, lo, [by_uid.get(u) for u in range(lo, lo + n)])
    return rows


def pooled(own: Any, before: Any) -> Any:
    """A first chunk's latent terms with the event before it: the two texts' terms max-pooled, as
    the head pools a text's tokens, the strongest `LATENT_TERMS` kept."""
    if before is None:
        return own
    best: dict[int, float] = {}
    for ids, weights in (own, before):
        for i, w in zip(ids, weights):
            if w > best.get(i, float("-inf")):
                best[i] = w
    top = sorted(best.items(), key=lambda kv: -kv[1])[:LATENT_TERMS]
    return [i for i, _ in top], [w for _, w in top]


def row_vectors(embedder: Any, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """One vector per index row. Each distinct text is embedded once, on its own words: a user
    message's plain row is its first chunk's vector. A first chunk indexed with the event before it
    takes its own vector turned toward that event's (its last piece's, which the cached embedder
    has usually seen as the previous row), instead of a second pass over the two texts together."""
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    texts = list(dict.fromkeys([r["text"] for r in rows] + [r["before"] for r in rows if r.get("before")]))
    own = dict(zip(texts, np.asarray(embedder(texts), dtype=np.float32)))
    out = np.stack([own[r["text"]] + (CONTEXT_WEIGHT * own[r["before"]] if r.get("before") else 0.0) for r in rows])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def backlog(progress: dict[str, Any]) -> str:
    """What is left of a backlog of vectors, for a status line (`Indexer.progress`): how many messages,
    at what rate and for about how long; "" when nothing is left or no rate is known yet."""
    upto, rate, eta = progress.get("vectors_upto"), progress.get("rate"), progress.get("eta_s")
    if upto is None or not rate or eta is None or upto >= progress["last_uid"]:
        return ""
    minutes = eta / 60
    return (f"; {progress['last_uid'] - upto:,} to go at {rate:.1f} a second, "
            + ("under a minute left" if minutes < 1 else f"about {minutes:.0f} min left"))
