"""Suite `store`: the embedded log as it grows — 1k, 10k and 100k events in one session, local.

For each size a session's history is written as an import would (batches of 5,000 events), then:
- write per turn: 40 turns, each a user event and an assistant event written by `Session.record`
  as a chat turn writes them (each event is durable before the call returns), p50 and p95;
- `Session()` load: a new Store object and a new Session on the same folder (the log read back);
- recall of a 50-event range (`Session.recall`) and the same range read from the table;
- projection: the payload of the next call (`Session.send_view`) built from the whole log, with
  a window that holds the newest events (compaction off: this is the projection's own cost);
- the store on disk (bytes, the events table's versions and fragments) before and after
  maintenance (`Store.maintain`, what `%mfs optimize` runs).
The text is LoCoMo turns repeated (real lengths, no model), so sizes are realistic.

The same figures on object storage: an S3-compatible server on 127.0.0.1 (moto's, started by the
suite; skipped with a note where moto is not installed), sizes 1k and 10k. And several writers: 4
processes chatting (`Session.chat`, offline default) in one session at once, on a local folder and
on the loopback S3 server: turns per second, and events lost (acknowledged to a writer, not in the log
afterwards) or duplicated (one message twice) — both must be 0. The 5,000-chat row is `bench chats`.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..events import Event, now_iso
from ..session import Session
from ..store import Store
from ..store.salvage import layout
from .dataset import Data
from .recall_speed import percentile

NAME = "store"
NEEDS = ("locomo",)
SIZES = (1_000, 10_000, 100_000)
S3_SIZES = (1_000, 10_000)
WRITERS = 4
WRITER_TURNS = 12
BUCKET = "mfs-bench"
TURNS = 40
IMPORT_BATCH = 5_000


def _session(store: Store) -> Session:
    return Session("big", store=store, recall_index=False, auto_compaction=False, window_tokens=32_000,
                   model="mfs-offline/default", cell_log=False)


def disk_bytes(place: Path | str) -> int:
    if isinstance(place, Path):
        return sum(p.stat().st_size for p in place.rglob("*") if p.is_file())
    import boto3  # with moto: the loopback server's objects under the store's prefix

    bucket, _, prefix = place.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    total = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        total += sum(o["Size"] for o in page.get("Contents", []))
    return total


def _events_layout(folder: Path | str) -> tuple[int, int]:
    info = layout(Store(folder)._events, None)
    return info["versions"], info["fragments"]


def s3_env(endpoint: str) -> dict[str, str]:
    """Test credentials and the endpoint of a loopback S3 server, as a user sets them: in the environment."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"}


def start_s3(bucket: str, port: int = 0) -> tuple[Any, str]:
    """moto's S3 server on 127.0.0.1 (in a thread, no external service) with `bucket` made: (server,
    endpoint). ImportError where moto is not installed."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test-key", aws_secret_access_key="test-secret",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    return server, endpoint


@contextmanager
def loopback_s3() -> Any:
    """A loopback S3 server with one bucket, its endpoint and credentials in the environment (children
    inherit them) while the block runs; yields the bucket's URI, or None where moto is not installed."""
    try:
        server, endpoint = start_s3(BUCKET)
    except ImportError:
        yield None
        return
    env = s3_env(endpoint)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield f"s3://{BUCKET}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def _writer(uri: str, tag: str, turns: int, ready: Any, go: Any, out: Any) -> None:
    """One of the concurrent writers (a spawned process): chat `turns` times, report what was acknowledged."""
    acks: list[tuple[int, str, str]] = []
    error = ""
    try:
        s = Session("crowd", store=uri, recall_index=False, auto_compaction=False, model="mfs-offline/default",
                    cell_log=False)
        ready.put(tag)
        go.wait(300)
        for t in range(turns):
            reply = s.chat(f"writer {tag}, turn {t}: the pool size is {t * 7 + 3}")
            by_uid = {e.uid: e for e in s.events}
            acks += [(uid, by_uid[uid].sha256, by_uid[uid].role) for uid in reply.uids]
    except Exception as exc:  # reported, and counted as a failed writer
        error = f"{type(exc).__name__}: {exc}"[:300]
        ready.put(tag)
    out.put((tag, acks, error))


