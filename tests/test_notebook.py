"""examples/quickstart.ipynb executed headless through nbclient and ipykernel, then re-run after a restart."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"


def _run(tmp_path: Path) -> list[str]:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        chunk = []
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
            if out.get("output_type") == "stream":
                chunk.append(out["text"])
            elif "data" in out:
                chunk.append(out["data"].get("text/plain", "") + out["data"].get("text/markdown", ""))
        texts.append("".join(chunk))
    return texts


def test_quickstart_runs_offline_and_resumes_after_restart(tmp_path, monkeypatch):
    monkeypatch.setenv("MFS_STORE", str(tmp_path / ".mfs"))
    first = _run(tmp_path)
    assert "No model is configured" in first[1]
    assert "ctx " in first[1] + first[3]
    recall = first[4]
    assert "[#1 user · turn 1]\nHelp me pick the connection-pool size" in recall
    assert "[#2 assistant · turn 1]" in recall
    assert "4 events, last uid 4" in first[5]
    assert "raw 1 4" in first[6]

    second = _run(tmp_path)  # a fresh kernel on the same store: the conversation continues
    assert "8 events, last uid 8" in second[5]
    assert "raw 1 8" in second[6]
    assert second[4] == recall
