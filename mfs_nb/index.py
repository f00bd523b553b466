"""Index on write and hybrid search for one session (DESIGN §5, recall by meaning).

`Indexer` keeps the recall index of a session up to date in a background thread: every event
(user, assistant, tool result, attached document, cut into chunks) and every segment's prose
gets a text row (full-text indexed at once) and, in batches, a vector row in the table of the
session's embedding model. A turn only wakes the thread; it never waits for it. Watermarks in
the store (`recall_state`) make a restart resume where indexing stopped, and a vector table per
model means that changing the embedder re-indexes into a fresh table instead of mixing spaces.

`search` fuses the full-text and the vector rankings by reciprocal rank (search.fuse). Rows the
vectors have not reached yet are still found by full text, and the results say so.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import search as S
from .errors import InputError
from .events import Event
from .search import Hit, Results
from .store import now_iso

if TYPE_CHECKING:
    from .segments import Segment
    from .session import Session

BATCH = 16  # texts per embedding call: small, so the model lock is released often
OPTIMIZE_EVERY = 2_000  # text rows between index optimisations
CANDIDATES = 50  # rows each method contributes to the fusion


def event_text(e: Event) -> str:
    """What of an event is indexed: its content, and the tool calls an assistant made."""
    text = e.content or ""
    for c in e.tool_calls:
        fn = c.get("function") or {}
        text += f"\n[{fn.get('name', '?')}({(fn.get('arguments') or '')[:300]})]"
    return text.strip()


def rows_for_event(e: Event) -> list[dict[str, Any]]:
    return [_row(e.session, "event", e.uid, e.uid, e.turn, e.role, i, c) for i, c in enumerate(S.chunks(event_text(e)))]


def rows_for_segment(session: str, seg: Segment, turn: int) -> list[dict[str, Any]]:
    return [_row(session, "segment", seg.uid_from, seg.uid_to, turn, "segment", i, c)
            for i, c in enumerate(S.chunks(seg.prose))]


def _row(session: str, kind: str, uid: int, uid_to: int, turn: int, role: str, chunk: int, text: str
         ) -> dict[str, Any]:
    return {"key": f"{session}\x1f{kind}\x1f{uid:012d}\x1f{chunk:04d}", "session": session, "kind": kind, "uid": uid,
            "uid_to": uid_to, "turn": turn, "role": role, "chunk": chunk, "text": text, "cjk": S.cjk_text(text),
            "created_at": now_iso()}


class Indexer:
    """The recall index of one session: background writer and hybrid search."""

    def __init__(self, session: Session, enabled: bool = True):
        self.s = session
        self.enabled = enabled
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._run_lock = threading.Lock()
        self._rows_since_optimize = 0
        self._queries: dict[tuple[str, str], np.ndarray] = {}  # (model, query) -> vector, bounded
        self.failed: str | None = None  # why vectors stopped (the embedder failed); text goes on
        self.notices: list[str] = []

    # -- writing -----------------------------------------------------------------------------
    def kick(self, force: bool = False) -> None:
        """Something new was written: index it soon, off the caller's thread. With indexing on write
        switched off (`recall_index=false`) only a search (`force`) starts it."""
        if not self.enabled and not force:
            return
        self._idle.clear()
        self._wake.set()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=f"mfs-index-{self.s.name}", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            if not self._wake.wait(timeout=30):
                return  # idle long enough: the thread ends; the next write starts another
            self._wake.clear()
            try:
                self.catch_up()
            except Exception as exc:  # the index is derived data: a failure costs nothing in the log
                self._note(f"indexing paused ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                           "search answers from what is indexed")
            finally:
                if not self._wake.is_set():
                    self._idle.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background indexer has nothing left (tests, CLI, benchmarks)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        self._stop = True
        self._wake.set()

    def model(self) -> Any:
        """The session's embedder (the verbatim track's, quality-gated), or None (full text only)."""
        if self.failed:
            return None
        return self.s.verbatim.vector_layer()

    def catch_up(self, progress: Any = None) -> dict[str, int]:
        """Index everything not indexed yet: text rows first (cheap), then vectors in batches.
        Returns counts; `progress(done, total)` is called between batches when given."""
        with self._run_lock:
            store, name = self.s.store, self.s.name
            events = list(self.s._events)
            segments = list(self.s.compactor.segments)
            turns = {e.uid: e.turn for e in events}
            text_upto, text_seg = store.recall_state(name, "")
            new_events = [e for e in events if e.uid > text_upto]
            new_segs = [x for x in segments if x.id > text_seg]
            rows = [r for e in new_events for r in rows_for_event(e)]
            rows += [r for x in new_segs for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
            if rows:
                store.index_text(rows)
            if new_events or new_segs:
                store.save_recall_state(name, "", max([text_upto] + [e.uid for e in new_events]),
                                        max([text_seg] + [x.id for x in new_segs]))
            self._rows_since_optimize += len(rows)
            done = {"text_rows": len(rows), "vector_rows": 0}
            embedder = self.model()
            if embedder is not None:
                done["vector_rows"] = self._vectors(embedder, events, segments, turns, progress)
            if self._rows_since_optimize >= OPTIMIZE_EVERY:
                self._rows_since_optimize = 0
                info = store.optimize_recall(embedder.model_id if embedder is not None else None)
                if info.get("ann_built"):
                    self.s._log("recall_index", ann_built=True, vector_rows=info.get("vector_rows"))
            return done

    def _vectors(self, embedder: Any, events: Sequence[Event], segments: Sequence[Segment],
                 turns: dict[int, int], progress: Any) -> int:
        store, name, model_id = self.s.store, self.s.name, embedder.model_id
        upto, seg_upto = store.recall_state(name, model_id)
        todo = [r for e in events if e.uid > upto for r in rows_for_event(e)]
        todo += [r for x in segments if x.id > seg_upto for r in rows_for_segment(name, x, turns.get(x.uid_to, 0))]
        written = 0
        for i in range(0, len(todo), BATCH):
            batch = todo[i:i + BATCH]
            try:
                vectors = np.asarray(embedder([r["text"] for r in batch]), dtype=np.float32)
                if not np.all(np.isfinite(vectors)):
                    raise ValueError("the embedder returned NaN or infinity")
            except Exception as exc:
                self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                self.s._log("recall_index_failure", model=model_id, error=self.failed)
                self._note(f"the embedder failed ({self.failed}); search uses full text only until the session "
                           "is reopened; nothing is lost")
                return written
            store.index_vectors(model_id, [{k: r[k] for k in ("key", "session", "kind", "uid", "uid_to", "turn",
                                                               "role", "chunk")} | {"vector": v.tolist()}
                                            for r, v in zip(batch, vectors)])
            written += len(batch)
            # the watermark moves only past uids whose every chunk is written
            done_events = [r["uid"] for r in batch if r["kind"] == "event"]
            rest = todo[i + BATCH:]
            if done_events:
                pending = min((r["uid"] for r in rest if r["kind"] == "event"), default=None)
                upto = max(upto, max(done_events) if pending is None else min(max(done_events), pending - 1))
            done_segs = {int(x.id) for x in segments
                         if any(r["kind"] == "segment" and r["uid"] == x.uid_from for r in batch)}
            if done_segs and not any(r["kind"] == "segment" for r in rest):
                seg_upto = max([seg_upto, *done_segs])
            store.save_recall_state(name, model_id, upto, seg_upto)
            if progress is not None:
                progress(i + len(batch), len(todo))
        return written

    def _note(self, text: str) -> None:
        if text not in self.notices:
            self.notices.append(text)

    def progress(self) -> dict[str, Any]:
        """How much of the session is indexed: by full text, and by the current embedder."""
        store, name = self.s.store, self.s.name
        embedder = self.model()
        text_upto, _ = store.recall_state(name, "")
        vec_upto = store.recall_state(name, embedder.model_id)[0] if embedder is not None else 0
        return {"last_uid": self.s.last_uid, "text_upto": text_upto, "vectors_upto": vec_upto,
                "model": embedder.model_id if embedder is not None else None, "failed": self.failed}

    # -- reading -----------------------------------------------------------------------------
    def search(self, query: Any, k: Any = 10, *, role: str | Sequence[str] | None = None,
               uid_from: int | None = None, uid_to: int | None = None, neighbours: int = 0,
               methods: Sequence[str] = ("fts", "vector")) -> Results:
        """Hybrid search over this session's index. Bad input raises InputError with one line."""
        query, k = S.check_query(query, k)
        if not 0 <= int(neighbours) <= 5:
            raise InputError(f"neighbours must be between 0 and 5 (got {neighbours})")
        bad = [m for m in methods if m not in ("fts", "vector")]
        if bad or not methods:
            raise InputError(f"methods must be fts and/or vector, not {list(methods)!r}")
        where = S.where(self.s.name, role, uid_from, uid_to)
        notices: list[str] = []
        progress = self.progress()
        if progress["text_upto"] < self.s.last_uid:
            self.kick(force=True)
            notices.append(f"the index covers uids up to {progress['text_upto']} of {self.s.last_uid}; "
                           "indexing continues in the background")
        ranked: dict[str, list[str]] = {}
        rows: dict[str, dict[str, Any]] = {}
        if "fts" in methods:
            ranked["fts"] = self._fts(query, where, rows)
        if "vector" in methods:
            embedder = self.model()
            if embedder is None:
                why = self.failed or self.s.verbatim.off_reason or "no embedder"
                notices.append(f"full-text search only: vectors are unavailable ({why})")
            else:
                vec = self._vector(embedder, query, where, rows)
                if vec is not None:
                    ranked["vector"] = vec
                    if progress["vectors_upto"] < self.s.last_uid:
                        notices.append(f"vectors cover uids up to {progress['vectors_upto']} of {self.s.last_uid}; "
                                       "newer events are found by full text while vectors catch up")
        notices += self.notices
        fused = S.fuse(list(ranked.values()))
        texts = self.s.store.index_texts([key for key, _ in fused[:k * 3] if not rows[key].get("text")])
        hits: list[Hit] = []
        seen: set[tuple[str, int]] = set()
        for key, score in fused:
            r = rows[key]
            ident = (r["kind"], int(r["uid"]))
            if ident in seen:  # one hit per event (its best chunk)
                continue
            seen.add(ident)
            via = tuple(m for m, lst in ranked.items() if key in lst)
            text = r.get("text") or texts.get(key, "")
            hits.append(Hit(int(r["uid"]), r["role"], int(r["turn"]), round(score, 5), S.snippet(text, query),
                            r["kind"], int(r["uid_to"]), via, self._around(int(r["uid"]), neighbours)))
            if len(hits) == k:
                break
        return Results(hits, notices, tuple(ranked))

    def _fts(self, query: str, where: str, rows: dict[str, dict[str, Any]]) -> list[str]:
        """One full-text ranking: the word column for Latin words, the n-gram column for CJK runs."""
        out = []
        latin, cjk = S.fts_query(S.latin_text(query)), S.cjk_text(query)
        for text, is_cjk in ((latin, False), (cjk, True)):
            if text:
                found = self.s.store.search_text(where, text, is_cjk, CANDIDATES)
                for r in found:
                    rows.setdefault(r["key"], r)
                out.append([r["key"] for r in found])
        return out[0] if len(out) == 1 else [key for key, _ in S.fuse(out)]

    def _vector(self, embedder: Any, query: str, where: str, rows: dict[str, dict[str, Any]]) -> list[str] | None:
        try:
            vector = self.query_vector(embedder, query)
        except Exception as exc:
            self._note(f"the embedder failed on the query ({type(exc).__name__}); full-text results only")
            return None
        found = self.s.store.search_vectors(embedder.model_id, where, vector.tolist(), CANDIDATES)
        for r in found:
            rows.setdefault(r["key"], r)
        return [r["key"] for r in found]

    def query_vector(self, embedder: Any, query: str) -> np.ndarray:
        """The query's vector (e5 queries take their own prefix); the last few hundred are kept."""
        key = (embedder.model_id, query)
        if key not in self._queries:
            inner = getattr(embedder, "inner", embedder)
            embed_query = getattr(inner, "embed_query", None) or getattr(inner, "embed", None) or embedder
            if len(self._queries) > 512:
                self._queries.clear()
            self._queries[key] = np.asarray(embed_query([query]), dtype=np.float32)[0]
        return self._queries[key]

    def _around(self, uid: int, n: int) -> tuple[dict[str, Any], ...]:
        if n <= 0:
            return ()
        events = self.s._events
        lo, hi = uid - n, uid + n
        return tuple({"uid": e.uid, "role": e.role, "turn": e.turn, "content": e.content}
                     for e in events if lo <= e.uid <= hi)