def crowd(uri: str, turns: int = WRITER_TURNS) -> dict[str, Any]:
    """WRITERS processes chatting in one session at once: turns per second, lost and duplicated events."""
    Session("crowd", store=uri, recall_index=False, auto_compaction=False, model="mfs-offline/default",
            cell_log=False)  # the tables exist before the writers start
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_writer, args=(uri, str(i), turns, ready, go, out)) for i in range(WRITERS)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    started = time.perf_counter()
    go.set()
    results = [out.get(timeout=900) for _ in procs]
    seconds = time.perf_counter() - started
    for p in procs:
        p.join(60)
    events = {e.uid: e for e in Store(uri).load_events("crowd")}
    acks = [a for _, got, _ in results for a in got]
    lost = sum(1 for uid, sha, _ in acks if uid not in events or events[uid].sha256 != sha)
    users = Counter(e.content for e in events.values() if e.role == "user")
    turns = sum(1 for _, _, role in acks if role == "user")
    return {"turns": turns, "seconds": seconds, "turns_per_s": turns / seconds, "lost": lost,
            "duplicated": sum(n - 1 for n in users.values() if n > 1), "events": len(events),
            "errors": [err for _, _, err in results if err]}


def measure(root: Path | str, texts: list[str], n: int, turns: int = TURNS) -> dict[str, Any]:
    """One size: build, then the figures of the module doc."""
    folder = root / f"s{n}" if isinstance(root, Path) else f"{root}/s{n}"
    store = Store(folder)
    stamp = now_iso()
    started = time.perf_counter()
    for i in range(0, n, IMPORT_BATCH):
        store.append_events([Event(uid=u + 1, session="big", turn=u // 2 + 1, role="user" if u % 2 == 0 else "assistant",
                                   content=texts[u % len(texts)], turn_start=u % 2 == 0, created_at=stamp)
                             for u in range(i, min(n, i + IMPORT_BATCH))], "import")
    import_s = time.perf_counter() - started
    started = time.perf_counter()
    s = _session(Store(folder))
    load_s = time.perf_counter() - started
    writes = []
    for t in range(turns):
        begun = time.perf_counter()
        s.record("user", f"turn {t}: {texts[t % len(texts)]}", new_turn=True)
        s.record("assistant", texts[(t + 7) % len(texts)])
        writes.append(time.perf_counter() - begun)
    mid = max(1, n // 2)
    recalls, reads = [], []
    for k in range(10):
        begun = time.perf_counter()
        got = s.recall(mid + k, mid + k + 49)
        recalls.append(time.perf_counter() - begun)
        assert len(got) == 50
        begun = time.perf_counter()
        rows = s.store.load_events("big", mid + k, mid + k + 49)
        reads.append(time.perf_counter() - begun)
        assert len(rows) == 50
    projections = []
    for _ in range(3):
        begun = time.perf_counter()
        s.send_view()
        projections.append(time.perf_counter() - begun)
    versions, fragments = _events_layout(folder)
    size = disk_bytes(folder)
    started = time.perf_counter()
    Store(folder).maintain(keep_s=0.001)
    maintain_s = time.perf_counter() - started
    versions_after, fragments_after = _events_layout(folder)
    size_after = disk_bytes(folder)
    text_bytes = sum(len(e.content.encode("utf-8")) for e in s.events)
    return {"events": n, "import_ms_per_event": 1000 * import_s / n,
            "write_p50_ms": 1000 * statistics.median(writes), "write_p95_ms": 1000 * percentile(writes, 0.95),
            "load_s": load_s, "recall50_ms": 1000 * statistics.median(recalls),
            "read50_ms": 1000 * statistics.median(reads), "projection_ms": 1000 * statistics.median(projections),
            "mb": size / 1e6, "mb_after": size_after / 1e6, "text_mb": text_bytes / 1e6,
            "versions": versions, "versions_after": versions_after, "fragments": fragments,
            "fragments_after": fragments_after, "maintain_s": maintain_s}


def run(data: Data, quick: bool) -> dict[str, Any]:
    texts = [f"{m['speaker']}: {m['content']}" for c in data.get("locomo") for m in c["messages"]]
    # quick: one size each, and on object storage (where a write is a round trip) an eighth of the turns
    sizes = SIZES[:1] if quick else SIZES
    s3_sizes = S3_SIZES[:1] if quick else S3_SIZES
    s3_turns, s3_writer_turns = (TURNS // 8, WRITER_TURNS) if quick else (TURNS, WRITER_TURNS)
    with tempfile.TemporaryDirectory(prefix="mfs-store-", ignore_cleanup_errors=True) as tmp:
        results = [{"where": "local", **measure(Path(tmp), texts, n)} for n in sizes]
        crowds = [{"where": "local", **crowd(str(Path(tmp) / "crowd"))}]
        with loopback_s3() as bucket:
            if bucket is not None:
                prefix = f"{bucket}/{Path(tmp).name}"
                results += [{"where": "S3 (loopback)", **measure(prefix, texts, n, s3_turns)} for n in s3_sizes]
                if not quick:  # quick: the writers race locally only (tests/test_store.py races them on S3)
                    crowds.append({"where": "S3 (loopback)", **crowd(f"{prefix}/crowd", s3_writer_turns)})
    rows = [[r["where"], f"{r['events']:,}", f"{r['write_p50_ms']:.1f}", f"{r['write_p95_ms']:.1f}", f"{r['load_s']:.2f}",
             f"{r['recall50_ms']:.1f}", f"{r['read50_ms']:.1f}", f"{r['projection_ms']:.0f}",
             f"{r['import_ms_per_event']:.3f}"] for r in results]
    disk = [[r["where"], f"{r['events']:,}", f"{r['text_mb']:.1f}", f"{r['mb']:.1f} → {r['mb_after']:.1f}",
             f"{r['versions']} → {r['versions_after']}", f"{r['fragments']} → {r['fragments_after']}",
             f"{r['maintain_s']:.1f}"] for r in results]
    many = [[c["where"], str(WRITERS), f"{c['turns']}", f"{c['turns_per_s']:.1f}", str(c["lost"]), str(c["duplicated"]),
             "; ".join(c["errors"]) or "none"] for c in crowds]
    tag = {"local": "", "S3 (loopback)": "s3_"}
    metrics = {f"{tag[r['where']]}{k}_{r['events']}": round(v, 4) for r in results for k, v in r.items()
               if k not in ("events", "where")}
    metrics.update({f"{tag[c['where']]}writers_{k}": round(v, 4) for c in crowds for k, v in c.items()
                    if isinstance(v, (int, float))})
    notes = [
        "the history is written as an import writes it (5,000 events a batch); the turns after it as a chat "
        "writes them: each event durable before `record` returns (local: a plain append under the store's lock "
        "file, its keys looked up in the BTree index on key only when another writer committed since this "
        "store's last append or a uid is not new; object storage: no lock file joins two machines, so every "
        "write looks its keys up, appends, and reads them again)",
        "BTree indexes on the log's key, session and uid; Session() reads the session's rows column-wise",
        "text is LoCoMo turns repeated; recall and projection are medians of 10 and 3 runs",
        "object storage keeps versions an hour at least (clocks of two machines may differ), so maintenance "
        "there folds fragments but removes no version of this run",
        f"writers: {WRITERS} spawned processes, {WRITER_TURNS} chats each on mfs-offline/default, started together "
        "once every one has opened the session; lost = acknowledged to its writer but not the event of that uid "
        "afterwards, duplicated = one message twice in the log",
    ]
    if len(crowds) == 1:
        notes.append("object storage not measured: moto is not installed (`pip install 'moto[server]'`)")
    return {
        "title": "The store as the log grows (local and object storage)",
        "tables": [
            {"caption": f"One session: write per turn (a user and an assistant event, {TURNS} turns), "
                        "Session() load, recall of 50 events, projection of the next call, import",
             "columns": ["store", "events", "write/turn p50 ms", "write/turn p95 ms", "Session() s", "recall 50 ms",
                         "read 50 from table ms", "projection ms", "import ms/event"], "rows": rows},
            {"caption": "On disk, before → after maintenance (Store.maintain, what %mfs optimize runs)",
             "columns": ["store", "events", "text MB", "store MB", "events versions", "events fragments",
                         "maintenance s"], "rows": disk},
            {"caption": "Several writers in one session at once",
             "columns": ["store", "writers", "turns", "turns/s", "lost", "duplicated", "errors"], "rows": many},
        ],
        "notes": notes + ([f"quick run: local 1k, S3 1k with {s3_turns} turns, the writers locally only"] if quick else []),
        "metrics": metrics,
    }
