"""Suite `chats`: one session, thousands of offline chats in a row, as a notebook would send them.

Each chat is `Session.chat` on the embedded offline default with the production settings (automatic
compaction, quote detection and the recall index on, the local store), the user's text a LoCoMo turn.
Measured: the time of every chat, the process's resident memory every 100 chats, the store on disk
against the text it holds: right after the last chat, and at rest, once the session has been left
alone as a notebook would be (the recall index catches up, then the quiet-moment fold runs). The
bars (issues 19 and 43): store at rest ≤ 10 × its text; once compaction cycles, a flat turn — the median
of the last 100 chats ≤ 1.2 × the median of chats 1,001–1,100 (the ratio to the first 100, before
anything compacts, mixes in the memory layers' steady cost and is reported, not barred); memory growth
after chat 100 ≤ 200 MB; no chat over 2 s.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ..session import Session
from .dataset import Data
from .storebench import disk_bytes

NAME = "chats"
NEEDS = ("locomo",)
CHATS = 5_000
QUICK_CHATS = 150
EVERY = 100
WINDOW = 32_000  # a small model's window: compaction cycles many times over the run (at 128k it starts near chat 800)
REST_LIMIT_S = 1_800  # the longest the suite waits for the session to come to rest after the last chat
QUICK_REST_LIMIT_S = 10
CYCLING = 1_000  # from this chat on compaction cycles at WINDOW: the flat-turn bar compares against the 100 after it
# what each table of the store is for, in the breakdown of its size
PARTS = (("the log and session state", ("events", "sessions", "compactions", "leases", "ledger", "calls")),
         ("the recall index", ("recall_",)), ("verdicts and origin vectors", ("verbatim", "vectors_")))


def breakdown(folder: Path) -> dict[str, float]:
    """MB on disk per part of the store (PARTS), from its table folders."""
    out = {name: 0.0 for name, _ in PARTS}
    for table in folder.glob("*.lance"):
        part = next((name for name, prefixes in PARTS if table.name.startswith(prefixes)), None)
        if part is not None:
            out[part] += disk_bytes(table) / 1e6
    return out


def rss_mb() -> float:
    """Resident memory of this process now (Linux), in MB; 0 where /proc is absent."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(folder: Path, texts: list[str], chats: int, rest_limit_s: float = REST_LIMIT_S) -> dict[str, Any]:
    s = Session("load", store=str(folder), model="mfs-offline/default", window_tokens=WINDOW)
    start_mb = rss_mb()
    times: list[float] = []
    marks: list[dict[str, Any]] = []
    for i in range(chats):
        begun = time.perf_counter()
        s.chat(texts[i % len(texts)])
        times.append(time.perf_counter() - begun)
        if (i + 1) % EVERY == 0:
            window = times[-EVERY:]
            marks.append({"chats": i + 1, "median_ms": 1000 * statistics.median(window),
                          "max_ms": 1000 * max(window), "rss_mb": rss_mb()})
    text = sum(len(e.content.encode("utf-8")) for e in s.events)
    end_mb = rss_mb()
    busy = disk_bytes(folder)
    begun = time.monotonic()
    indexed = s.indexer.wait(rest_limit_s)
    while not s._quiet.settled() and time.monotonic() - begun < rest_limit_s:
        time.sleep(1.0)
    rest_s, at_rest = time.monotonic() - begun, indexed and s._quiet.settled()
    size = disk_bytes(folder)
    parts = breakdown(folder)
    vectors_done = s.store.recall_state(s.name, s.indexer.model().model_id)[0] if s.indexer.model() else 0
    first, last = statistics.median(times[:EVERY]), statistics.median(times[-EVERY:])
    cycling = statistics.median(times[CYCLING:CYCLING + EVERY]) if chats >= CYCLING + 2 * EVERY else None
    return {"chats": chats, "events": len(s.events), "segments": len(s.compactor.segments),
            "text_mb": text / 1e6, "store_mb": size / 1e6, "store_x_text": size / max(text, 1),
            "store_busy_mb": busy / 1e6, "busy_x_text": busy / max(text, 1), "rest_s": rest_s,
            "at_rest": at_rest, "quiet_folds": s._quiet.runs, "indexed_to": vectors_done, "parts": parts,
            "first100_ms": 1000 * first, "last100_ms": 1000 * last, "last_over_first": last / first,
            "cycling_ms": None if cycling is None else 1000 * cycling,
            "last_over_cycling": None if cycling is None else last / cycling,
            "max_ms": 1000 * max(times), "slowest_chat": times.index(max(times)) + 1,
            "rss_start_mb": start_mb, "rss_100_mb": marks[0]["rss_mb"], "rss_end_mb": end_mb,
            "growth_mb": end_mb - marks[0]["rss_mb"], "marks": marks}


