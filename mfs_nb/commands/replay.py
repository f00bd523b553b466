"""`mfs-nb replay`: feed a recorded conversation through the memory layer, exactly as live.

Each user message opens a turn; assistant and tool messages are appended as recorded. Before
each recorded assistant message the model would have been called: that is one *call*, and the
memory layer runs `Session.prepare_call()` — the same step a live `chat` runs — and the payload
it would have sent is measured (and optionally written to disk).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError
from .transcripts import Message, load_rows, normalise

__all__ = ["Message", "load_transcript", "normalise", "replay"]


def load_transcript(path: str | Path) -> list[Message]:
    """Read JSONL (one message per line) or a JSON list of OpenAI-format messages; the first line that is
    not a message raises InputError naming it (`mfs-nb import` reads the same files forgivingly)."""
    path = Path(path)
    items, _, where = load_rows(path, strict=True)
    return normalise([m for _, m in items], [f"{path}: {where} {n}" for n, _ in items])


def replay(messages: list[Message], *, window: int | None = None, model: str | None = None,
           store: str | None = None, payloads: str | Path | None = None, session: str = "replay",
           on_call: Callable[[Any, Any], None] | None = None, keep: Callable[[Any], None] | None = None,
           on_start: Callable[[Any], None] | None = None, **settings: Any) -> dict[str, Any]:
    """Run the transcript through a fresh session; return the report (its fields: docs/guide/sessions.md,
    "Replay a recorded conversation").

    `on_start(session)` sees the fresh session before the first message (e.g. to pin values);
    `on_call(session, plan)` sees each call's plan (payload and pressure); `keep(session)` sees the
    session at the end, before a temporary store is removed; `settings` go to the Session."""
    from ..session import Session, shared_prefix_tokens

    tmp = None if store else tempfile.mkdtemp(prefix="mfs-replay-")
    s = None
    try:
        settings.setdefault("background_compaction", False)  # in line, so a replay is deterministic
        s = Session(session, store=store or tmp, model=model, window_tokens=window, **settings)
        if s.events:
            raise InputError(f"session {session!r} in {s.store.shown} already has events; use an empty --store")
        if on_start:
            on_start(s)
        if payloads:
            Path(payloads).mkdir(parents=True, exist_ok=True)
        uids: dict[str, int] = {}
        calls: list[dict[str, Any]] = []
        previous: list[dict[str, Any]] | None = None
        for index, msg in enumerate(messages):
            if msg.role == "assistant":
                started = time.perf_counter()
                plan = s.prepare_call()
                prepare_ms = (time.perf_counter() - started) * 1000
                view = plan.view
                counts = s.token_counts(view)
                shared = shared_prefix_tokens(previous, view.messages, counts.__getitem__) if previous else 0
                calls.append({"call": len(calls) + 1, "turn": s.turn, "payload_tokens": sum(counts),
                              "shared_prefix_tokens": shared, "tier": plan.usage.tier, "notices": plan.notices,
                              "prepare_ms": round(prepare_ms, 2)})
                if payloads:
                    path = Path(payloads) / f"call-{len(calls):05d}.json"
                    path.write_text(json.dumps({"messages": view.messages}, ensure_ascii=False), encoding="utf-8")
                previous = view.messages
                if on_call:
                    on_call(s, plan)
            if msg.role == "user":  # through the same channel as %%chat: a pasted document becomes a snapshot
                event = s.record_user(msg.content)
            else:
                event = s.record(msg.role, msg.content, tool_calls=msg.tool_calls or None,
                                 tool_call_id=msg.tool_call_id, name=msg.name, origin=msg.role)
            uids[str(index)] = event.uid
        final = s.send_view()
        coverage = s.coverage()
        if keep:
            keep(s)
        return {
            "window_tokens": s.window,
            "model": s.settings.model,
            "uids": uids,
            "calls": calls,
            "final_view": {"messages": final.messages, "layers": [layer.to_json() for layer in final.layers]},
            "coverage": coverage,
            "segments": [x.to_json() for x in s.compactor.segments],
            "ledger": s.ledger(),
        }
    finally:
        if s is not None and tmp:
            s.indexer.close(wait_s=60)  # its store is about to be removed
            s.store.settle(60)  # and a fold of its log under way with it
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

