"""`mfs-nb demo`: the main job, end to end on the embedded offline default, in a temporary store."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

SCRIPT = [
    "Help me pick the connection-pool size for this service. Our DB allows 120 connections; keep it under 30.",
    "The service runs 4 replicas behind nginx, config in deploy/pool.yaml, and p99 latency is 180 ms at 900 req/s.",
    "Last night `pytest tests/test_pool.py -k saturation` failed with: TimeoutError: pool exhausted after 30.0 s",
    "Never raise max_overflow above 5 — the DBA was explicit about that.",
    "Summarise what we know so far and propose pool_size and max_overflow per replica.",
]


LOG_NAME = "incident-review.md"


def incident_review() -> str:
    """A colleague's write-up pasted as a file: prose, what compaction shrinks best."""
    paragraphs = [
        "# Incident review: checkout slowdowns",
        "Over the last two weeks the checkout service slowed down every evening when traffic peaked. The "
        "symptoms were the same each time: requests queued inside the application while the database itself "
        "stayed mostly idle, and the slowest requests waited for a connection rather than for a query.",
        "We looked at the usual suspects first. The load balancer spread traffic evenly across the replicas, "
        "the database had spare capacity and no lock contention, and the queries in the slow requests were "
        "the same cheap lookups that run quickly during the day. Nothing in the deploy history lines up with "
        "the start of the problem, which suggests a slow drift in traffic rather than a change we made.",
        "The application logs tell the story. When the evening peak arrives, every worker asks the pool for a "
        "connection at once, the pool hands out what it has, and the remaining requests wait until a "
        "connection comes back. Requests that wait long enough time out, the client retries them, and the "
        "retries join the same queue, which makes the next minute worse than the last.",
        "There are two ways out, and they are not exclusive. We can give each replica a larger pool, within "
        "what the database allows in total, or we can stop the retry storm by adding backoff with jitter on "
        "the client side so that a slow minute does not turn into a slow hour. The database team prefers the "
        "second, because a larger pool moves the queue into the database instead of removing it.",
        "Whatever we choose, we should measure the waiting time for a connection directly, alert on it before "
        "users notice, and keep a small amount of headroom for migrations and manual sessions, which the "
        "database administrators rely on during incidents.",
    ]
    return "\n\n".join(paragraphs) + "\n"


def run(out: TextIO, store: str | None = None) -> int:
    """Chat through a real Session, restart it, show the send view and a recall. Returns an exit code."""
    from ..session import Session
    from ..ui.data import layers_text, recall_text
    from ..window.usage import SOURCE_LABELS

    folder = store or tempfile.mkdtemp(prefix="mfs-demo-")
    started = time.monotonic()
    opened: list[Any] = [None, None]  # the session before and after the simulated restart
    try:
        out.write(f"mfs_nb demo · store {folder} · offline default (no model configured)\n\n")
        session = first = opened[0] = Session("demo", store=folder)
        out.write("status line under each reply: ctx = share of the usable window used · tokens of it · prefix = share "
                  "of this payload identical to the previous call's (what a provider's prompt cache can reuse)\n\n")
        log = Path(folder) / LOG_NAME
        log.write_text(incident_review(), encoding="utf-8")
        for text in SCRIPT[:3]:
            _turn(out, session, text, [str(log)] if text is SCRIPT[1] else [])
        out.write("— kernel restart: a new Session on the same store resumes the conversation —\n\n")
        first.indexer.close(wait_s=30)  # the restarted kernel's predecessor: its index thread ends here
        session = opened[1] = Session("demo", store=folder)
        out.write(f"resumed: {len(session.events)} events, last uid {session.last_uid}, "
                  f"context {session.usage().tokens:,} tokens ({SOURCE_LABELS[session.usage().source]})\n\n")
        for text in SCRIPT[3:]:
            _turn(out, session, text)
        out.write("%compact  (what happens by itself when the context fills, done now)\n")
        for notice in session.compact():
            out.write(notice + "\n")
        view = session.send_view()
        usage = session.usage(view)
        out.write(f"\nsend view: {len(view.messages)} messages, {usage.tokens:,} tokens "
                  f"({SOURCE_LABELS[usage.source]})\n")
        out.write(layers_text(view.layers) + "\n")
        if any(x.kind == "segment" for x in view.layers):
            out.write("  (segment: a summary of original messages; merged N×: a summary merged from older summaries)\n")
        out.write("\n")
        out.write(view.messages[1]["content"] + "\n\n")
        out.write("%recall 5-5  (verbatim from the log)\n")
        out.write(recall_text(session.recall(5, 5)) + "\n\n")
        said = [e.content for e in session.recall(1, session.last_uid) if e.role == "user"]
        ok = [t.split("\n\n[attached document")[0] for t in said] == SCRIPT
        out.write(f"every user message recalled byte-identical: {'yes' if ok else 'NO'} "
                  f"({time.monotonic() - started:.1f} s)\n")
        return 0 if ok else 1
    finally:
        # index threads (and a fold of the log) end before their store is removed and before the interpreter
        # exits: one inside a LanceDB call at exit can crash the process (seen once, in a CI run on busy cores)
        for s in opened:
            if s is not None:
                s.indexer.close(wait_s=30)
                s.store.settle(30)
        if store is None:
            shutil.rmtree(folder, ignore_errors=True)


def _turn(out: TextIO, session: Any, text: str, docs: list[str] | tuple[str, ...] = ()) -> None:
    out.write("%%chat" + "".join(f" --doc {Path(d).name}" for d in docs) + f"\n{text}\n\n")
    reply = session.chat(text, docs=docs)
    out.write(reply.text + "\n")
    out.write(reply.usage.status_line() + "\n")
    for notice in reply.notices:
        out.write(notice + "\n")
    out.write("\n")
