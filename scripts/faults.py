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

    store = work / f"prov-{mode}-{abs(hash(summary)) if summary else 'c'}"
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
        try:  # a compaction on demand as well: the summarizer's faults must meet a real range
            outputs += s.compact("pool limits")
        except MfsError as exc:
            errors += 1
            outputs.append(str(exc))
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


MOUNT_CODE = """
import json, random, sys
sys.path[:0] = [{root!r}, {faults!r}]
from worker import Model, message
from mfs_nb import MfsError, Session
acks, err = {{}}, ""
rng = random.Random(1)
try:
    s = Session("m", store={store!r}, window_tokens=4096, llm=Model())
    for i in range({turns}):
        r = s.chat(message("m", i, rng))
        for uid in r.uids:
            acks[uid] = next(e.sha256 for e in s.events if e.uid == uid)
except MfsError as exc:
    err = str(exc)
print("RESULT " + json.dumps({{"acks": acks, "error": err}}))
"""


def mount_run(work: Path, kind: str) -> dict[str, Any]:
    """A full disk (a 4 MB tmpfs) or a read-only store (a tmpfs remounted read-only), in a private
    mount namespace. Each failure must be one clear line; nothing acknowledged may be lost."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        return {"skipped": "no private mount namespace here (needs root and unshare -m)"}
    mnt, out = work / f"mnt-{kind}", work / f"out-{kind}"
    mnt.mkdir()
    out.mkdir()
    store = str(mnt / "store")

    def code(turns: int) -> str:
        return MOUNT_CODE.format(root=str(ROOT), faults=str(ROOT / "tests" / "faults"), store=store, turns=turns)

    py = sys.executable
    if kind == "full_disk":
        script = (f"mount -t tmpfs -o size=4m tmpfs {mnt} && {py} -c \"$A\" > {out}/a.txt 2> {out}/a.err; "
                  f"cp -r {store} {out}/store")
    else:
        script = (f"mount -t tmpfs -o size=64m tmpfs {mnt} && {py} -c \"$A\" > {out}/a.txt 2> {out}/a.err && "
                  f"mount -o remount,ro {mnt} && {py} -c \"$B\" > {out}/b.txt 2> {out}/b.err; cp -r {store} {out}/store")
    envs = {**harness.env(), "A": code(400 if kind == "full_disk" else 6), "B": code(2)}
    subprocess.run(["unshare", "-m", "sh", "-c", script], env=envs, timeout=900, capture_output=True)

    def result(name: str) -> dict[str, Any]:
        text = (out / f"{name}.txt").read_text() if (out / f"{name}.txt").exists() else ""
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), "")
        return json.loads(line[7:]) if line else {"acks": {}, "error": "", "crash": (out / f"{name}.err").read_text()[-300:]}

    first = result("a")
    acks = {int(k): v for k, v in first["acks"].items()}
    failure = first if kind == "full_disk" else result("b")
    tracebacks = sum("Traceback" in (out / f"{n}.err").read_text() for n in ("a", "b") if (out / f"{n}.err").exists())
    check = harness.check(str(out / "store"), "m", acks)
    return {**check, "acks": len(acks), "error": failure.get("error", "")[:220], "tracebacks": tracebacks,
            "one_line": int(bool(failure.get("error")) and "\n" not in failure["error"])}


def _sum(runs: list[dict[str, Any]], *keys: str) -> int:
    return sum(int(r.get(k, 0) or 0) for r in runs for k in keys)


def render(report: dict[str, Any], commit: str = "") -> str:
    """docs/reliability.md from a run's JSON."""
    faults = report["faults"]
    rows = []
    totals = {"runs": 0, "lost": 0, "dup": 0, "unc": 0, "leak": 0}
    for name, runs in faults.items():
        lost, dup = _sum(runs, "lost", "gaps"), _sum(runs, "duplicated", "uid_twice")
        unc, leak = _sum(runs, "uncovered"), _sum(runs, "leaked")
        injected = _sum(runs, "killed") if name.startswith("sigkill") else len(runs)
        if name.startswith("concurrent"):
            note = (f"{_sum(runs, 'finals')} kernels reloaded; runs where all agreed on one projection: "
                    f"{sum(1 for r in runs if r.get('projections') == 1)}/{len(runs)}; worker errors: "
                    f"{sum(len(r.get('errors', [])) for r in runs)}")
        elif name.startswith(("provider", "summary")):
            note = (f"failed turns (one clear line each): {_sum(runs, 'errors')}, multi-line errors: "
                    f"{_sum(runs, 'multi_line_errors')}, empty replies logged: {_sum(runs, 'empty_replies')}, "
                    f"garbage committed as segments: {_sum(runs, 'garbage_segments')}")
        elif name.startswith("mount"):
            r = runs[0]
            note = (f"skipped: {r['skipped']}" if "skipped" in r else
                    f"error shown: `{r['error'][:140]}`; one line: {r['one_line']}; tracebacks: {r['tracebacks']}; "
                    f"acknowledged before the fault: {r['acks']}")
        elif name.startswith("damaged"):
            r = runs[0]
            note = (f"acknowledged before the damage: {r['acks']}; first open: `{r['first_open'][:110]}`; "
                    f"silent uid reuse: {r['silent_uid_reuse']}; tracebacks: {r['traceback']}; "
                    f"after `doctor --repair`: `{r['after_repair'][:40]}` (OPENED n: the session opens with last uid n)")
            rows.append(f"| {name} | {len(runs)} | {len(runs)} | n/a | n/a | n/a | n/a | {note} |")
            continue
        else:
            note = f"events checked after restart: {_sum(runs, 'events')}; acknowledged before the kill: {_sum(runs, 'acks')}"
        rows.append(f"| {name} | {len(runs)} | {injected} | {lost} | {dup} | {unc} | {leak} | {note} |")
        totals["runs"] += len(runs)
        totals["lost"] += lost
        totals["dup"] += dup
        totals["unc"] += unc
        totals["leak"] += leak
    return "\n".join([
        "# Reliability: the fault-injection suite",
        "",
        "Generated by `python scripts/faults.py` (kernels are real processes on a shared store, providers are",
        "fake OpenAI-compatible servers on 127.0.0.1; nothing leaves the machine). A handful of the same runs",
        "are in the regular test run (`tests/faults/`).",
        "",
        f"Run: {report['started']}, {report['machine']}, {report['seconds']} s" + (f", commit {commit}" if commit else "")
        + ".",
        "",
        f"**Totals over {totals['runs']} runs: {totals['lost']} lost, {totals['dup']} duplicated, "
        f"{totals['unc']} uncovered, {totals['leak']} leaked.**",
        "",
        "| fault | runs | faults injected | events lost | duplicated | uncovered uids | leaked secrets | notes |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "What each column counts:",
        "",
        "- *events lost*: an event the kernel was told is saved (`ack uid sha256`) that a fresh kernel cannot read",
        "  back with the same hash, plus any hole in the uid sequence.",
        "- *duplicated*: a user message present twice, or a (session, uid) with two rows.",
        "- *uncovered uids*: an event that is neither raw in the send view nor inside exactly one segment or",
        "  evicted range (the coverage invariant), checked by a fresh kernel after the fault.",
        "- *leaked secrets*: provider and fallback keys set in the environment found in any file of the store,",
        "  any reply, notice, error, status or ledger row.",
        "",
        "The faults:",
        "",
        "- `sigkill_chat_compact`: one session, a kernel chatting and compacting (background pre-compaction",
        "  on in about half the runs) is killed with SIGKILL at a random moment, then the next run restarts",
        "  on the same store (recovery of the interrupted compaction once its lease expires).",
        "- `concurrent_N_kernels`: N processes on one session at once with random schedules of chats and",
        "  `%compact`; afterwards each reloads and reports its segments and a hash of its send view.",
        "- `provider_*`: the primary endpoint returns 500, 429, times out (`slow`, 3 s against a 1 s",
        "  timeout), drops the stream, answers 200 with no choices (`empty`), null content (`null`), a",
        "  non-JSON body (`garbage`), or prompt-too-long (`ptl`, no fallback applies: a clear error after",
        "  3 retries); a healthy fallback is configured.",
        "- `summary_*`: the summarizer answers a refusal, a bare preamble, lorem ipsum, a 500,000-char",
        "  text or a Chinese refusal; none may become a segment.",
        "- `damaged_*`: the events table removed, a data file truncated, or the latest manifest deleted",
        "  (rolls back the last write); the store is then opened, and repaired with `mfs-nb doctor --repair`.",
        "",
        "- `mount_full_disk`: the store on a 4 MB tmpfs, chatting until the disk is full; `mount_read_only`:",
        "  a store with events on a tmpfs remounted read-only, then opened and written to. Both run in a",
        "  private mount namespace (`unshare -m`, root only) and are skipped with a message elsewhere.",
        "For `damaged_*` the fault itself destroys data, so the loss columns do not apply; what counts is",
        "that the damage is reported in one line naming the table and that the doctor recovers what is readable.",
        "",
        "Known limits, seen in these runs: the doctor can name lost uids only up to the highest uid that a",
        "segment or a verdict refers to. In `damaged_deleted_table` the session had not compacted yet, so",
        "nothing referred to its 14 events: opening stops with the one-line error, but after",
        "`doctor --repair` the session opens empty and uids start at 1 again. Likewise, deleting the newest",
        "manifest rolls back the last event write (here the newest manifest held no acknowledged event,",
        "so nothing was lost); if nothing refers to a rolled-back uid, no reader can tell, and it is",
        "taken again. A per-session uid high-water mark written with each event would close both; it is",
        "not done.",
        "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--concurrent", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "docs" / "reliability.json"))
    ap.add_argument("--parts", default="kill,concurrent,provider,summary,mount,damaged",
                    help="comma-separated parts to run (runs can be split across processes)")
    ap.add_argument("--seed", type=int, default=0, help="offset for the kill and concurrent seeds")
    ap.add_argument("--render", help="only write docs/reliability.md from this JSON")
    ap.add_argument("--from-logs", nargs="*", help="only write docs/reliability.md from the printed result lines of runs")
    ap.add_argument("--note", default="", help="a line about the run, for the doc (machine load, split runs)")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    if args.from_logs:
        merged: dict[str, Any] = {"faults": {}, "machine": f"{platform.system()} {platform.machine()}, "
                                  f"{os.cpu_count()} cores", "started": args.note or "from logs", "seconds": 0}
        for log in args.from_logs:
            for line in Path(log).read_text().splitlines():
                name, _, rest = line.partition(" ")
                if rest.startswith("{") and name.replace("_", "").isalnum():
                    merged["faults"].setdefault(name, []).append(json.loads(rest))
                elif line.startswith("wrote ") and " in " in line:
                    merged["seconds"] += int(line.rsplit(" in ", 1)[1].split()[0])
        (ROOT / "docs" / "reliability.md").write_text(render(merged, args.commit))
        return
    if args.render:
        text = render(json.loads(Path(args.render).read_text()), args.commit)
        (ROOT / "docs" / "reliability.md").write_text(text)
        print(text)
        return
    for k, v in SECRETS.items():
        os.environ[k] = v
    work = Path(tempfile.mkdtemp(prefix="mfs-faults-"))
    report: dict[str, Any] = {"machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
                              "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "faults": {}}
    t0 = time.monotonic()

    def add(name: str, result: dict[str, Any]) -> None:
        report["faults"].setdefault(name, []).append(result)
        print(name, json.dumps(result), flush=True)

    parts = set(args.parts.split(","))
    for i in range(args.kills if "kill" in parts else 0):  # one session, killed and restarted again and again
        add("sigkill_chat_compact", harness.kill_run(str(work / "kill"), "killed", 1000 + args.seed + i, ops=24))
    for i in range(args.concurrent if "concurrent" in parts else 0):
        procs = 2 + i % 3
        add(f"concurrent_{procs}_kernels", harness.concurrent_run(str(work / f"conc{i}"), "many", procs,
                                                                   2000 + args.seed + i, ops=10))
    for mode in ("500", "429", "slow", "drop", "empty", "null", "garbage", "ptl") if "provider" in parts else ():
        add(f"provider_{mode}", provider_run(work, mode, None))
    for name, text in SUMMARIES.items() if "summary" in parts else ():
        add(f"summary_{name}", provider_run(work, "ok", text))
    for kind in ("full_disk", "read_only") if "mount" in parts else ():
        add(f"mount_{kind}", mount_run(work, kind))
    for how in ("deleted_table", "truncated_data", "deleted_manifest") if "damaged" in parts else ():
        add(f"damaged_{how}", damaged_run(work, how))
    report["seconds"] = round(time.monotonic() - t0)
    Path(args.out).write_text(json.dumps(report, indent=1))
    (ROOT / "docs" / "reliability.md").write_text(render(report, args.commit))
    shutil.rmtree(work, ignore_errors=True)
    print("wrote", args.out, "in", report["seconds"], "s")


if __name__ == "__main__":
    main()
