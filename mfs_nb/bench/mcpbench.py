"""Suite `mcp`: the shared coding sessions brought in with `mfs-nb import` (wall time of the command, as a
person runs it), then `recall_search` through `mfs-nb mcp` over stdio, timed at the MCP client (the
protocol, the server process and the search together).

Queries are written the way a model writes them for this tool — a few keywords — from each session's own
messages: the four longest distinct words of a message picked at random (seeded). "found" counts the
queries whose source message is among the hits; it is a sanity check of the set-up, not a recall measure
(the `recall` suite is that). The searches run twice: right after the import, while the server builds the
vectors in its background thread (the state a person meets first), and, in a full run, once the vectors
have caught up.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .dataset import Data

NAME = "mcp"
NEEDS = ("claude_code_sessions",)
QUERIES = 40
CATCH_UP_S = 900  # a full run waits at most this long for the vectors


def _queries(store: Path, per_session: int, rng: random.Random) -> list[tuple[str, int, str]]:
    from ..store import Store

    st = Store(store)
    out = []
    for name in sorted(st.sessions()):
        events = [e for e in st.load_events(name) if e.role in ("user", "assistant") and len(e.content) > 80]
        for e in rng.sample(events, min(per_session, len(events))):
            words = sorted({w for w in re.findall(r"[A-Za-z][A-Za-z_.]{4,}", e.content)}, key=lambda w: (-len(w), w))
            out.append((name, e.uid, " ".join(words[:4])))
    return out


def _text(result: Any) -> str:
    """A tool result's text (the server answers in text parts only)."""
    return "\n".join(str(getattr(c, "text", "")) for c in result.content)


def _behind(text: str) -> bool:
    """The search's note says its vectors stop short of the log (`Searcher._behind`)."""
    return "search by meaning to uid" in text or "the search index has reached" in text


async def _search_all(store: Path, queries: list[tuple[str, int, str]], wait_vectors: bool) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "mfs_nb", "mcp", "--store", str(store)],
                                   env={**os.environ, "MFS_RECALL_INDEX": "true"})
    phases: dict[str, Any] = {}
    started = time.perf_counter()
    async with Client(params, read_timeout_seconds=120) as client:
        phases["connect_s"] = time.perf_counter() - started

        async def run(label: str) -> None:
            times, found, pending = [], 0, 0
            for i, (name, uid, query) in enumerate(queries):
                scoped = {"session": name} if i % 2 == 0 else {}  # half in the session, half over all of them
                t0 = time.perf_counter()
                result = await client.call_tool("recall_search", {"query": query, "k": 10, **scoped})
                times.append((time.perf_counter() - t0) * 1000)
                text = _text(result)
                found += f"{name} [#{uid} " in text
                pending += _behind(text)
            times.sort()
            phases[label] = {"p50": times[len(times) // 2], "p95": times[int(0.95 * (len(times) - 1))],
                             "max": times[-1], "found": found, "n": len(times), "vectors_pending": pending}

        await run("after import")
        if wait_vectors:
            waited = time.perf_counter()
            while time.perf_counter() - waited < CATCH_UP_S:
                probe = await client.call_tool("recall_search", {"query": "error", "k": 1})
                if not _behind(_text(probe)):
                    break
                await asyncio.sleep(5)
            phases["catch_up_s"] = time.perf_counter() - waited
            caught_up = not _behind(_text(probe))
            await run("vectors complete" if caught_up else f"after {CATCH_UP_S // 60} min, vectors still building")
    return phases


def run(data: Data, quick: bool) -> dict[str, Any]:
    sessions = sorted(str(p) for p in (data.root / "claude_code_sessions").glob("*-*.jsonl"))
    rng = random.Random(45)
    with tempfile.TemporaryDirectory(prefix="mfs-mcp-bench-", ignore_cleanup_errors=True) as tmp:
        store = Path(tmp) / "store"
        env = {**os.environ, "MFS_WARM": "0"}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "mfs_nb", "import", *sessions, "--store", str(store), "--json"],
                              env=env, capture_output=True, text=True, check=True)
        import_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = subprocess.run([sys.executable, "-m", "mfs_nb", "import", *sessions, "--store", str(store), "--json"],
                               env=env, capture_output=True, text=True, check=True)
        again_s = time.perf_counter() - t0
        import json

        reports = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        added_again = sum(json.loads(x)["added"] for x in again.stdout.splitlines() if x.startswith("{"))
        queries = _queries(store, (QUERIES if not quick else 20) // len(sessions) + 1, rng)
        phases = asyncio.run(_search_all(store, queries, wait_vectors=not quick))
    messages = sum(r["added"] for r in reports)
    rows = [[label, p["n"], f"{p['p50']:.0f}", f"{p['p95']:.0f}", f"{p['max']:.0f}", f"{p['found']}/{p['n']}",
             p["vectors_pending"]] for label, p in phases.items() if isinstance(p, dict)]
    return {
        "title": "Memory for any agent: import and MCP",
        "tables": [
            {"caption": "import of the shared coding sessions (`mfs-nb import`, wall time of the command)",
             "columns": ["sessions", "messages", "import s", "again s", "added again"],
             "rows": [[len(reports), messages, f"{import_s:.1f}", f"{again_s:.1f}", added_again]]},
            {"caption": "recall_search through `mfs-nb mcp` over stdio, timed at the SDK client (ms)",
             "columns": ["when", "queries", "p50", "p95", "max", "found", "answers with vectors pending"],
             "rows": rows},
        ],
        "notes": [
            f"server start and MCP handshake: {phases['connect_s']:.1f} s"
            + (f"; waited {phases['catch_up_s']:.0f} s for the vectors after the first searches"
               if "catch_up_s" in phases else ""),
            "queries: the four longest distinct words of a message of the session (seeded); half are scoped to "
            "their session, half search every session; k = 10",
            "found: the query's source message is among the hits (a check of the set-up, not a recall figure)",
        ] + (["quick run: searches right after the import only"] if quick else []),
        "metrics": {"import_s": import_s, "messages": messages, "added_again": added_again,
                    **{f"p95_{k.replace(' ', '_')}": v["p95"] for k, v in phases.items() if isinstance(v, dict)}},
    }
