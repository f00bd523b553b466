"""The status bar under each `%%chat` reply: meter, tier colour, cache ratio, session, notices, and
the "organizing context…" bar while a background compaction runs."""

from __future__ import annotations

import threading

from .data import status_html
from .widget import Widget, static_file


class StatusBar(Widget):
    _esm = static_file("status.js")

    def text(self) -> str:
        return "\n".join([self.data.get("line", ""), *self.data.get("notices", [])])

    def html(self) -> str:
        return status_html(self.data)

    def follow(self, done: threading.Event) -> None:
        """Show "organizing context…" until `done`, then "organized …" (the front end fades it)."""
        self.data = {**self.data, "organizing": "running"}

        def wait() -> None:
            done.wait()
            self.data = {**self.data, "organizing": "done"}

        threading.Thread(target=wait, daemon=True, name="mfs-organizing").start()


