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
    load, _, chat1, _, chat2, pin, recall, status, preview, compact, context, ledger, cost, api = first
    assert "No model is configured" in chat1 and "ctx " in chat1
    # uid 1: the cell log's record of the code cell that wrote the file (it ran before the first chat)
    assert "[#1 tool · notebook · turn 1]" in recall and "`import pathlib, tempfile (+3 lines)`" in recall
    assert "[#2 user · turn 2]\nHelp me pick the connection-pool size" in recall and "[#3 assistant · turn 2]" in recall
    assert "6 events, last uid 6" in status
    assert "knowledge slot: pinned db_limit, pool_max" in pin
    assert "preview, nothing committed: uids 1–4" in preview and "[segment #1 · uids 1–4" in preview
    assert "context compacted:" in compact and "segment #1, uids 1–4" in compact
    assert "knowledge slot" in context and "knowledge" in ledger
    assert "summary " in context and "raw tail" in context
    assert "compaction" in ledger
    assert "priced with litellm's cost map" in cost and "with no cache $0.0000" in cost  # the offline default
    assert "knowledge None None" in api and "segment 1 4" in api and "raw 5 6" in api
    # rich outputs are static HTML, so a notebook reopened without a kernel shows them (no widget
    # view that would need a live model: "Error displaying widget: model not found")
    for index in (2, 6, 8, 10, 11):
        assert any("text/html" in o.get("data", {}) for o in outputs[index]), index
    assert not any(WIDGET_VIEW in o.get("data", {}) for cell in outputs for o in cell)
    html = json.dumps([o.get("data", {}).get("text/html", "") for cell in outputs for o in cell])
    assert "Help me pick the connection-pool size" in html and "</span>summary " in html and "ctx " in html

    second, _, _ = _run(tmp_path)  # a fresh kernel on the same store: the conversation continues
    assert "12 events, last uid 12" in second[7]
    assert "segment 1 4" in second[13] and "segment 5 10" in second[13] and "raw 11 12" in second[13]
    assert second[6] == recall
