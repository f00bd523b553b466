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

Not measured here yet (issue 19): object storage, several writers, the 5,000-chat row.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ..events import Event
from ..session import Session
from ..store import Store, _layout, now_iso
from .data import Data
from .recall import _pct

NAME = "store"
NEEDS = ("locomo",)
SIZES = (1_000, 10_000, 100_000)
TURNS = 40
IMPORT_BATCH = 5_000


def _session(store: Store) -> Session:
    return Session("big", store=store, recall_index=False, auto_compaction=False, window_tokens=32_000,
                   model="mfs-offline/default", cell_log=False)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _events_layout(folder: Path) -> tuple[int, int]:
    info = _layout(Store(folder)._events, None)
    return info["versions"], info["fragments"]


def measure(root: Path, texts: list[str], n: int) -> dict[str, Any]:
    """One size: build, then the figures of the module doc."""
    folder = root / f"s{n}"
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
    for t in range(TURNS):
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
    size = _bytes(folder)
    started = time.perf_counter()
    Store(folder).maintain(keep_s=0.001)
    maintain_s = time.perf_counter() - started
    versions_after, fragments_after = _events_layout(folder)
    size_after = _bytes(folder)
    text_bytes = sum(len(e.content.encode("utf-8")) for e in s.events)
    return {"events": n, "import_ms_per_event": 1000 * import_s / n,
            "write_p50_ms": 1000 * statistics.median(writes), "write_p95_ms": 1000 * _pct(writes, 0.95),
            "load_s": load_s, "recall50_ms": 1000 * statistics.median(recalls),
            "read50_ms": 1000 * statistics.median(reads), "projection_ms": 1000 * statistics.median(projections),
            "mb": size / 1e6, "mb_after": size_after / 1e6, "text_mb": text_bytes / 1e6,
            "versions": versions, "versions_after": versions_after, "fragments": fragments,
            "fragments_after": fragments_after, "maintain_s": maintain_s}


def run(data: Data, quick: bool) -> dict[str, Any]:
    texts = [f"{m['speaker']}: {m['content']}" for c in data.get("locomo") for m in c["messages"]]
    sizes = SIZES[:2] if quick else SIZES
    with tempfile.TemporaryDirectory(prefix="mfs-store-", ignore_cleanup_errors=True) as tmp:
        results = [measure(Path(tmp), texts, n) for n in sizes]
    rows = [[f"{r['events']:,}", f"{r['write_p50_ms']:.1f}", f"{r['write_p95_ms']:.1f}", f"{r['load_s']:.2f}",
             f"{r['recall50_ms']:.1f}", f"{r['read50_ms']:.1f}", f"{r['projection_ms']:.0f}",
             f"{r['import_ms_per_event']:.3f}"] for r in results]
    disk = [[f"{r['events']:,}", f"{r['text_mb']:.1f}", f"{r['mb']:.1f} → {r['mb_after']:.1f}",
             f"{r['versions']} → {r['versions_after']}", f"{r['fragments']} → {r['fragments_after']}",
             f"{r['maintain_s']:.1f}"] for r in results]
    metrics = {f"{k}_{r['events']}": round(v, 4) for r in results for k, v in r.items() if k != "events"}
    return {
        "title": "The store as the log grows (local)",
        "tables": [
            {"caption": f"One session, local store: write per turn (a user and an assistant event, {TURNS} turns), "
                        "Session() load, recall of 50 events, projection of the next call, import",
             "columns": ["events", "write/turn p50 ms", "write/turn p95 ms", "Session() s", "recall 50 ms",
                         "read 50 from table ms", "projection ms", "import ms/event"], "rows": rows},
            {"caption": "On disk, before → after maintenance (Store.maintain, what %mfs optimize runs)",
             "columns": ["events", "text MB", "store MB", "events versions", "events fragments", "maintenance s"],
             "rows": disk},
        ],
        "notes": [
            "the history is written as an import writes it (5,000 events a batch); the turns after it as a chat "
            "writes them: each event durable before `record` returns (a plain append under the store's lock file; "
            "its keys are looked up in the BTree index on key only when another writer committed since this "
            "store's last append or a uid is not new; rows written since the last fold into the indexes, every "
            "200 writes, are scanned)",
            "BTree indexes on the log's key, session and uid; Session() reads the session's rows column-wise",
            "text is LoCoMo turns repeated; recall and projection are medians of 10 and 3 runs",
            "not measured yet (issue 19): the store on object storage, several writers, 5,000 chats in one session",
        ] + (["quick run: 1k and 10k events"] if quick else []),
        "metrics": metrics,
    }
