"""`%recall A-B`: the original events, verbatim."""

from __future__ import annotations

from .data import recall_html_from_data
from .widget import Widget, esm


class RecallView(Widget):
    _esm = esm("recall.js")

    def text(self) -> str:
        return str(self.data["text"])

    def html(self) -> str:
        return recall_html_from_data(self.data["events"])
