"""`%mfs ledger`: every memory-layer action as a sortable table, and payload tokens per call."""

from __future__ import annotations

from .data import cell_text, ledger_phrase
from .widget import Widget, esm


class LedgerView(Widget):
    _esm = esm("ledger.js")

    def text(self) -> str:
        rows = self.data["rows"]
        if not rows:
            return "ledger is empty: the memory layer has not acted yet"
        lines = []
        for r in rows:  # `#12 compaction · compacting: tokens before: 3,120; …`, every field in words
            head = f"#{r.get('seq', '')} {r.get('kind', '')}" + (f" · {cell_text('tier', r['tier'])}" if r.get("tier") else "")
            lines.append(f"{head}: {ledger_phrase(r, ('seq', 'kind', 'tier'))}")
        return "\n".join(lines)

    def html(self) -> str:
        from .html import ledger_html

        return ledger_html(self.data)
