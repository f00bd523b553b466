"""Suite `notebook` (issue 18): what the notebook-native memory costs the prefix cache and the window.

1. Prefix-cache ratio of the bytes really sent (the payload with the `show_budget` note at its tail),
   LoCoMo conversations replayed at 8k and 32k: (a) no note, no knowledge slot; (b) the note on;
   (c) the note on and five values pinned before the first message and never changed. The ratio of
   an ordinary call (one with no memory-layer event) is the share of the previous request's tokens
   that the new request repeats byte for byte from its start; it is computed here on the sent
   messages with the engine's token estimate, and also on the previous request less its note (the
   note is the one part of a request built never to be repeated).
2. The cell log's cost: tokens that notebook cells take in the payload per 100 cells. No notebook is
   in the data, so the cells are the shell commands of the coding-agent sessions (each `Bash` call:
   its command as the cell's first line, its output's first line as the digest, an error when the
   output says so), run 1, 5 or 20 between two chats.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import statistics
import tempfile
from typing import Any

from ..commands.replay import normalise, replay
from ..layers.cells import CellRecord
from ..window.tokens import message_tokens
from .dataset import Data, to_openai

NAME = "notebook"
NEEDS = ("locomo", "claude_code_sessions")
WINDOWS = (8_000, 32_000)
QUICK_MESSAGES = 200  # quick: the conversation's first 200 messages (at 8k it still compacts)
QUICK_CELLS = 150  # quick: the first 150 shell cells
PINS = {"project": "orders-pipeline v2", "db": "postgres://db-eu-1:5433/orders", "owner": "data-platform team",
        "deadline": "2026-12-15", "budget": "p95 latency under 200 ms"}
MODES = (("no note, no slot", False, False), ("note on", True, False), ("note on + 5 pinned values", True, True))
_ERROR = re.compile(r"(?im)^\s*(?:error|[A-Za-z_.]*(?:Error|Exception)\b|traceback|fatal:|exit code [1-9])")


def _ratios(sent: list[list[dict[str, Any]]], ordinary: list[bool], note_tokens: list[int]) -> tuple[float, float]:
    whole, before_note = [], []
    for i in range(1, len(sent)):
        if not ordinary[i]:
            continue
        prev, cur = sent[i - 1], sent[i]
        total = sum(message_tokens(m) for m in prev)
        shared = 0
        for a, b in zip(prev, cur):
            if a != b:
                x, y = a.get("content") or "", b.get("content") or ""
                n = 0
                while n < min(len(x), len(y)) and x[n] == y[n]:
                    n += 1
                shared += message_tokens({"role": a.get("role"), "content": x[:n]}) if n else 0
                break
            shared += message_tokens(a)
        whole.append(min(shared / total, 1.0))
        before_note.append(min(shared / max(total - note_tokens[i - 1], 1), 1.0))
    return statistics.fmean(whole), statistics.fmean(before_note)


def run_prefix(messages: list[Any], window: int, note: bool, pins: bool) -> dict[str, Any]:
    sent: list[list[dict[str, Any]]] = []
    ordinary: list[bool] = []
    notes: list[int] = []

    def on_start(session: Any) -> None:
        if pins:
            session.pin(dict(PINS))

    def on_call(session: Any, plan: Any) -> None:
        out = session.sent_messages(plan.view, plan.usage)
        sent.append(out)
        ordinary.append(not plan.notices)
        notes.append(message_tokens({"role": "user", "content": session.budget_note(plan.usage)}) if note else 0)

    report = replay(messages, window=window, on_start=on_start, on_call=on_call, show_budget=note)
    whole, before_note = _ratios(sent, ordinary, notes)
    return {"calls": len(sent), "ordinary": sum(ordinary[1:]), "ratio": whole, "ratio_before_note": before_note,
            "compactions": sum(r["kind"] == "compaction" for r in report["ledger"]),
            "knowledge_rows": sum(r["kind"] == "knowledge" for r in report["ledger"])}


def shell_cells(data: Data) -> list[CellRecord]:
    """Every Bash call of the coding-agent sessions as a notebook cell record (see module doc)."""
    out: list[CellRecord] = []
    for conv in data.get("claude_code_sessions"):
        results = {m.get("tool_call_id"): m.get("content") or "" for m in to_openai(conv["messages"])
                   if m.get("role") == "tool"}
        for m in to_openai(conv["messages"]):
            for call in m.get("tool_calls") or ():
                fn = call.get("function") or {}
                if fn.get("name") != "Bash":
                    continue
                try:
                    command = str(json.loads(fn.get("arguments") or "{}").get("command") or "")
                except (json.JSONDecodeError, AttributeError):
                    continue
                result = results.get(call.get("id"), "")
                found = _ERROR.search(result)
                error = ""
                if found:
                    line = result[found.start():].strip().splitlines()[0]
                    error = line[:120]
                lines = [x for x in command.strip().splitlines() if x.strip()]
                first = (lines[0][:80] if lines else "").replace("`", "'")
                digest = " ".join(result.split())[:160]
                out.append(CellRecord(len(out) + 1, hashlib.sha256(command.encode()).hexdigest()[:8],
                                      first + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""),
                                      error, 0.5, digest))
    return out


def cell_cost(records: list[CellRecord], per_turn: int) -> dict[str, Any]:
    """Tokens the cell events take in a real session's payload, per 100 cells."""
    from ..session import Session

    tmp = tempfile.mkdtemp(prefix="mfs-bench-cells-")
    try:
        s = Session("cells", store=tmp, window_tokens=1_000_000, recall_index=False)
        uids = []
        for i in range(0, len(records), per_turn):
            s.record("user", f"question {i}", new_turn=True)
            event = s.record_cells(records[i:i + per_turn])
            if event is not None:
                uids.append(event.uid)
            s.record("assistant", "answer")
        view = s.send_view()
        counts = s.token_counts(view)
        mine = set(uids)
        tokens = sum(c for c, u in zip(counts, view.uids) if u in mine)
        s.close()
        return {"cells": len(records), "events": len(uids), "tokens": tokens,
                "per_100": 100 * tokens / max(len(records), 1),
                "failed": sum(1 for r in records if r.error)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(data: Data, quick: bool) -> dict[str, Any]:
    convs = data.get("locomo")[: 1 if quick else 2]
    windows = WINDOWS[:1] if quick else WINDOWS
    rows: list[list[Any]] = []
    metrics: dict[str, Any] = {"prefix": {}, "cells": {}}
    for conv in convs:
        messages = normalise(to_openai(conv["messages"]))
        if quick:
            messages = messages[:QUICK_MESSAGES]
        for window in windows:
            for label, note, pins in MODES:
                r = run_prefix(messages, window, note, pins)
                metrics["prefix"][f"{conv['id']}/{window}/{label}"] = r
                rows.append([f"LoCoMo {conv['id']}", f"{window // 1000}k", label, r["calls"], r["ordinary"],
                             r["compactions"], f"{r['ratio']:.2%}", f"{r['ratio_before_note']:.2%}"])
    records = shell_cells(data)
    if quick:
        records = records[:QUICK_CELLS]
    cost_rows = []
    for per_turn in (1, 5, 20):
        c = cell_cost(records, per_turn)
        metrics["cells"][per_turn] = c
        cost_rows.append([per_turn, f"{c['cells']:,}", f"{c['failed']:,}", f"{c['events']:,}", f"{c['tokens']:,}",
                          f"{c['per_100']:,.0f}"])
    return {
        "title": "Notebook memory: the budget note, the knowledge slot and the cell log",
        "tables": [
            {"caption": "Prefix-cache ratio of ordinary calls, on the messages really sent",
             "columns": ["conversation", "window", "mode", "calls", "ordinary calls", "compactions",
                         "prefix ratio", "prefix ratio, previous request less its note"],
             "rows": rows},
            {"caption": "Cell log: payload tokens per 100 cells (shell commands of the coding sessions as cells)",
             "columns": ["cells per chat turn", "cells", "failed", "events", "payload tokens", "tokens per 100 cells"],
             "rows": cost_rows},
        ],
        "notes": [
            "The budget note (about 20 tokens) is appended to the last message of each request only; the next "
            "request repeats everything before it, so the ratio on whole requests falls by the note's share of "
            "the request and the ratio on the previous request less its note is what the note leaves intact.",
            "The pinned values are written once, before the first message; a pin made later costs one cache miss "
            "of everything after the slot, recorded in its ledger row (`cache_miss_tokens`).",
            "Cells: an error is a line of the command's output that starts like an error (error, …Error, "
            "Exception, Traceback, fatal:, exit code 1-9); cell records are built here, not by the cell log's hooks.",
        ] + ([f"quick run: one conversation's first {QUICK_MESSAGES} messages at 8k, {QUICK_CELLS} cells"] if quick else []),
        "metrics": metrics,
    }
