"""What the magics show in a cell: rich output with a plain-text form, a progress line while a cell
waits, a reply streamed in place, and the compaction preview."""

from __future__ import annotations

import html
import sys
import time
from typing import Any

from IPython.display import Markdown, display


def preview_lines(p: dict[str, Any]) -> list[str]:
    """The preview as lines of text: the verdict, the numbers, then the segment's text."""
    if "nothing" in p:
        return [f"preview: nothing to compact ({p['nothing']}); nothing committed"]
    lines = [f"preview, nothing committed: uids {p['uid_from']}–{p['uid_to']} ({p['messages']} messages) would become "
             f"one segment of {p['segment_tokens']:,} tokens"
             + (f" (degraded: {p['error']})" if p["degraded"] else "")]
    if not p["would_commit"]:
        lines.append(f"%compact would not commit it: the payload would go from {p['tokens_before']:,} to "
                     f"{p['tokens_after']:,} tokens (nothing worth compacting yet)")
    lines.append(f"payload {p['tokens_before']:,} → {p['tokens_after']:,} tokens; the next call would read "
                 f"{p['cache_miss_tokens']:,} tokens again (prefix-cache miss); the summary cost "
                 f"{p['llm_tokens']:,} LLM tokens")
    return lines


def show_preview(shell: Any, p: dict[str, Any]) -> None:
    lines = preview_lines(p)
    text = "\n".join(lines + ([p["segment_text"]] if "segment_text" in p else []))
    if not has_frontend(shell):
        print(text)
        return
    from ..ui.html import PANEL, PRE, escape

    body = "".join(f"<div>{escape(line)}</div>" for line in lines)
    if "segment_text" in p:
        body += (f"<details open><summary>the segment it would commit</summary><pre style='{PRE}'>"
                 f"{escape(p['segment_text'])}</pre></details>")
    display(Rich(text, f"<div class='mfs-preview' style='{PANEL}'>{body}</div>"))


class Progress:
    """A line saying what a cell is waiting for (model client, store, compaction), shown while it
    waits and then cleared; in a terminal, one line on stderr."""

    def __init__(self, shell: Any, text: str):
        self.rich = has_frontend(shell)
        self.text = text
        self.handle: Any = None

    def __enter__(self) -> Progress:
        if self.rich:
            self.handle = display(Rich(self.text, f"<div style='font:12px monospace;color:#777'>"
                                                  f"<i>{html.escape(self.text)}</i></div>"), display_id=True)
        else:
            print(f"mfs: {self.text}", file=sys.stderr)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.handle.update(Rich("", ""))


class Rich:
    """Output with a plain-text and an HTML form; each front end picks the one it can show."""

    def __init__(self, text: str, html: str):
        self.text, self.html = text, html

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": self.html}

    def __repr__(self) -> str:
        return self.text


def has_frontend(shell: Any) -> bool:
    """True inside a kernel whose front end can show rich output (not a plain terminal)."""
    return getattr(shell, "kernel", None) is not None


class Stream:
    """Streams deltas into the cell: a Markdown display updated in place, or plain prints."""

    def __init__(self, shell: Any, every_s: float = 0.1):
        self.rich = has_frontend(shell)
        self.parts: list[str] = []
        self.handle: Any = None
        self.every_s = every_s
        self.last = 0.0

    def delta(self, text: str) -> None:
        self.parts.append(text)
        if not self.rich:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._show()

    def reset(self) -> None:
        """The endpoint switched mid-stream: start the reply over."""
        self.parts.clear()
        if not self.rich:
            sys.stdout.write("\n[switching endpoint; reply restarts]\n")
        else:
            self._show()

    def _show(self) -> None:
        body = Markdown("".join(self.parts))
        if self.handle is None:
            self.handle = display(body, display_id=True)
        else:
            self.handle.update(body)

    def finish(self, text: str) -> None:
        if not self.rich:
            if not self.parts:
                sys.stdout.write(text)
            sys.stdout.write("\n")
            return
        self.parts = [text]
        self._show()
