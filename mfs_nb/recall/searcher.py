"""Hybrid search over the recall index an `indexer.Indexer` writes (docs/architecture.md, "Recall").

`Searcher.search` fuses the full-text and the vector rankings, a re-ranking of their candidates by
latent terms (the embedder's sparse head), the turns of the coarse index's windows and, for a query
that names a date, the same searches within the events written then, by reciprocal rank
(search.fuse); over both speakers, the turns that ask then give way (search.discount_questions).
Rows the vectors have not reached yet are still found by full text — and the newest events not
indexed at all by their words, read directly — and the results say so.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Protocol

import numpy as np

from ..errors import InputError
from ..events import Event
from ..models import offprocess
from . import dates
from . import ranking as S
from .ranking import Hit, Results
from .rows import event_text, segment_in_force

CANDIDATES = 50  # rows each method contributes to the fusion
DEEPEST = 400  # rows each method may read when the turns left out as shown crowd a page (`_search`)
SCAN_EVENTS = 20_000  # newest events not yet indexed that a search reads directly
MAX_SPANS = 8  # spans of time one query may name


# A query's vector and latent terms depend on the embedder and the words only, so every session of the
# process shares them: a search over many sessions (the MCP server's) embeds its query once.
_QUERIES: dict[tuple[str, str], np.ndarray] = {}  # (model, query) -> vector, bounded
_LATENT_QUERIES: dict[tuple[str, str], Any] = {}  # (model, query) -> latent terms, bounded
_SEARCHING = [0]  # searches running in this process: the background indexers wait for them (`searching`)
_SEARCHING_LOCK = threading.Lock()
_SEARCHED_AT = [0.0]  # when the last search of this process ended (time.monotonic)


def searching() -> bool:
    """A search is running in this process (in any session): background indexing waits, as for a turn."""
    return _SEARCHING[0] > 0


def last_search() -> float:
    """When the last search of this process ended (time.monotonic; 0 before any): the background
    indexers keep to one core while searches keep coming."""
    return _SEARCHED_AT[0]


@contextmanager
def reading() -> Iterator[None]:
    """Mark a search running (`searching`) for as long as the block lasts: a search, or a request of several."""
    with _SEARCHING_LOCK:
        _SEARCHING[0] += 1
    try:
        with offprocess.foreground():  # the background encoder stops until the search ends
            yield
    finally:
        with _SEARCHING_LOCK:
            _SEARCHING[0] -= 1
            _SEARCHED_AT[0] = time.monotonic()


class IndexState(Protocol):
    """What the reading half reads of the writing half (`indexer.Indexer`): how far it has indexed, its
    embedder, its failures and notices, and a nudge to index now."""

    host: Any
    failed: str | None
    latent_failed: str | None
    notices: list[str]

    def progress(self, load: bool = True) -> dict[str, Any]: ...
    def last_uid(self) -> int: ...
    def model(self) -> Any: ...
    def kick(self, force: bool = False) -> None: ...
    def note(self, text: str) -> None: ...


class Searcher:
    """The reading half of a session's recall index: what the writer (`indexer.Indexer`) has indexed,
    searched, with the query vectors and latent terms it computed kept (for every session of the
    process) for the next search."""

    def __init__(self, index: IndexState):
        self.index = index
        self.host = index.host
        self._queries = _QUERIES
        self._latent_queries = _LATENT_QUERIES
        self._ordered: tuple[int, bool] = (-1, True)  # (events seen, their stamps in time order)

    def search(self, query: Any, k: Any = S.PAGE, *, role: str | Sequence[str] | None = None,
               uid_from: int | None = None, uid_to: int | None = None, neighbours: int = 0,
               methods: Sequence[str] = S.METHODS, shown: Collection[int] = ()) -> Results:
        """Hybrid search over this session's index. Bad input raises InputError with one line. The
        events in `shown` (uids the caller's model already has word for word) are left out of the hits,
        so the page holds what it does not; `Results.left_out` names those of the first k."""
        with reading():
            return self._search(query, k, role=role, uid_from=uid_from, uid_to=uid_to, neighbours=neighbours,
                                methods=methods, shown=shown)

    def _search(self, query: Any, k: Any, *, role: str | Sequence[str] | None, uid_from: int | None,
                uid_to: int | None, neighbours: int, methods: Sequence[str], shown: Collection[int] = (),
                depth: int = CANDIDATES) -> Results:
        query, k = S.check_query(query, k)
        if not 0 <= int(neighbours) <= 5:
            raise InputError(f"neighbours must be between 0 and 5 (got {neighbours})")
        bad = [m for m in methods if m not in S.METHODS]
        if bad or not set(methods) & {"fts", "vector"}:
            raise InputError(f"methods must be fts and/or vector (latent and window only beside them), "
                             f"not {list(methods)!r}")
        where = S.where(self.host.name, role, uid_from, uid_to)
        notices: list[str] = []
        progress = self.index.progress()
        behind_vectors = False  # the vectors' ranking ran and stops short of the log
        if progress["text_upto"] < self.index.last_uid():
            if self.host.store.writable():  # a read-only store gets no thread that would fail
                self.index.kick(force=True)
        elif progress["windows_upto"] + S.WINDOW_EVENTS <= progress["text_upto"] and self.host.store.writable():
            self.index.kick(force=True)  # an older store's coarse index, filled in the background
        roles = [role] if isinstance(role, str) else list(role or [])
        info: dict[tuple[str, int], dict[str, Any]] = {}  # (kind, uid) -> its best row
        ranked: dict[str, list[tuple[str, int]]] = {}
        cut: list[bool] = []  # per read: it returned all the rows `depth` allows (more may match)
        if "fts" in methods:
            rows = self._fts(query, where, depth=depth, cut=cut)
            complete = len(rows) < depth  # every match came back: what did not scores nothing
            ranked["fts"] = self._ranking(rows, info, roles, uid_from, uid_to, 0.0 if complete else None, depth)
            if progress["text_upto"] < self.index.last_uid():  # what the index has not reached, read directly
                ranked["fts@unindexed"] = self._scan(query, progress["text_upto"], roles, uid_from, uid_to,
                                                     depth=depth, cut=cut)
        if "vector" in methods:
            embedder = self.index.model()
            if embedder is None:
                why = self.index.failed or self.host.embedder_off() or "no embedder"
                notices.append(f"full-text search only: vectors are unavailable ({why})")
            else:
                found = self._vector(embedder, query, where, depth)
                if found is not None:
                    cut.append(len(found) >= depth)
                    ranked["vector"] = self._ranking(found, info, roles, uid_from, uid_to, depth=depth)
                    behind_vectors = progress["vectors_upto"] < self.index.last_uid()
        # a query that names a date ("in May 2023", "yesterday") is searched once more within the
        # events written then, and that ranking joins the fusion beside the others
        spans = self._spans(query, uid_from, uid_to)
        if spans:  # one more ranking per method, over all the spans at once
            inside = where + " AND (" + " OR ".join(f"(uid >= {lo} AND uid <= {hi})" for lo, hi in spans) + ")"
            lo, hi = min(a for a, _ in spans), max(b for _, b in spans)  # where neighbours may come from
            if "fts" in ranked:
                rows = self._fts(query, inside, depth=depth, cut=cut)
                ranked["fts@dates"] = self._ranking(rows, info, roles, lo, hi, 0.0 if len(rows) < depth else None,
                                                    depth)
            if "vector" in ranked:
                found = self._vector(self.index.model(), query, inside, depth)
                if found is not None:
                    cut.append(len(found) >= depth)
                    ranked["vector@dates"] = self._ranking(found, info, roles, lo, hi, depth=depth)
        if "latent" in methods and ranked:
            latent = self._latent_ranking(query, ranked, info, role, roles, uid_from, uid_to, notices,
                                          progress["vectors_upto"] or 0, depth)
            if latent is not None:
                ranked["latent"] = latent
        if "window" in methods and "segment" not in roles:  # the coarse index: the turns of the windows found
            windows = self._window_ranking(query, roles, uid_from, uid_to)
            if windows:
                ranked["window"] = windows
        behind = self._behind(progress, behind_vectors)
        notices = ([behind] if behind else []) + notices + self.index.notices
        names = list(ranked)
        fused = S.fuse([[f"{kd}:{u}" for kd, u in ranked[m]] for m in names],
                       weights=[S.WEIGHTS[m.split("@")[0]] for m in names])
        # over both speakers a turn that asks gives way to the answers; among one speaker's turns, their
        # question is what they said
        if not roles or {"user", "assistant"} <= set(roles):
            fused = S.discount_questions(fused, self._asking(fused))
        left: list[int] = []
        if shown:  # what the model has in front of it word for word takes no place on its page
            seen = {x for x, _ in fused if x.startswith("event:") and _item(x)[1] in shown}
            left = [_item(x)[1] for x, _ in fused[:k] if x in seen]
            fused = [(x, sc) for x, sc in fused if x not in seen]
            if len(fused) < k and depth < DEEPEST and any(cut):
                # the turns left out crowded the page and a method's read was cut at `depth`: read deeper once
                return self._search(query, k, role=role, uid_from=uid_from, uid_to=uid_to, neighbours=neighbours,
                                    methods=methods, shown=shown, depth=DEEPEST)
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
        return Results(hits, notices, tuple(dict.fromkeys(m.split("@")[0] for m in names)), tuple(left))

    def _behind(self, progress: dict[str, Any], vectors: bool) -> str:
        """One note on how far the index has come, when it is short of the log ('' when it is not)."""
        last, words = self.index.last_uid(), progress["text_upto"]
        if words >= last and not vectors:
            return ""
        meaning = f"by meaning to uid {progress['vectors_upto']}" if vectors else ""
        aside = f" ({meaning})" if vectors and progress["vectors_upto"] < words else ""
        if not self.host.store.writable():
            return (f"the store at {self.host.store.shown} is read-only: its index stops at uid {words} of {last}"
                    f"{aside}, and newer messages are searched by their words")
        if words < last:
            return (f"the search index has reached uid {words} of {last}{aside}; newer messages are searched by "
                    "their words while it catches up")
        return f"search {meaning} of {last}; newer messages are found by their words while it catches up"

    def _latent_ranking(self, query: str, ranked: dict[str, list[tuple[str, int]]],
                        info: dict[tuple[str, int], dict[str, Any]], role: Any, roles: list[str],
                        uid_from: int | None, uid_to: int | None, notices: list[str], indexed: int = 0,
                        depth: int = CANDIDATES) -> list[tuple[str, int]] | None:
        """The candidates the other rankings found (and their neighbours) ranked once more by the dot
        product of their latent terms with the query's: a third, learned view of the same words.
        None when the embedder has no latent terms, or when some candidate the index has reached
        (`indexed`: its vectors' last uid) has none stored yet (an older store is filled in the
        background): a vote for only some of them would tilt the fusion. Events past `indexed` (the
        newest, found by reading the log) get no vote here, as they get none from the vectors; before,
        one of them among the candidates or their neighbours took this ranking from the whole search."""
        embedder = self.index.model()
        latent = S.latent_of(embedder)
        if embedder is None or latent is None or self.index.latent_failed:
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
        if not rows or any(item not in have for item in found if item[0] != "event" or item[1] <= indexed):
            return None
        scored = list(zip(rows, S.latent_scores(rows, terms).tolist()))
        return self._ranking(scored, info, roles, uid_from, uid_to, 0.0, depth)

    def _window_ranking(self, query: str, roles: list[str], uid_from: int | None, uid_to: int | None
                        ) -> list[tuple[str, int]]:
        """The events inside the coarse index's windows that match the query, the windows and their
        events scored within this session (`search.window_scores`), the events ranked by their window,
        then by their own score (`search.window_ranking`): those the search admits, the first CANDIDATES (a window is 20 events: a deeper read is not needed). It joins the fusion after the latent ranking,
        which re-ranks only what the turn-level methods found."""
        texts = {int(r["uid"]): r["text"] for r, _ in
                 self._fts(query, S.window_where(self.host.name, uid_from, uid_to), windows=True)}
        found, own = S.window_scores(texts, query, self.index.last_uid() // S.WINDOW_EVENTS)
        if not found:
            return []
        admitted = (u for u in S.window_ranking(found, own) if self._admits(u, roles, uid_from, uid_to))
        return [("event", u) for u in itertools.islice(admitted, CANDIDATES)]

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
        windows = dates.time_windows(query, local.replace(tzinfo=None), newest + offset if newest else None)
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

    def _asking(self, fused: Sequence[tuple[str, float]]) -> set[str]:
        """The fused events that ask (`search.asks`)."""
        out = set()
        for key, _ in fused:
            kind, uid = _item(key)
            e = self._event(uid) if kind == "event" else None
            if e is not None and S.asks(e.content or ""):
                out.add(key)
        return out

    def _event(self, uid: int) -> Event | None:
        """The event with this uid, from the session's log in memory (in uid order, usually dense from 1:
        then read at its place, else found by bisection)."""
        events = self.host.events()
        if 0 < uid <= len(events) and events[uid - 1].uid == uid:
            return events[uid - 1]
        at = bisect.bisect_left(events, uid, key=lambda e: e.uid)
        return events[at] if at < len(events) and events[at].uid == uid else None

    def _ranking(self, rows: list[tuple[dict[str, Any], float]], info: dict[tuple[str, int], dict[str, Any]],
                 roles: list[str], uid_from: int | None, uid_to: int | None, floor: float | None = None,
                 depth: int = CANDIDATES) -> list[tuple[str, int]]:
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
        return [item for item, _ in merged[:depth]]

    def _scan(self, query: str, upto: int, roles: list[str], uid_from: int | None, uid_to: int | None,
              limit: int = SCAN_EVENTS, depth: int = CANDIDATES, cut: list[bool] | None = None
              ) -> list[tuple[str, int]]:
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
        if cut is not None:
            cut.append(len(scored) > depth)
        return [("event", uid) for _, uid in scored[:depth]]

    def _admits(self, uid: int, roles: list[str], uid_from: int | None, uid_to: int | None) -> bool:
        """A neighbour brought in by smoothing obeys the same filters as the search."""
        e = self._event(uid)
        return (e is not None and (not roles or e.role in roles) and (uid_from is None or uid >= uid_from)
                and (uid_to is None or uid <= uid_to))

    def _fts(self, query: str, where: str, windows: bool = False, depth: int = CANDIDATES,
             cut: list[bool] | None = None) -> list[tuple[dict[str, Any], float]]:
        """Full-text rows (of the coarse index's windows with `windows`): the word column for Latin
        words, the n-gram column for CJK runs (a mixed query adds both scores); `cut` gets, per column
        read, whether it returned all `depth` rows it was allowed (more may match)."""
        out: list[tuple[dict[str, Any], float]] = []
        latin, cjk = S.fts_query(S.latin_text(query)), S.cjk_text(query)
        for text, is_cjk in ((latin, False), (cjk, True)):
            if text:
                rows = self.host.store.search_text(where, text, is_cjk, depth, windows=windows)
                out += [(r, float(r["_score"])) for r in rows]
                if cut is not None:
                    cut.append(len(rows) >= depth)
        return out

    def _vector(self, embedder: Any, query: str, where: str, depth: int = CANDIDATES
                ) -> list[tuple[dict[str, Any], float]] | None:
        try:
            vector = self.query_vector(embedder, query)
        except Exception as exc:
            self.index.note(f"the embedder failed on the query ({type(exc).__name__}); full-text results only")
            return None
        found = self.host.store.search_vectors(embedder.model_id, where, vector.tolist(), depth)
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
        latent = S.latent_of(embedder)
        if latent is not None and not self.index.latent_failed:  # and their latent terms (a failure: none kept)
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


def _parse_stamp(stamp: str) -> datetime | None:
    """An event's `created_at` (ISO, UTC) as a naive datetime; None when it is missing or odd."""
    try:
        return datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
    except (TypeError, ValueError):
        return None


def _item(key: str) -> tuple[str, int]:
    kind, _, uid = key.partition(":")
    return kind, int(uid)
