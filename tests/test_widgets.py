"""Widgets, Python side: JSON view data, traits, mimebundles, fallbacks, escaping, typed messages."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import FakeLLM, tool_call

from mfs_nb import Session
from mfs_nb.recall.tools import Tool
from mfs_nb.ui.context import ContextView
from mfs_nb.ui.data import context_data, ledger_data, recall_data, status_data
from mfs_nb.ui.ledger import LedgerView
from mfs_nb.ui.recall import RecallView
from mfs_nb.ui.status import StatusBar
from mfs_nb.ui.widget import esm

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"
WIDGETS = Path(__file__).resolve().parent.parent / "widgets"


def session_with_everything(store_dir) -> Session:
    long_reply = "done: " + "the pool stays under thirty and the retries back off slowly. " * 60
    fake = FakeLLM(script=[f"reply with {XSS}", tool_call(f"probe{XSS}"[:5], {"file": f"../{XSS}.md"}), long_reply])
    s = Session("w", store=store_dir, window_tokens=32000, llm=fake)
    s.register_tool(Tool("probe", "", {"type": "object"}, lambda file="": f"read {file}"))
    s.chat(f"hello {XSS}")
    s.chat("use the tool")
    s.chat("thanks")  # the long reply leaves the current turn, so compacting it shrinks the payload
    s.compact()
    return s


def bundle(widget) -> dict:
    b = widget._repr_mimebundle_()
    return b[0] if isinstance(b, tuple) else b


def test_status_bar_data_and_fallbacks(store_dir):
    s = Session("st", store=store_dir, llm=FakeLLM())
    reply = s.chat("hi")
    data = status_data(reply.usage, [f"notice {XSS}"])
    assert data["line"] == reply.usage.status_line() and data["tier"] == "ok" and data["colour"].startswith("#")
    bar = StatusBar(data=data)
    mime = bundle(bar)
    assert "application/vnd.jupyter.widget-view+json" in mime
    assert mime["text/plain"].startswith("ctx ") and f"notice {XSS}" in mime["text/plain"]
    assert "<script>" not in mime["text/html"] and "&lt;script&gt;" in mime["text/html"]


def test_context_view_layers_tools_and_escaping(store_dir):
    s = session_with_everything(store_dir)
    data = context_data(s)
    kinds = [layer["kind"] for layer in data["layers"]]
    assert kinds[0] == "system" and "segment" in kinds and kinds[-1] == "tools"  # schemas: sent, not messages
    seg = next(x for x in data["layers"] if x["kind"] == "segment")
    assert seg["label"] == "summary" and seg["text"].startswith("[user] [segment #1")
    assert sum(x["tokens"] for x in data["layers"]) == s.usage().tokens == data["usage"]["tokens"]  # one number
    assert data["gaps"] == []
    (tool,) = data["tools"]
    assert tool["name"] == "probe" and tool["state"] == "compacted" and XSS in tool["arguments"]
    view = ContextView(data=data, recall=lambda uid: recall_data(s.recall(uid))["events"])
    mime = bundle(view)
    assert "summary" in mime["text/plain"] and "probe" in mime["text/plain"]
    assert "<script>" not in mime["text/html"] and "<img" not in mime["text/html"]
    sent = []
    view.send = sent.append  # type: ignore[method-assign]
    view._on_message(view, {"type": "recall", "uid": 1})
    view._on_message(view, {"type": "recall", "uid": 999})
    view._on_message(view, {"type": "other"})
    assert sent[0]["type"] == "recall_result" and sent[0]["events"][0]["content"] == f"hello {XSS}"
    assert sent[1]["type"] == "recall_result" and "no events" in sent[1]["error"] and len(sent) == 2


def test_context_view_marks_coverage_gaps(store_dir):
    from mfs_nb.layers.segments import build

    s = session_with_everything(store_dir)
    assert context_data(s)["gaps"] == []
    events = s.events
    s.compactor.evicted = []
    s.compactor.segments = [build(9, events[2:4], "- a summary that skips the first two uids")]
    data = context_data(s)
    assert data["gaps"] == [1, 2]
    mime = bundle(ContextView(data=data))
    assert "COVERAGE GAP: 2 uid(s): [1, 2]" in mime["text/plain"] and "coverage gap" in mime["text/html"]


def test_recall_view_is_verbatim_and_escaped(store_dir):
    s = session_with_everything(store_dir)
    events = s.recall(1, 2)
    view = RecallView(data=recall_data(events))
    mime = bundle(view)
    assert mime["text/plain"].startswith(f"[#1 user · turn 1]\nhello {XSS}")
    assert "<script>" not in mime["text/html"] and "&lt;script&gt;alert(1)&lt;/script&gt;" in mime["text/html"]
    assert view.data["events"][1]["content"] == f"reply with {XSS}"
    long = recall_data([s.events[0].__class__(99, "w", 1, "tool", "x" * 5000)])["events"][0]
    assert long["folded"] and long["chars"] == 5000


def test_ledger_view(store_dir):
    s = session_with_everything(store_dir)
    data = ledger_data(s.ledger(), s.history, s.usage().effective)
    assert "kind" in data["columns"] and any(r["kind"] == "compaction" for r in data["rows"])
    assert [h["call"] for h in data["series"]] == list(range(1, len(data["series"]) + 1))
    mime = bundle(LedgerView(data=data))
    assert "compaction" in mime["text/plain"] and "<table" in mime["text/html"]
    assert LedgerView(data=ledger_data([], [], 1000)).text().startswith("ledger is empty")


def test_front_ends_never_write_html_and_bundle_cleanly():
    for js in WIDGETS.glob("*.js"):
        source = js.read_text()
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", source), js.name
    for name in ("context.js", "recall.js", "ledger.js"):
        code = esm(name)
        assert "from \"./common.js\"" not in code and "export default" in code and "export function h(" in code


def test_status_bar_follows_a_background_compaction(store_dir):
    import threading
    import time

    s = Session("org", store=store_dir, llm=FakeLLM())
    bar = StatusBar(data=status_data(s.chat("hi").usage))
    done = threading.Event()
    bar.follow(done)
    assert bar.data["organizing"] == "running"
    done.set()
    deadline = time.monotonic() + 5
    while bar.data.get("organizing") != "done" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bar.data["organizing"] == "done" and bar.data["line"].startswith("ctx ")
