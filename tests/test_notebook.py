"""examples/quickstart.ipynb executed headless through nbclient and ipykernel, then re-run after a restart."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _run(tmp_path: Path) -> tuple[list[str], list[list[dict]], dict]:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts, outputs = [], []
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
        outputs.append(cell.get("outputs", []))
    return texts, outputs, nb.metadata.get("widgets", {})


def test_quickstart_runs_offline_shows_static_outputs_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("MFS_STORE", str(tmp_path / ".mfs"))
    # the kernel runs in tmp_path: make it import this checkout, not whichever copy is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(NOTEBOOK.parent.parent),
                                                                   os.environ.get("PYTHONPATH")])))
    first, outputs, _ = _run(tmp_path)
    load, _, chat1, _, chat2, recall, status, compact, context, ledger, api = first
    assert "No model is configured" in chat1 and "ctx " in chat1
    assert "[#1 user · turn 1]\nHelp me pick the connection-pool size" in recall and "[#2 assistant · turn 1]" in recall
    assert "4 events, last uid 4" in status
    assert "context compacted:" in compact and "segment #1, uids 1–2" in compact
    assert "L0 segment" in context and "raw tail" in context
    assert "compaction" in ledger
    assert "segment 1 2" in api and "raw 3 4" in api
    # rich outputs are static HTML, so a notebook reopened without a kernel shows them (no widget
    # view that would need a live model: "Error displaying widget: model not found")
    for index in (2, 5, 8, 9):
        assert any("text/html" in o.get("data", {}) for o in outputs[index]), index
    assert not any(WIDGET_VIEW in o.get("data", {}) for cell in outputs for o in cell)
    html = json.dumps([o.get("data", {}).get("text/html", "") for cell in outputs for o in cell])
    assert "Help me pick the connection-pool size" in html and "L0 segment" in html and "ctx " in html

    second, _, _ = _run(tmp_path)  # a fresh kernel on the same store: the conversation continues
    assert "8 events, last uid 8" in second[6]
    assert "segment 1 2" in second[10] and "segment 3 6" in second[10] and "raw 7 8" in second[10]
    assert second[5] == recall