def run(data: Data, quick: bool) -> dict[str, Any]:
    texts = [m["content"] for c in data.get("locomo") for m in c["messages"] if m["content"].strip()]
    chats = QUICK_CHATS if quick else CHATS
    with tempfile.TemporaryDirectory(prefix="mfs-chats-", ignore_cleanup_errors=True) as tmp:
        r = measure(Path(tmp) / "store", texts, chats, QUICK_REST_LIMIT_S if quick else REST_LIMIT_S)
    step = max(1, len(r["marks"]) // 10)
    curve = [[f"{m['chats']:,}", f"{m['median_ms']:.0f}", f"{m['max_ms']:.0f}", f"{m['rss_mb']:.0f}"]
             for m in r["marks"][step - 1::step]]
    bars = [
        ["store on disk at rest ÷ text it holds" if r["at_rest"] else
         f"store on disk {r['rest_s']:.0f} s after the last chat, not yet at rest, ÷ text it holds",
         f"{r['store_mb']:.1f} MB ÷ {r['text_mb']:.1f} MB = {r['store_x_text']:.1f} ×", "≤ 10 ×"],
        ["median chat, last 100 ÷ chats 1,001–1,100 (compaction cycling)",
         "—" if r["cycling_ms"] is None else
         f"{r['last100_ms']:.0f} ÷ {r['cycling_ms']:.0f} ms = {r['last_over_cycling']:.2f}", "≤ 1.2"],
        ["median chat, last 100 ÷ first 100", f"{r['last100_ms']:.0f} ÷ {r['first100_ms']:.0f} ms = "
                                              f"{r['last_over_first']:.2f}", "reported (issue 43)"],
        ["memory growth after the first 100 chats", f"{r['growth_mb']:.0f} MB ({r['rss_100_mb']:.0f} → "
                                                    f"{r['rss_end_mb']:.0f} MB)", "≤ 200 MB"],
        ["slowest chat", f"{r['max_ms']:.0f} ms (chat {r['slowest_chat']:,})", "≤ 2,000 ms"],
    ]
    metrics = {k: round(v, 4) for k, v in r.items() if isinstance(v, (int, float)) and v is not None}
    metrics.update({f"part_mb:{name}": round(mb, 3) for name, mb in r["parts"].items()})
    return {
        "title": f"{chats:,} offline chats in one session",
        "tables": [
            {"caption": "The bars (issues 19 and 43)", "columns": ["measure", "this run", "bar"], "rows": bars},
            {"caption": f"Over the run: each row the {EVERY} chats before it",
             "columns": ["chats", "median ms", "max ms", "resident MB"], "rows": curve},
        ],
        "notes": [
            f"Session.chat on mfs-offline/default at a {WINDOW:,}-token window with the production settings "
            "(automatic compaction, quote detection, the recall index), a local store, LoCoMo turns as the user's "
            "text; one process, nothing else running",
            f"{r['events']:,} events at the end, {r['segments']} segments; memory is the process's resident set "
            f"({r['rss_start_mb']:.0f} MB before the first chat), growth measured at the last chat",
            f"store right after the last chat: {r['store_busy_mb']:.1f} MB ({r['busy_x_text']:.1f} × its text); "
            + (f"at rest {r['rest_s']:.0f} s later, after the recall index caught up and the quiet-moment fold ran"
             if r["at_rest"] else f"measured again {r['rest_s']:.0f} s later, when the suite's wait ran out before "
                                  "the recall index caught up")
            + f" ({r['quiet_folds']} quiet folds in all); the index had vectors up to uid {r['indexed_to']:,} of "
            f"{r['events']:,}",
            ("the store at rest by part: " if r["at_rest"] else "the store then, by part: ") + ", ".join(f"{name} {mb:.1f} MB ({mb / max(r['text_mb'], 1e-9):.1f} × the text)"
                                                      for name, mb in r["parts"].items()),
        ] + ([f"quick run: {QUICK_CHATS} chats"] if quick else []),
        "metrics": metrics,
    }
