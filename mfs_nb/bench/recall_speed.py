"""Suite `recall_speed`: search latency and index cost at 1k/10k/100k events, chat-turn time with and
without background indexing, and `mfs-nb index` on a backlog (see `recallbench` for the method and the
conversations it writes)."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from ..models.embed import LATENT_TERMS
from ..recall import ranking as S
from ..recall.indexer import (
    INDEX_FIELDS,
    WINDOWS,
    latent_row,
    plain_rows,
    rows_for_events,
    window_rows,
)
from ..recall.pacing import IDLE_CORES_S
from ..store import ANN_MIN_ROWS, Store
from .dataset import Data
from .recallbench import open_session, write_turns

NAME = "recall_speed"
NEEDS = ("locomo",)


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
        write_turns(store, "big", [("user" if i % 2 else "assistant", f"{texts[i % len(texts)]} (#{i})") for i in range(n)],
               [(datetime(2023, 1, 1) + timedelta(seconds=i * 365 * 86_400 // n)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
                for i in range(n)])
        s = open_session(store, "big", index=False)
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
        write_turns(store, "t", [("user" if i % 2 == 0 else "assistant", f"message {i} about topic {i % 97}")
                            for i in range(n)])
        s = open_session(store, "t", index=index)
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
    write_turns(store, "r", [(m["role"], f"{m['speaker']}: {m['content']}") for m in messages])
    s = open_session(store, "r", index=True)
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


def run(data: Data, quick: bool) -> dict[str, Any]:
    """Search latency and index cost at 1k/10k/100k events; chat-turn time with and without indexing."""
    sizes = (1_000,) if quick else (1_000, 10_000, 100_000)
    with tempfile.TemporaryDirectory(prefix="mfs-recall-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        lat = latency(data, root, sizes)
        turn = turn_time(root, 300 if quick else 10_000, 3 if quick else TURNS)
        rate = index_rate(data, root, 40 if quick else RATE_EVENTS)
        from . import bulk

        bulk_rows = bulk.rates(data, root, quick, write_turns)
        during = bulk.during_bulk(data, root, lambda: turn_time(root, 300 if quick else 10_000, 3 if quick else TURNS,
                                                                sides=("off",), tag="bulk"), write_turns)
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
