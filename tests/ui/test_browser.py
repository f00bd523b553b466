"""The mfs outputs in a real browser, and again after the saved notebook is reopened: JupyterLab on 127.0.0.1, Debian chromium headless via playwright-core.

Needs chromium, node and `npm install --prefix tests/ui` (.ci/run installs them). Where they are
missing the test is skipped with the reason — unless MFS_REQUIRE_BROWSER=1 (set by CI), where a
missing piece is a failure, so CI can never pass without running it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from procs import free_port, stop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    if shutil.which("node") is None:
        return "no node"
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        return "playwright-core not installed (npm install --prefix tests/ui)"
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return "jupyterlab not installed (pip install jupyterlab)"
    return None


@pytest.mark.slow
def test_outputs_render_and_survive_a_reopen_in_jupyterlab(tmp_path):
    why = _missing()
    if why:
        if os.environ.get("MFS_REQUIRE_BROWSER"):
            pytest.fail(f"browser test required but {why}")
        pytest.skip(why)
    work = tmp_path / "nb"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "quickstart.ipynb", work / "quickstart.ipynb")
    port, token = free_port(), "mfs-test-token"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "MFS_STORE": str(tmp_path / "store"), "MFS_FAILSHOT": str(tmp_path),
           # the kernel runs in another folder: make it import this checkout, not whichever is installed
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MFS_MODEL", None)
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--ServerApp.open_browser=False",
         "--allow-root"],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
                time.sleep(0.5)
        # screenshots refresh docs/img only when asked (MFS_REFRESH_DOCS_IMG=1); tests never touch tracked files
        shots = ROOT / "docs" / "img" if os.environ.get("MFS_REFRESH_DOCS_IMG") == "1" else tmp_path / "img"
        out = subprocess.run(["node", str(HERE / "browser.mjs"), url, token, "quickstart.ipynb", str(shots)],
                             capture_output=True, text=True, timeout=420, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        stop(server, 20)
        log.close()
    assert not result["errors"], result["errors"]
    for state in (result, result["reopened"]):  # as run, and reopened from the saved file
        assert state["widgetErrors"] == 0 and state["mfsOutputs"] >= 6
        assert state["meter"].startswith("ctx ") and "session default" in state["meter"]
        assert "width:" in state["meterFill"]
        assert "#2 user · turn 2" in state["recall"] and "Our DB allows 120 connections" in state["recall"]
        assert "#1 tool · notebook" in state["recall"]  # the cell log's record of the cell that wrote the file
        assert any(s.startswith("system") for s in state["layers"])
        assert any(s.startswith("knowledge slot") for s in state["layers"])
        assert any(s.startswith("summary · uids 1–4") for s in state["layers"])
        assert any(s.startswith("raw tail · uids 5–6") for s in state["layers"])
        assert state["preview"].startswith("preview, nothing committed: uids 1–4") and "prefix-cache miss" in state["preview"]
        assert "[segment #1 · uids 1–4" in state["preview"]
        assert "knowledge slot: pinned db_limit, pool_max" in state["pinned"]
        assert state["bar"] >= 3 and "compaction" in state["contextText"]
        assert state["ledgerRows"] > 1 and "compaction" in state["ledgerText"] and state["ledgerFits"]
        assert "priced with litellm's cost map" in state["cost"] and "with no cache $0.0000" in state["cost"]  # %mfs cost
    assert result["reopened"]["layers"] == result["layers"] and result["reopened"]["meter"] == result["meter"]
    assert result["segmentOpen"] is True
    assert result["segmentText"].startswith("[user] [segment #1 · uids 1–4 · topics: ")
    assert "- db_limit: 120" in result["slotText"] and "- pool_max: 30" in result["slotText"]
    # an XSS probe in the user's text renders as inert text
    assert "<script>alert(1)</script> stays text" in result["rawText"]
    assert result["injected"] == 0 and result["dialogs"] == []
    for name in ("status", "context", "recall", "preview", "ledger"):
        assert (shots / f"{name}.png").stat().st_size > 1000
