"""`mfs-nb bench ux`: what a newcomer waits for in the first hour (issue 17), each step timed in
fresh processes the way a person meets it: `%load_ext`, the first offline `%%chat`, `Session()`,
`%compact` of a short session, `mfs-nb demo`. Needs no data; the machine's cache (the embedding
gate's verdict) is settled first, once, as it is after the first use on a machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

NAME = "ux"
NEEDS: tuple[str, ...] = ()
TARGETS = {"load_ext": 0.2, "first_chat_warm": 2.0, "first_chat": 2.0, "session": 0.5, "compact": 2.0, "demo": 10.0}

_LOAD_AND_CHAT = r"""
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
cfg = Config(); cfg.HistoryManager.enabled = False
ip = InteractiveShell.instance(config=cfg)
t0 = time.perf_counter()
ip.run_line_magic("load_ext", "mfs_nb")
t1 = time.perf_counter()
magics = ip.magics_manager.registry["MfsMagics"]
if sys.argv[1] == "after-warmup":  # a person types the next cell meanwhile
    magics.warmup.wait("store"); magics.warmup.wait("model client")
    t1 = time.perf_counter()
ip.run_cell_magic("chat", "", "Keep the pool under 30 connections.")
t2 = time.perf_counter()
ip.run_cell_magic("chat", "", "And never raise max_overflow above 5.")
t3 = time.perf_counter()
w = magics.warmup
w.thread.join(600)
print(json.dumps({"load_ext": t1 - t0, "first_chat": t2 - t1, "second_chat": t3 - t2,
                  "warm": w.seconds, "warm_errors": w.errors}))
"""

_SESSION = r"""
import json, sys, time
t0 = time.perf_counter()
from mfs_nb import store
store.lancedb_module()  # what the warm-up at %load_ext imports
from mfs_nb.session import Session
t1 = time.perf_counter()
s = Session("ux", store=sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "session": t2 - t1, "events": len(s.events)}))
"""

_COMPACT = r"""
import json, pathlib, sys, time
from mfs_nb.commands.demo import SCRIPT, LOG_NAME, incident_review
from mfs_nb.session import Session
folder = pathlib.Path(sys.argv[1]); folder.mkdir(parents=True, exist_ok=True)
doc = folder / LOG_NAME
doc.write_text(incident_review(), encoding="utf-8")
s = Session("short", store=str(folder))
for text in SCRIPT:
    s.chat(text, docs=[str(doc)] if text is SCRIPT[1] else [])
