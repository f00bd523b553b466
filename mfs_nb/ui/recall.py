"""`%recall A-B`: the original events, verbatim; `%recall "text"`: search hits, with a search box."""

from __future__ import annotations

import html
from typing import Any

from .data import recall_html_from_data
from .widget import Widget, esm


class RecallView(Widget):
    _esm = esm("recall.js")

    def __init__(self, search: Any = None, recall: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._search, self._recall = search, recall
        self.on_msg(self._on_message)

    def _on_message(self, _: Any, msg: Any, buffers: Any = None) -> None:
        """Typed requests from the front end: {"type": "search", "query": q} → search_result;
        {"type": "recall", "uid": n} → recall_result. Errors come back as {"error": …}."""
        if not isinstance(msg, dict):
            return
        kind = msg.get("type")
        try:
            if kind == "search" and self._search is not None:
                self.send({"type": "search_result", "query": msg.get("query"), **self._search(msg.get("query"))})
            elif kind == "recall" and self._recall is not None:
                self.send({"type": "recall_result", "uid": msg.get("uid"), "events": self._recall(msg.get("uid"))})
        except Exception as exc:  # an answer, never a broken widget
            self.send({"type": f"{kind}_result", "query": msg.get("query"), "uid": msg.get("uid"), "error": str(exc)})

    def text(self) -> str:
        if "hits" in self.data:
            notices = self.data.get("notices", [])  # one note at most above the hits
            lines = [f"note: {'; '.join(notices)}"] if notices else []
            lines += [h["line"] for h in self.data["hits"]] or ["no matches"]
            return "\n".join(lines)
        return str(self.data["text"])

    def html(self) -> str:
        if "hits" in self.data:
            items = "".join(f"<li><code>{html.escape(h['line'])}</code></li>" for h in self.data["hits"])
            notices = self.data.get("notices", [])
            notes = f"<div style='color:#777'>note: {html.escape('; '.join(notices))}</div>" if notices else ""
            return f"<div class='mfs-recall'>{notes}<ol>{items}</ol></div>"
        return recall_html_from_data(self.data["events"])


def search_data(found: Any) -> dict[str, Any]:
    """Search results as the widget's JSON view data."""
    return {"query": getattr(found, "query", ""), "notices": list(found.notices),
            "hits": [{**h.to_json(), "line": h.line()} for h in found.hits], "events": []}
