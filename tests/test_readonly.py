"""A store that cannot be written (issue 39): every mfs cell prints one `mfs:` line, loses nothing and
leaves the session usable; what only reads (recall by uid, search of what is indexed, status, context)
keeps working. And `mfs-nb doctor --store PATH` on what is not a readable store says so in one line.

The tests run as root, for whom a chmod does not forbid anything, so the store is made unwritable in
a child process, two ways: a read-only bind mount in a mount namespace of its own (`unshare -m`: the
file system answers EROFS, as on a read-only volume), and a folder without write permission read by a
process that dropped the capabilities that let root ignore permissions (EACCES, as for a store of
another user). Each is skipped, saying why, where the machine does not allow it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mfs_nb.commands.cli import main

# Runs a command (its argv follows the code) without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from the bounding set,
# so the exec'd process never has them): root then obeys file permissions like any user.
_DROP_DAC = ("import ctypes, os, sys\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "for cap in (1, 2):\n"  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
             "    if libc.prctl(24, cap, 0, 0, 0):\n"  # PR_CAPBSET_DROP
             "        sys.exit(f'prctl: {os.strerror(ctypes.get_errno())}')\n"
             "os.execv(sys.argv[1], sys.argv[1:])\n")


def _mount_cmd(folder: Path, argv: list[str]) -> list[str]:
    return ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(folder), *argv]


def _nowrite_cmd(argv: list[str]) -> list[str]:
    return [sys.executable, "-c", _DROP_DAC, *argv]


def _why_not(mode: str, tmp: Path) -> str | None:
    """None when `mode` makes a folder unwritable on this machine, else why not (the skip reason)."""
    if os.geteuid() != 0:
        return "needs root (a bind mount, or dropping root's capabilities); run the suite as root"
    probe = tmp / f"probe-{mode}"
    probe.mkdir()
    code = [sys.executable, "-c", "import sys; open(sys.argv[1] + '/x', 'w')", str(probe)]
    if mode == "mount":
        if not shutil.which("unshare") or not shutil.which("mount"):
            return "unshare or mount is not installed"
        cmd = _mount_cmd(probe, code)
    else:
        probe.chmod(0o555)
        cmd = _nowrite_cmd(code)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return f"{mode}: the folder stayed writable"
    if "Read-only file system" not in done.stderr and "Permission denied" not in done.stderr:
        return f"{mode} is not allowed here: {done.stderr.strip()[-200:]}"
    return None


@pytest.fixture(params=["mount", "nowrite"])
def unwritable(request, tmp_path):
    """A function `run(folder, argv)` that runs `argv` where `folder` (and all under it) cannot be written."""
    mode = request.param
    why = _why_not(mode, tmp_path)
    if why:
        pytest.skip(why)
    locked: list[Path] = []

    def run(folder: Path, argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
        if mode == "mount":
            cmd = _mount_cmd(folder, argv)
        else:
            for p in [folder, *folder.rglob("*")]:
                if p.is_dir():
                    p.chmod(0o555)
                    locked.append(p)
                else:
                    p.chmod(0o444)
            cmd = _nowrite_cmd(argv)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        finally:
            for p in locked:
                p.chmod(0o755)

    run.mode = mode  # type: ignore[attr-defined]
    return run


def _chatted(path: Path, indexed: bool) -> list[tuple[int, str]]:
    """A store with one session of two turns; `indexed`: its recall index built. Returns its events."""
    from mfs_nb.session import Session
    from mfs_nb.store import Store

    s = Session("default", store=Store(path))
    s.chat("Our budget is 40k euros; keep the connection pool small.")
    s.chat("Deploy on Friday, after the review.")
    if indexed:
        s.search("budget")
        assert s.indexer.wait(60)
        assert s.indexer.progress(load=False)["text_upto"] == s.last_uid
    s.indexer.close(wait_s=30)
    return [(e.uid, e.content) for e in s.store.load_events("default")]


_SCRIPT = textwrap.dedent('''
    import contextlib, io, json, sys, time
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=cfg)
    shell.run_cell("%load_ext mfs_nb")
    cells = ["%%chat\\nwhat was the budget?", '%recall "budget"', "%recall 1", "%mfs status", "%context",
             "%%chat\\nstill there?", f"%%chat --doc {sys.argv[2]}\\nread this", "%mfs sessions"]
    out = []
    for cell in cells:
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            result = shell.run_cell(cell)
        out.append({"cell": cell, "ok": result.success, "out": o.getvalue(), "err": e.getvalue()})
    session = shell.magics_manager.registry["MfsMagics"]._sessions["default"]
    deadline = time.monotonic() + 30  # the background threads (recall index, quiet maintenance) have their go
    while time.monotonic() < deadline and not session._quiet.settled():
        time.sleep(0.1)
    session.indexer.wait(30)
    threads = {"quiet_runs": session._quiet.runs, "index_notices": session.indexer.notices}
    from mfs_nb.session import Session
    from mfs_nb.store import Store
    found = Session("default", store=Store(sys.argv[1])).search("budget")
    out.append({"hits": [h.uid for h in found], "notices": found.notices})
    out.append(threads)
    print("RESULT " + json.dumps(out), flush=True)
    sys.stderr.flush()
    # lancedb's own threads can abort the interpreter's finalization now and then (PyGILState_Release),
    # whatever the store: not what this test is about
    import os
    os._exit(0)
''')


def test_cells_on_a_read_only_store(unwritable, tmp_path, monkeypatch):
    plain, indexed = tmp_path / "plain", tmp_path / "indexed"
    before = _chatted(plain, indexed=False)  # never searched: the recall index has no tables yet
    _chatted(indexed, indexed=True)
    script = tmp_path / "cells.py"
    script.write_text(_SCRIPT)
    stores = tmp_path / "stores"
    stores.mkdir()
    plain, indexed = plain.rename(stores / "plain"), indexed.rename(stores / "indexed")
    monkeypatch.setenv("MFS_STORE", str(plain))
    monkeypatch.setenv("MFS_RECALL_INDEX", "true")  # the indexer thread starts, and fails quietly
    monkeypatch.setenv("MFS_QUIET_MAINTENANCE_S", "1")  # so does the fold at quiet moments
    doc = tmp_path / "notes.md"
    doc.write_text("Rollout plan: canary first, then 10 %, then everyone.\n")
    done = unwritable(stores, [sys.executable, str(script), str(indexed), str(doc)])
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Exception in thread" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    *cells, search, threads = json.loads(done.stdout.split("RESULT ", 1)[1])
    # a store this process may not write is opened read-only: a turn is refused before it starts, so the quiet
    # fold is never armed, and the indexer, which has no thread there, says nothing
    assert threads["quiet_runs"] == 0 and threads["index_notices"] == [], threads
    by = {c["cell"]: c for c in cells}
    for c in cells:
        assert c["ok"], c  # nothing escaped the cell: Run All goes on
        assert "Traceback" not in c["out"] + c["err"], c
    for cell in ("%%chat\nwhat was the budget?", "%%chat\nstill there?", f"%%chat --doc {doc}\nread this"):
        lines = by[cell]["err"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("mfs: "), by[cell]
        assert "read-only" in lines[0] and str(plain) in lines[0] and "MFS_STORE" in lines[0], lines[0]
        assert "Read-only file system" not in lines[0] and "cargo" not in lines[0]  # no raw OS or lance text
    recall = by['%recall "budget"']
    assert recall["err"] == "", recall  # a search is no error: the log is read, nothing is written
    assert "read-only" in recall["out"] and "Our budget is 40k euros" in recall["out"], recall
    assert "Our budget is 40k euros" in by["%recall 1"]["out"] and by["%recall 1"]["err"] == ""
    assert "2 turns" in by["%mfs status"]["out"] and by["%mfs status"]["err"] == ""
    assert "raw tail" in by["%context"]["out"] and by["%context"]["err"] == ""
    assert "default" in by["%mfs sessions"]["out"]
    assert 1 in search["hits"], search  # the indexed store answers from its index
    assert not any("read-only" in n or "paused" in n for n in search["notices"]), search  # and has nothing to add
    # nothing was lost, and the same store is writable again where it is not mounted read-only
    from mfs_nb.session import Session
    from mfs_nb.store import Store

    s = Session("default", store=Store(plain))
    assert [(e.uid, e.content) for e in s.store.load_events("default")] == before
    s.chat("writable again")
    assert s.last_uid == before[-1][0] + 2
    s.indexer.close(wait_s=30)


def _doctor_cli(argv: list[str], run=None, folder: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mfs_nb", "doctor", *argv]
    if run is not None:
        return run(folder, cmd)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0, done
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mfs-nb: "), done.stderr
    return lines[0]


def test_doctor_on_a_regular_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("not a store")
    line = _one_line(_doctor_cli(["--store", str(f)]))
    assert str(f) in line and "is a file" in line
    assert f.read_text() == "not a store"


def test_doctor_on_a_missing_path(tmp_path):
    gone = tmp_path / "nowhere" / "store"
    line = _one_line(_doctor_cli(["--store", str(gone)]))
    assert str(gone) in line and "does not exist" in line
    assert not gone.exists() and not gone.parent.exists()  # doctor only looks: nothing is created
    assert main(["doctor", "--store", str(gone)]) == 2


def test_doctor_on_an_unreadable_folder(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: drops root's capabilities so that a folder's permissions count")
    folder = tmp_path / "locked"
    _chatted(folder, indexed=False)
    folder.chmod(0)
    try:
        done = subprocess.run(_nowrite_cmd([sys.executable, "-m", "mfs_nb", "doctor", "--store", str(folder)]),
                              capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(0o755)
    if "prctl:" in done.stderr:
        pytest.skip(f"cannot drop capabilities here: {done.stderr.strip()}")
    line = _one_line(done)
    assert str(folder) in line and "cannot be read" in line


def test_a_store_path_that_is_a_file_says_so(tmp_path):
    """The message a cell prints for a store path that is a file names the problem, and the doctor
    command it used to suggest for it no longer crashes (above)."""
    from mfs_nb.errors import StoreError
    from mfs_nb.store import Store

    f = tmp_path / "file-store"
    f.write_text("x")
    with pytest.raises(StoreError) as info:
        Store(f)
    assert "is a file, not a store folder" in str(info.value) and "\n" not in str(info.value)


def test_doctor_reads_a_read_only_store(unwritable, tmp_path):
    folder = tmp_path / "ro"
    _chatted(folder, indexed=False)
    done = _doctor_cli(["--store", str(folder)], unwritable, folder)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "session default: uids 1–4 present" in done.stdout


_OPEN_SCRIPT = textwrap.dedent('''
    import asyncio, contextlib, io, json, os, sys
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    store, writable, export = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=cfg)
    shell.run_cell("%load_ext mfs_nb")
    reading = [f"%mfs open {store}", '%recall "budget"', "%recall 1-2", "%context", "%mfs status", "%mfs ledger",
               f"%mfs export {export}", "%mfs sessions", "%mfs cost", "%mfs pin", "%mfs config"]
    writing = ["%%chat\\nstill there?", "%mfs pin region=eu-west-1", "%mfs unpin db", "%compact", "%compact --undo",
               "%mfs new other", "%mfs optimize", "%mfs gc", "%mfs fork sidetrack"]
    after = [f"%mfs fork cont --store {writable}", "%%chat\\nand the deploy day?", "%recall 1-6", "%mfs pin"]
    out = []
    for cell in reading + writing + after:
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            result = shell.run_cell(cell)
        out.append({"cell": cell, "ok": result.success, "out": o.getvalue(), "err": e.getvalue()})

    from mcp import Client
    from mfs_nb.commands.mcp_server import Memory, build
    from mfs_nb.store import Store

    async def mcp() -> dict:
        said = {}
        for writes in (False, True):
            async with Client(build(Memory(Store(store), allow_writes=writes))) as client:
                for name, args in [("list_sessions", {}), ("recall_search", {"query": "budget"}),
                                   ("recall_history", {"session": "analysis", "uid_from": 1, "uid_to": 4}),
                                   ("context", {"session": "analysis"}),
                                   ("pin", {"session": "analysis", "key": "k", "value": "v"}),
                                   ("append_note", {"session": "analysis", "text": "a note"})]:
                    r = await client.call_tool(name, args)
                    said[f"{name}{'+w' if writes else ''}"] = [r.is_error, "\\n".join(c.text for c in r.content)]
                for uri in ("mfs://analysis/export.md", "mfs://analysis/ledger.json"):
                    said[uri] = (await client.read_resource(uri)).contents[0].text[:2000]
        return said

    out.append(asyncio.run(mcp()))
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)
''')


def _analysis(path: Path) -> list[tuple[int, str]]:
    from mfs_nb.session import Session
    from mfs_nb.store import Store

    s = Session("analysis", store=Store(path))
    s.chat("Our budget is 40k euros; keep the connection pool small.")
    s.chat("Deploy on Friday, after the review.")
    s.pin("db", "postgres 15")
    s.close()
    return [(e.uid, e.content) for e in s.store.load_events("analysis")]


def test_every_reading_cell_and_mcp_tool_works_on_a_read_only_store_and_a_fork_goes_on_elsewhere(unwritable, tmp_path):
    """Issue 69: a store met read-only is read by every reading magic and MCP tool with no traceback; every
    writing one says so in one `mfs:` line; `%mfs fork NAME --store PATH` carries the session, same uids,
    into a writable store, and the conversation goes on there."""
    stores = tmp_path / "stores"
    before = _analysis(stores / "team")
    files = sorted(str(p.relative_to(stores)) for p in stores.rglob("*"))
    script = tmp_path / "open.py"
    script.write_text(_OPEN_SCRIPT)
    writable, export = tmp_path / "mine", tmp_path / "export.md"
    done = unwritable(stores, [sys.executable, str(script), str(stores / "team"), str(writable), str(export)])
    assert "Traceback" not in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-2000:]
    *cells, mcp = json.loads(done.stdout.split("RESULT ", 1)[1])
    by = {c["cell"]: c for c in cells}
    for c in cells:
        assert c["ok"] and "Traceback" not in c["out"] + c["err"], c
    opened = by[f"%mfs open {stores / 'team'}"]["out"]
    assert "read-only" in opened and "%%chat reads analysis" in opened, opened  # the notebook's default is not there
    for cell in ('%recall "budget"', "%recall 1-2", "%context", "%mfs status", "%mfs ledger", f"%mfs export {export}",
                 "%mfs sessions", "%mfs cost", "%mfs pin", "%mfs config"):
        assert by[cell]["err"] == "" and by[cell]["out"].strip(), by[cell]
    assert "Our budget is 40k euros" in by['%recall "budget"']["out"] and "db = 'postgres 15'" in by["%mfs pin"]["out"]
    assert "read-only" in by['%recall "budget"']["out"]  # search says how far the index it reads has come
    assert "Deploy on Friday" in export.read_text()
    for cell in ("%%chat\nstill there?", "%mfs pin region=eu-west-1", "%mfs unpin db", "%compact", "%compact --undo",
                 "%mfs new other", "%mfs optimize", "%mfs gc", "%mfs fork sidetrack"):
        lines = by[cell]["err"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("mfs: ") and "read-only" in lines[0], (cell, by[cell])
        assert "%mfs fork NAME --store PATH" in lines[0], lines[0]
    copied = by[f"%mfs fork cont --store {writable}"]["out"]
    assert "4 messages as uids 1–4, word for word" in copied, copied
    assert "Deploy on Friday" in by["%recall 1-6"]["out"] and "and the deploy day?" in by["%recall 1-6"]["out"]
    assert "[#5 user" in by["%recall 1-6"]["out"] and "db = 'postgres 15'" in by["%mfs pin"]["out"]
    for name in ("list_sessions", "recall_search", "recall_history", "context", "list_sessions+w", "context+w"):
        assert mcp[name][0] is False, (name, mcp[name])
    assert "Our budget is 40k euros" in mcp["recall_history"][1] and "analysis" in mcp["list_sessions"][1]
    assert "# mfs_nb session `analysis`" in mcp["mfs://analysis/export.md"]
    assert mcp["pin"][0] and "--allow-writes" in mcp["pin"][1]
    for name in ("pin+w", "append_note+w"):
        assert mcp[name][0] and "read-only" in mcp[name][1] and "\n" not in mcp[name][1], (name, mcp[name])
    # the read-only store is as it was; the copy is a store of its own that goes on from uid 5
    assert sorted(str(p.relative_to(stores)) for p in stores.rglob("*")) == files
    from mfs_nb.session import Session
    from mfs_nb.store import Store

    assert [(e.uid, e.content) for e in Store(stores / "team").load_events("analysis")] == before
    mine = Session("cont", store=Store(writable))
    assert [(e.uid, e.content) for e in mine.events][:4] == before and mine.last_uid == 6
    mine.close()


def test_a_copy_keeps_uids_segments_and_pins_and_a_stopped_copy_is_finished(tmp_path):
    from mfs_nb.errors import InputError, StoreError
    from mfs_nb.session import Session
    from mfs_nb.store import Store

    s = Session("long", store=tmp_path / "a")
    for i in range(8):
        s.chat(f"Step {i}: the pool size is {10 + i} and the log is at /var/log/app-{i}.log")
    s.pin("owner", "ana")
    assert s.compact() and s.compactor.segments
    s.close()
    ro = Session("long", store=tmp_path / "a", read_only=True)
    assert ro.store.read_only and not ro.store.writable()
    with pytest.raises(StoreError, match="opened read-only"):
        ro.chat("x")
    with pytest.raises(InputError, match="no session 'nope'"):
        Session("nope", store=ro.store)
    target = Store(tmp_path / "b")
    # a copy that stopped after the log (the state row never came): the same call finishes it
    from mfs_nb.store import copying

    real = copying._rows
    copying._rows = lambda *a: (_ for _ in ()).throw(KeyboardInterrupt())
    try:
        with pytest.raises(KeyboardInterrupt):
            ro.copy_to(target, "long")
    finally:
        copying._rows = real
    copy = ro.copy_to(target, "long")
    assert [(e.uid, e.sha256) for e in copy.events] == [(e.uid, e.sha256) for e in ro.events]
    assert [(x.uid_from, x.uid_to, x.render()) for x in copy.compactor.segments] == \
        [(x.uid_from, x.uid_to, x.render()) for x in ro.compactor.segments]
    assert copy.knowledge.entries["owner"].value == "ana"
    assert copy.send_view().messages == ro.send_view().messages  # the model would be sent the same
    copy.chat("go on")
    assert copy.last_uid == ro.last_uid + 2
    with pytest.raises(InputError, match="has gone on"):  # copied again over a copy that went on: refused
        ro.copy_to(target, "long")
    copy.close()


def test_doctor_reports_a_damaged_read_only_store_and_repairs_nothing(unwritable, tmp_path):
    folder = tmp_path / "ro"
    _chatted(folder, indexed=False)
    data = sorted((folder / "events.lance" / "data").glob("*.lance"))[0]
    data.write_bytes(data.read_bytes()[:10])  # one fragment of the log cut short
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    done = _doctor_cli(["--store", str(folder)], unwritable, folder)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr
    assert "UNREADABLE" in done.stdout and "--repair" in done.stdout, done.stdout
    line = _one_line(_doctor_cli(["--store", str(folder), "--repair"], unwritable, folder))
    assert "read-only" in line and str(folder) in line, line
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before  # nothing was repaired, or touched
