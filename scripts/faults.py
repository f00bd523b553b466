"""The fault-injection suite, long form: writes the figures in docs/reliability.md.

    python scripts/faults.py [--kills 50] [--concurrent 6] [--out docs/reliability.md]

Kernels are real processes on a shared store (tests/faults/worker.py); providers are fake
OpenAI-compatible servers on 127.0.0.1 (tests/fake_provider.py). Nothing leaves the machine.
Every run is bounded in time; the whole suite takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "faults")]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import harness  # noqa: E402
from fake_provider import FakeProvider  # noqa: E402

SECRETS = {"OPENAI_API_KEY": "sk-faultsuite-openai-4f1c9a", "ANTHROPIC_API_KEY": "sk-ant-faultsuite-77b2e0",
           "MFS_FALLBACK_API_KEY": "sk-faultsuite-fallback-19d3"}
SUMMARIES = {
    "refusal": "I'm unable to summarize this conversation.",
    "preamble": "Sure! Here is the summary you asked for:",
    "lorem": "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.",
    "huge": "- pool deploy latency " + "x" * 500_000,
    "cjk_refusal": "抱歉，我无法总结这段对话。",
}


def leaked(paths: list[Path], texts: list[str]) -> int:
    """How many secrets appear in any file under `paths` or in any of `texts`."""
    blobs = [t.encode() for t in texts]
    for root in paths:
        for f in root.rglob("*") if root.exists() else ():
            if f.is_file():
                blobs.append(f.read_bytes())
    return sum(1 for s in SECRETS.values() for b in blobs if s.encode() in b)


def provider_run(work: Path, mode: str, summary: str | None) -> dict[str, Any]:
    """A session on a faulty primary (and a healthy fallback): chats and compactions go on; nothing
    lost, no empty reply in the log, every failure one clear line, no key in the store or outputs."""
    from mfs_nb import MfsError, Session

    store = work / f"prov-{mode}-{'s' if summary else 'c'}"
    a = FakeProvider(mode, reply="primary answer about pool deploy latency", summary=summary)
    b = FakeProvider("ok", reply="fallback answer about pool deploy latency",
                     summary="- the user discussed pool, deploy and latency limits")
    outputs: list[str] = []
    errors = bad_errors = 0
    acks: dict[int, str] = {}
    try:
        s = Session("p", store=str(store), model="openai/primary", api_base=a.url, window_tokens=4096,
                    fallback_model="openai/fallback", fallback_base_url=b.url, timeout_s=1,
                    background_compaction=False)
        for i in range(10):
            try:
                reply = s.chat(f"turn {i}: keep the pool for deploy {i} under {20 + i} and latency under {i} ms " * 6)
                outputs += [reply.text, *reply.notices]
                for uid in reply.uids:
                    acks[uid] = next(e.sha256 for e in s.events if e.uid == uid)
            except MfsError as exc:
                errors += 1
                outputs.append(str(exc))
                bad_errors += "\n" in str(exc)
        outputs.append(json.dumps(s.status(), default=str))
        outputs += [json.dumps(r, default=str) for r in s.ledger()]
        empty = sum(1 for e in s.events if e.role == "assistant" and not e.content.strip() and not e.tool_calls)
        segs = [x for x in s.compactor.segments if not x.degraded]
        garbage = sum(1 for x in segs if summary and summary[:30] in x.prose)
    finally:
        a.close()
        b.close()
    check = harness.check(str(store), "p", acks)
    return {**check, "errors": errors, "multi_line_errors": bad_errors, "empty_replies": empty,
            "garbage_segments": garbage, "leaked": leaked([store], outputs), "primary_hits": len(a.hits)}


def damaged_run(work: Path, how: str) -> dict[str, Any]:
    """Damage a table file of a store with events, then open it: a clear error naming the table, or
    the session; never an empty session that reuses uids."""
    code = f"""
import sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests' / 'faults')!r}]
from worker import Model
from mfs_nb import Session, MfsError
try:
    s = Session("d", store={str(work / ('dmg-' + how))!r}, window_tokens=4096, llm=Model())
    print("OPENED", s.last_uid)
except MfsError as exc:
    print("ERROR", str(exc).replace(chr(10), " "))
"""
    store = work / f"dmg-{how}"
    seed = subprocess.run([sys.executable, str(harness.WORKER), str(store), "d", "--ops", "8", "--seed", "3"],
                          capture_output=True, text=True, env=harness.env())
    acks, _ = harness.parse(seed.stdout)
    events_dir = store / "events.lance"
    if how == "deleted_table":
        shutil.rmtree(events_dir)
    elif how == "truncated_data":
        files = sorted((events_dir / "data").glob("*.lance"))
        f = files[len(files) // 2]
        f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 3)])
    elif how == "deleted_manifest":
        manifests = sorted((events_dir / "_versions").glob("*.manifest"))
        manifests[-1].unlink()
    def attempt() -> tuple[str, int]:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=harness.env())
        line = (r.stdout.strip().splitlines() or [r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""])[-1]
        return line, int("Traceback" in r.stderr)

    first, tb = attempt()
    top = max(acks, default=0)
    # opened although acknowledged uids are gone: the next message would take a used uid
    silent = first.startswith("OPENED") and int(first.split()[1]) < top
    rep = subprocess.run([sys.executable, "-m", "mfs_nb", "doctor", "--store", str(store), "--repair"],
                         capture_output=True, text=True, env=harness.env(), cwd=str(ROOT))
    after, tb2 = attempt()
    return {"acks": len(acks), "first_open": first[:220], "traceback": tb + tb2, "silent_uid_reuse": int(silent),
            "doctor": rep.stdout.strip().splitlines()[-1][:220] if rep.stdout.strip() else rep.stderr[-200:],
            "after_repair": after[:120]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--concurrent", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "docs" / "reliability.json"))
    args = ap.parse_args()
    for k, v in SECRETS.items():
        os.environ[k] = v
    work = Path(tempfile.mkdtemp(prefix="mfs-faults-"))
    report: dict[str, Any] = {"machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
                              "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "faults": {}}
    t0 = time.monotonic()

    def add(name: str, result: dict[str, Any]) -> None:
        report["faults"].setdefault(name, []).append(result)
        print(name, json.dumps(result), flush=True)

    for i in range(args.kills):  # one session, killed and restarted again and again
        add("sigkill_chat_compact", harness.kill_run(str(work / "kill"), "killed", 1000 + i, ops=24))
    for i in range(args.concurrent):
        procs = 2 + i % 3
        add(f"concurrent_{procs}_kernels", harness.concurrent_run(str(work / f"conc{i}"), "many", procs, 2000 + i,
                                                                   ops=10))
    for mode in ("500", "429", "slow", "drop", "empty", "null", "garbage", "ptl"):
        add(f"provider_{mode}", provider_run(work, mode, None))
    for name, text in SUMMARIES.items():
        add(f"summary_{name}", provider_run(work, "ok", text))
    for how in ("deleted_table", "truncated_data", "deleted_manifest"):
        add(f"damaged_{how}", damaged_run(work, how))
    report["seconds"] = round(time.monotonic() - t0)
    Path(args.out).write_text(json.dumps(report, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    print("wrote", args.out, "in", report["seconds"], "s")


if __name__ == "__main__":
    main()
