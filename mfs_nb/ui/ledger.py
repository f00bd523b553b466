"""`%mfs ledger`: every memory-layer action as a sortable table, and payload tokens per call."""

from __future__ import annotations

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
        from .html import ledger_html

        return ledger_html(self.data)