t0 = time.perf_counter()
notices = s.compact()
t1 = time.perf_counter()
print(json.dumps({"compact": t1 - t0, "notices": notices, "events": len(s.events)}))
"""


def _python(code: str, *args: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"ux step failed: {out.stderr.strip()[-400:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _progress(text: str) -> None:
    sys.stderr.write(f"\r[ux] {text:<60}")
    sys.stderr.flush()


def run(data: Any, quick: bool) -> dict[str, Any]:
    from ..layers.track import cache_dir, warm_gate

    repeats = 1 if quick else 3
    started = time.perf_counter()
    gate_s = 0.0
    if not quick:  # what the first use on a machine costs, once per embedder (not cached here)
        from ..layers.track import CachedEmbedder, gate
        from ..models.embed import load

        _progress("the embedding gate, run uncached once…")
        inner = load("auto")
        gate_started = time.perf_counter()
        if inner is not None:
            gate(CachedEmbedder(inner))
        gate_s = time.perf_counter() - gate_started
    _progress("settling the embedding gate's verdict for this machine…")
    warm_gate()
    samples: dict[str, list[float]] = {k: [] for k in (*TARGETS, "second_chat", "session_imports",
                                                         "warm_store", "warm_client", "warm_embedder")}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mfs-ux-") as tmp:
        for i in range(repeats):
            env = {**os.environ, "MFS_STORE": os.path.join(tmp, f"nb{i}"), "MFS_CACHE_DIR": str(cache_dir())}
            env.pop("MFS_MODEL", None)
            env.pop("MFS_WARM", None)
            _progress(f"run {i + 1}/{repeats}: %load_ext and the first %%chat")
            r = _python(_LOAD_AND_CHAT, "after-warmup", env={**env, "MFS_STORE": os.path.join(tmp, f"warm{i}")})
            samples["first_chat_warm"].append(r["first_chat"])
            r = _python(_LOAD_AND_CHAT, "at-once", env=env)
            for key in ("load_ext", "first_chat", "second_chat"):
                samples[key].append(r[key])
            samples["warm_store"].append(r["warm"].get("store", 0.0))
            samples["warm_client"].append(r["warm"].get("model client", 0.0))
            samples["warm_embedder"].append(r["warm"].get("embedder", 0.0))
            if r["warm_errors"]:
                notes.append(f"warm-up errors: {r['warm_errors']}")
            _progress(f"run {i + 1}/{repeats}: Session() on that store")
            r = _python(_SESSION, env["MFS_STORE"], env=env)
            samples["session"].append(r["session"])
            samples["session_imports"].append(r["imports"])
            _progress(f"run {i + 1}/{repeats}: %compact of a short session")
            r = _python(_COMPACT, os.path.join(tmp, f"short{i}"), env=env)
            samples["compact"].append(r["compact"])
            if i == 0:
                notes.append(f"the short session: {r['events']} events (the demo's five messages, one with an "
                             f"attached document); %compact said: {' / '.join(r['notices'])}")
            _progress(f"run {i + 1}/{repeats}: mfs-nb demo")
            t0 = time.perf_counter()
            demo = subprocess.run([sys.executable, "-m", "mfs_nb", "demo"], capture_output=True, text=True, env=env,
                                  timeout=900)
            samples["demo"].append(time.perf_counter() - t0)
            if demo.returncode != 0:
                notes.append(f"demo exited {demo.returncode}: {demo.stderr.strip()[-200:]}")
    sys.stderr.write("\n")
    med = {k: round(statistics.median(v), 3) for k, v in samples.items() if v}
    labels = {"load_ext": "`%load_ext mfs_nb`",
              "first_chat_warm": "first offline `%%chat` once the warm-up started by `%load_ext` is done",
              "first_chat": "first offline `%%chat` sent the instant `%load_ext` returns (waits for the warm-up's "
                            "import of the store libraries)",
              "session": "`Session()` (store libraries imported)",
              "compact": "`%compact` of a short session, offline",
              "demo": "`mfs-nb demo` (whole process)"}
    rows = [[labels[k], f"{med[k]:.2f} s", f"≤ {TARGETS[k]:g} s", "yes" if med[k] <= TARGETS[k] else "NO"]
            for k in TARGETS]
    detail = [["second `%%chat`", f"{med['second_chat']:.2f} s"],
              ["import of lancedb + mfs_nb.session in a fresh process (done by the warm-up at `%load_ext`)",
               f"{med['session_imports']:.2f} s"],
              ["warm-up thread: store libraries", f"{med['warm_store']:.2f} s"],
              ["warm-up thread: litellm (the model client; the offline default does not need it)",
               f"{med['warm_client']:.2f} s"],
              ["warm-up thread: embedder and its gate verdict (read from the machine's cache)",
               f"{med['warm_embedder']:.2f} s"],
              ["embedding gate, run uncached (what the first use on a machine costs; then cached with the "
               "embedder's id and version)", f"{gate_s:.2f} s" if gate_s else "not run with --quick"]]
    loadavg = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    notes += [f"median of {repeats} fresh process(es) per step; load average when the suite ended (1 / 5 / 15 min): "
              f"{loadavg[0]:.1f} / {loadavg[1]:.1f} / {loadavg[2]:.1f} on {os.cpu_count()} cores (a shared machine: other "
              "work running at the same time slows every step)",
              "timing is measured here, never asserted in tests"]
    return {"title": "A newcomer's first hour (speed)",
            "tables": [{"caption": "targets", "columns": ["step", "median", "target", "within"], "rows": rows},
                       {"caption": "where the time goes", "columns": ["part", "median"], "rows": detail}],
            "notes": notes, "metrics": {**med, "gate_first_run": round(gate_s, 3)},
            "seconds": round(time.perf_counter() - started, 1)}
