"""`mfs-nb demo`: the main job, end to end on the embedded offline default, in a temporary store."""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any, TextIO

SCRIPT = [
    "Help me pick the connection-pool size for this service. Our DB allows 120 connections; keep it under 30.",
    "The service runs 4 replicas behind nginx, config in deploy/pool.yaml, and p99 latency is 180 ms at 900 req/s.",
    "Last night `pytest tests/test_pool.py -k saturation` failed with: TimeoutError: pool exhausted after 30.0 s",
    "Never raise max_overflow above 5 — the DBA was explicit about that.",
    "Summarise what we know so far and propose pool_size and max_overflow per replica.",
]


def run(out: TextIO, store: str | None = None) -> int:
    """Chat through a real Session, restart it, show the send view and a recall. Returns an exit code."""
    from .session import Session
    from .ui.data import layers_text, recall_text

    folder = store or tempfile.mkdtemp(prefix="mfs-demo-")
    started = time.monotonic()
    try:
        out.write(f"mfs_nb demo · store {folder} · offline default (no model configured)\n\n")
        session = Session("demo", store=folder)
        for text in SCRIPT[:3]:
            _turn(out, session, text)
        out.write("— kernel restart: a new Session on the same store resumes the conversation —\n\n")
        session = Session("demo", store=folder)
        out.write(f"resumed: {len(session.events)} events, last uid {session.last_uid}, "
                  f"pressure {session.usage().tokens:,} tokens from {session.usage().source}\n\n")
        for text in SCRIPT[3:]:
            _turn(out, session, text)
        out.write("%compact  (what happens by itself when the context fills, done now)\n")
        for notice in session.compact():
            out.write(notice + "\n")
        view = session.send_view()
        out.write(f"\nsend view: {len(view.messages)} messages, {view.tokens:,} tokens\n")
        out.write(layers_text(view.layers) + "\n\n")
        out.write(view.messages[1]["content"] + "\n\n")
        out.write("%recall 5-5  (verbatim from the log)\n")
        out.write(recall_text(session.recall(5, 5)) + "\n\n")
        ok = [e.content for e in session.recall(1, session.last_uid) if e.role == "user"] == SCRIPT
        out.write(f"every user message recalled byte-identical: {'yes' if ok else 'NO'} "
                  f"({time.monotonic() - started:.1f} s)\n")
        return 0 if ok else 1
    finally:
        if store is None:
            shutil.rmtree(folder, ignore_errors=True)


def _turn(out: TextIO, session: Any, text: str) -> None:
    out.write(f"%%chat\n{text}\n\n")
    reply = session.chat(text)
    out.write(reply.text + "\n")
    out.write(reply.usage.status_line() + "\n")
    for notice in reply.notices:
        out.write(notice + "\n")
    out.write("\n")
