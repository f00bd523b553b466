"""`%mfs ledger`: every memory-layer action as a sortable table, and payload tokens per call."""

from __future__ import annotations

import html
import json

from .widget import Widget, esm


class LedgerView(Widget):
    _esm = esm("ledger.js")

    def text(self) -> str:
        rows = self.data["rows"]
        if not rows:
            return "ledger is empty: the memory layer has not acted yet"
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in rows)

    def html(self) -> str:
        cols = self.data["columns"]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                       for r in self.data["rows"])
        return f"<table class='mfs-ledger'><tr>{head}</tr>{body}</table>"
