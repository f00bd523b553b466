"""The fault-injection harness: start worker kernels, kill them, and count what was lost.

Shared by the in-suite fault tests (a handful of runs) and `scripts/faults.py` (the long run that
writes docs/reliability.md). Loopback only; every run is bounded in time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]


def env(ttl: float = 2.0) -> dict[str, str]:
    out = {**os.environ, "MFS_LEASE_TTL_S": str(ttl), "PYTHONPATH": str(ROOT)}
    for var in ("MFS_MODEL", "MFS_API_BASE", "MFS_WINDOW", "MFS_FALLBACK_MODEL", "MFS_FALLBACK_BASE_URL"):
        out.pop(var, None)
    return out


def start(store: str, session: str, tag: str, seed: int, ops: int, **opts: Any) -> subprocess.Popen[str]:
    args = [sys.executable, str(WORKER), store, session, "--tag", tag, "--seed", str(seed), "--ops", str(ops)]
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (None, False):
            args += [flag, str(value)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            cwd=str(ROOT))


def parse(stdout: str) -> tuple[dict[int, str], list[dict[str, Any]]]:
    acks: dict[int, str] = {}
    finals = []
    for line in stdout.splitlines():
        if line.startswith("ack "):
            _, uid, sha = line.split()
            acks[int(uid)] = sha
        elif line.startswith("final "):
            finals.append(json.loads(line[6:]))
    return acks, finals


def check(store: str, session: str, acks: dict[int, str], window: int = 4096) -> dict[str, int]:
    """Reopen the session as a fresh kernel: acknowledged events present (lost), no uid or message
    twice (duplicated), every uid raw or covered exactly once (uncovered)."""
    from mfs_nb import Session
    from mfs_nb.store import Store

    sys.path.insert(0, str(WORKER.parent))
    from worker import Model

    s = Session(session, store=Store(store), window_tokens=window, llm=Model())
    by_uid = {e.uid: e for e in s.events}
    lost = sum(1 for uid, sha in acks.items() if uid not in by_uid or by_uid[uid].sha256 != sha)
    table = s.store._events.search().where(f"session = '{session}'").select(["uid", "content"]).limit(None).to_list()
    uid_twice = sum(n - 1 for n in Counter(r["uid"] for r in table).values() if n > 1)
    users = Counter(e.content for e in s.events if e.role == "user")
    msg_twice = sum(n - 1 for n in users.values() if n > 1)
    gaps = len(set(range(1, s.last_uid + 1)) - set(by_uid))
    raw = s.send_view().raw_uids()
    spans = [(x.uid_from, x.uid_to) for x in s.compactor.segments] + list(s.compactor.evicted)
    uncovered = sum(1 for e in s.events if (e.uid in raw) + sum(a <= e.uid <= b for a, b in spans) != 1)
    return {"events": len(s.events), "lost": lost, "duplicated": msg_twice, "uid_twice": uid_twice,
            "gaps": gaps, "uncovered": uncovered, "segments": len(s.compactor.segments)}


def concurrent_run(store: str, session: str, procs: int, seed: int, ops: int = 12,
                   timeout: float = 600, done_dir: str = "") -> dict[str, Any]:
    """2–4 kernels on one session at once, random schedules; each then reloads and reports its projection.
    `done_dir`: where the kernels say they are done (beside a local store by default)."""
    done = Path(done_dir or store + ".done")
    done.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    workers = [start(store, session, f"k{i}", rng.randrange(10**6), ops, wait_for=procs, done_dir=str(done),
                     compact_share=rng.choice([0.2, 0.4]), background=rng.random() < 0.5)
               for i in range(procs)]
    acks: dict[int, str] = {}
    finals: list[dict[str, Any]] = []
    errors = []
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            out, err = w.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            w.kill()
            out, err = w.communicate()
            err += f"\ntimed out after {timeout:.0f} s"
        a, f = parse(out)
        acks.update(a)
        finals += f
        if w.returncode:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {w.returncode}")
    result = check(store, session, acks)
    views = {(json.dumps(f["spans"]), f["view"]) for f in finals}
    return {**result, "kernels": procs, "finals": len(finals), "projections": len(views), "errors": errors}


def kill_run(store: str, session: str, seed: int, ops: int = 30, timeout: float = 120) -> dict[str, Any]:
    """Start a chatting and compacting kernel, SIGKILL it at a random moment, then restart on the
    same store (recovery) and check. Returns the check plus when the kill came."""
    rng = random.Random(seed)
    w = start(store, session, f"s{seed}", seed, ops, compact_share=0.3, background=rng.random() < 0.5)
    lines: list[str] = []
    assert w.stdout is not None
    # wait until it is working, then kill after a random number of acknowledged lines
    target = rng.randint(1, 12)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = w.stdout.readline()
        if not line:
            break
        lines.append(line)
        if sum(1 for x in lines if x.startswith(("ack", "compact"))) >= target:
            time.sleep(rng.uniform(0, 0.3))
            break
    killed = w.poll() is None
    if killed:
        w.send_signal(signal.SIGKILL)
    out, _ = w.communicate(timeout=30)
    acks, _ = parse("".join(lines) + out)
    return {**check(store, session, acks), "killed": int(killed), "acks": len(acks)}
