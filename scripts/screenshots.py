"""Refresh docs/img from a long replayed session (a real coding-agent conversation from ../shared/data).

    python scripts/screenshots.py [--data DIR] [--messages 240] [--window 24000]

Builds a notebook in a temporary folder that replays the conversation into the store, asks one more
question, pins a value, and shows %recall, %mfs status, a compaction preview, %context, %mfs ledger
and %mfs cost; runs it in JupyterLab through tests/ui/browser.mjs (Debian chromium, playwright-core)
and writes status/context/recall/preview/ledger.png to docs/img. The shared data is read in place and never copied into the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UI = ROOT / "tests" / "ui"


def _cell(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


def notebook(transcript: Path, window: int) -> dict:
    cells = [
        _cell("%load_ext mfs_nb"),
        _cell("import os\nfrom mfs_nb.commands.replay import load_transcript, replay\n\n"
              f"report = replay(load_transcript({str(transcript)!r}), window={window}, store=os.environ['MFS_STORE'],\n"
              "                session='default', keep=lambda s: s._save_meta())\n"
              "print(len(report['calls']), 'calls;', len(report['segments']), 'segments; coverage', report['coverage'])"),
        _cell(f"%mfs config window_tokens={window}"),
        _cell("%%chat\nWhere did we leave the failing test, and which file did we change last?"),
        _cell("%mfs pin test_runner=pytest"),
        _cell("%recall 3-4"),
        _cell("%mfs status"),
        # the outputs tests/ui/browser.mjs waits for and photographs, in the order it reads them
        _cell("%compact --preview keep the file names"),
        _cell("%context"),
        _cell("%mfs ledger"),
        _cell("%mfs cost"),
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="data directory with loaders.py (default: ../shared/data)")
    ap.add_argument("--messages", type=int, default=240, help="how many messages of the session to replay")
    ap.add_argument("--window", type=int, default=24_000)
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from mfs_nb.bench.dataset import Data, find_data, to_openai

    root = find_data(args.data)
    if root is None:
        print("no data directory (../shared/data or --data)", file=sys.stderr)
        return 2
    sessions = Data(root).get("claude_code_sessions")
    longest = max(sessions, key=lambda x: len(x["messages"]))
    messages = to_openai(longest["messages"])[:args.messages]
    tmp = Path(tempfile.mkdtemp(prefix="mfs-shots-"))
    transcript = tmp / "session.jsonl"
    transcript.write_text("".join(json.dumps(m, ensure_ascii=False) + "\n" for m in messages), encoding="utf-8")
    work = tmp / "nb"
    work.mkdir()
    (work / "long.ipynb").write_text(json.dumps(notebook(transcript, args.window)), encoding="utf-8")
    port, token = _free_port(), "mfs-shots"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "MFS_STORE": str(tmp / "store"), "MFS_FAILSHOT": str(tmp),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MFS_MODEL", None)
    log = (tmp / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--allow-root"],
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
                    print("JupyterLab did not start; see", tmp / "lab.log", file=sys.stderr)
                    return 1
                time.sleep(0.5)
        out = subprocess.run(["node", str(UI / "browser.mjs"), url, token, "long.ipynb", args.out],
                             capture_output=True, text=True, timeout=900, env=env)
        print(out.stdout[-3000:], out.stderr[-2000:], sep="\n")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return 0 if not result["errors"] else 1
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
