"""`%context`: the layered send view and the tool trajectory, with recall on request."""

from __future__ import annotations

from typing import Any

from .widget import Widget, esm


class ContextView(Widget):
    _esm = esm("context.js")

    def __init__(self, recall: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._recall = recall
        self.on_msg(self._on_message)

    def _on_message(self, _: Any, msg: Any, buffers: Any = None) -> None:
        """Typed requests from the front end: {"type": "recall", "uid": n} → recall_result."""
        if not isinstance(msg, dict) or msg.get("type") != "recall" or self._recall is None:
            return
        uid = msg.get("uid")
        try:
            events = self._recall(uid)
            self.send({"type": "recall_result", "uid": uid, "events": events})
        except Exception as exc:  # an answer, never a broken widget
            self.send({"type": "recall_result", "uid": uid, "error": str(exc)})

    def text(self) -> str:
        d = self.data
        lines = [f"send view: {d['usage']['line']}"]
        layers = d["layers"]
        # the columns are as wide as their longest entry, so every row lines up
        label = max([14, *(len(x["label"]) for x in layers)])
        span = max([18, *(len(x["span"]) for x in layers)])
        for layer in layers:
            extra = f" merged {layer['level']}×" if layer["level"] else ""
            extra += " degraded" if layer["degraded"] else ""
            lines.append(f"  {layer['label']:<{label}} {layer['span']:<{span}} {layer['tokens']:>7,} tokens{extra}")
        if d["gaps"]:
            lines.append(f"  COVERAGE GAP: {len(d['gaps'])} uid(s): {d['gaps'][:20]}")
        if d["tools"]:
            lines.append(f"tool trajectory: {len(d['tools'])} call(s)")
            lines += [f"  #{t['uid']} {t['name']} → {t['state']} ({t['chars']:,} chars)" for t in d["tools"]]
        return "\n".join(lines)

    def html(self) -> str:
        from .html import context_html

        return context_html(self.data)
