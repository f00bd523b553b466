"""The cell log (issue 18 deliverable 3): which notebook cells ran, in what order, with what outcome.

A notebook knows what a terminal agent does not. Every executed code cell that is not a `%%chat`
cell (nor one of mfs's own magics) is noted here as a compact record — execution count, content
hash, first line, ok or the error's name, duration, a bounded digest of its output — and the records
since the last chat join the session as one event when the next `%%chat` runs. That event is a tool
result of the notebook (role `tool`, name `notebook`): S2 may clear it like any tool output, S3
compacts it, and the failed cells' lines go to the fact track, so after a compaction the model
still knows which cells failed and why. Images and other binary outputs are named with their size,
never their bytes.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

NAME = "notebook"
HEADER = "[notebook cells run since the last message]"
FIRST_LINE_CHARS = 80
DIGEST_CHARS = 160
STDOUT_KEEP = 2_000  # characters of a cell's printed output kept for its digest
MAX_OUTPUTS = 20  # displays of one cell digested (a loop of displays is not kept whole)
MAX_FAILED = 200  # failures listed one per line in one event; older ones are counted
MAX_LINES = 40  # cells listed one per line in one event; beyond it ok cells are counted, failures still listed
OWN_MAGICS = ("%%chat", "%chat", "%context", "%compact", "%recall", "%mfs", "%load_ext", "%reload_ext",
              "%unload_ext")


@dataclass(frozen=True)
class CellRecord:
    count: int | None
    sha: str
    first_line: str
    error: str  # "" when the cell ran ok, else "ErrorName: first line of the message"
    duration_s: float
    digest: str

    def line(self) -> str:
        where = f"In [{self.count}]" if self.count is not None else "In [ ]"
        outcome = f"error {self.error}" if self.error else "ok"
        out = f"{where} {outcome} · {self.duration_s:.2f} s · #{self.sha} `{self.first_line}`"
        return out + (f" → {self.digest}" if self.digest else "")


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.0f} kB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MB"


def mime_digest(data: dict[str, Any]) -> str:
    """One short line for a display's mime bundle: text as text (cut), anything else as type and size."""
    parts = []
    text = data.get("text/plain")
    binary = [k for k in data if k != "text/plain"]
    for kind in binary:
        value = data[kind]
        if isinstance(value, (bytes, bytearray)):
            n = len(value)
        elif isinstance(value, str) and kind.startswith("image/") and kind != "image/svg+xml":
            n = len(value) * 3 // 4  # base64 in a mime bundle
        else:
            n = len(str(value).encode("utf-8", "replace"))
        parts.append(f"{kind} {_size(n)}")
    if text is not None and not any(k.startswith("image/") for k in binary):
        parts.insert(0, _cut(str(text)))
    return ", ".join(parts)


def _cut(text: str, limit: int = DIGEST_CHARS) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[:limit - 1] + "…"


def _first_line(code: str) -> str:
    lines = [x for x in code.strip().splitlines() if x.strip()]
    head = _cut(lines[0], FIRST_LINE_CHARS) if lines else ""
    return head.replace("`", "'") + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def is_own(code: str) -> bool:
    """A %%chat cell or a cell of mfs's own magics only: not work the model should hear about."""
    lines = [x.strip() for x in code.strip().splitlines() if x.strip()]
    if not lines:
        return True
    if lines[0].startswith("%%chat"):
        return True
    return all(any(x == m or x.startswith(m + " ") for m in OWN_MAGICS) for x in lines)


class _Tee:
    """Writes through to the real stream and keeps the first characters for the digest. Not an
    io class: every attribute it does not define (encoding, fileno, isatty, …) is the real stream's."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.kept: list[str] = []
        self.n = 0
        self.muted = False  # a display the shell prints itself (a terminal) is digested from its mime bundle

    def write(self, text: Any) -> Any:
        if isinstance(text, str) and self.n < STDOUT_KEEP and not self.muted:
            self.kept.append(text[:STDOUT_KEEP - self.n])
            self.n += len(self.kept[-1])
        return self.inner.write(text)

    def flush(self) -> Any:
        return self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CellLog:
    """Hooks on an IPython shell's pre/post_run_cell events; `take()` hands the pending records over.

    Only the outermost cell is recorded: a cell that runs cells (`%rerun`, `run_cell` from code)
    nests pre/post pairs, which change nothing here. Whatever a cell does, post restores stdout
    and the display hooks."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.pending: list[CellRecord] = []
        self._depth = 0
        self._open = False  # pre ran for the cell post will see (not so for the %load_ext cell)
        self._started = 0.0
        self._outputs: list[str] = []
        self._tee: _Tee | None = None
        self._publish: Any = None
        self._format: Any = None
        shell.events.register("pre_run_cell", self.pre)
        shell.events.register("post_run_cell", self.post)

    def close(self) -> None:
        self._restore()
        for name, fn in (("pre_run_cell", self.pre), ("post_run_cell", self.post)):
            try:
                self.shell.events.unregister(name, fn)
            except ValueError:
                pass

    def pre(self, info: Any = None) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        self._open = True
        self._started = time.perf_counter()
        self._outputs = []
        code = getattr(info, "raw_cell", "") or ""
        if is_own(code):
            return
        self._tee = _Tee(sys.stdout)
        sys.stdout = self._tee
        pub = getattr(self.shell, "display_pub", None)
        if pub is not None and "publish" not in vars(pub):
            original = pub.publish

            def publish(data: Any = None, *args: Any, **kwargs: Any) -> Any:
                if isinstance(data, dict) and len(self._outputs) < MAX_OUTPUTS:
                    self._outputs.append(mime_digest(data))
                return self._muted(original, data, *args, **kwargs)

            pub.publish, self._publish = publish, pub
        hook = getattr(self.shell, "displayhook", None)
        if hook is not None and "compute_format_data" not in vars(hook):
            compute = hook.compute_format_data

            def compute_format_data(result: Any) -> Any:
                out = compute(result)
                if isinstance(out, tuple) and out and isinstance(out[0], dict) and len(self._outputs) < MAX_OUTPUTS:
                    self._outputs.append(mime_digest(out[0]))
                return out

            write = hook.write_format_data

            def write_format_data(*args: Any, **kwargs: Any) -> Any:
                return self._muted(write, *args, **kwargs)

            hook.compute_format_data, hook.write_format_data = compute_format_data, write_format_data
            self._format = hook

    def _muted(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        tee = self._tee
        if tee is not None:
            tee.muted = True
        try:
            return fn(*args, **kwargs)
        finally:
            if tee is not None:
                tee.muted = False

    def _restore(self) -> str:
        printed = ""
        try:
            if self._tee is not None:
                printed = "".join(self._tee.kept)
        finally:
            if self._tee is not None and sys.stdout is self._tee:
                sys.stdout = self._tee.inner
            self._tee = None
            if self._publish is not None:
                vars(self._publish).pop("publish", None)
                self._publish = None
            if self._format is not None:
                vars(self._format).pop("compute_format_data", None)
                vars(self._format).pop("write_format_data", None)
                self._format = None
        return printed

    def post(self, result: Any = None) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth:
            return  # a nested cell: the outer one is recorded
        printed = self._restore()
        opened, self._open = self._open, False
        info = getattr(result, "info", None)
        code = getattr(info, "raw_cell", "") or ""
        if not opened or is_own(code):
            return
        from ..redaction import redact  # a key set or printed in a cell never reaches the store or the model

        exc = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        error = ""
        if exc is not None:
            try:
                message = str(exc).strip().splitlines()
            except Exception:  # an exception whose text cannot be made
                message = []
            error = type(exc).__name__ + (f": {_cut(message[0], 120)}" if message else "")
        outputs = [_cut(printed)] if printed.strip() else []
        outputs += [x for x in self._outputs if x]
        digest = _cut(" · ".join(outputs), DIGEST_CHARS) if outputs else ""
        self.pending.append(CellRecord(
            getattr(result, "execution_count", None), hashlib.sha256(code.encode("utf-8", "replace")).hexdigest()[:8],
            redact(_first_line(code)), redact(error), round(time.perf_counter() - self._started, 3), redact(digest)))

    def take(self) -> list[CellRecord]:
        taken, self.pending = self.pending, []
        return taken


def event_text(records: list[CellRecord]) -> str:
    """One event's text for the cells run since the last chat: a line per cell; past MAX_LINES the
    cells that ran ok are counted, and past MAX_FAILED failures the oldest failures are counted too."""
    failed = [r for r in records if r.error]
    ok = [r for r in records if not r.error]
    if len(records) <= MAX_LINES:
        shown, skipped_ok, skipped_failed = records, [], []
    else:
        kept_failed = failed[-MAX_FAILED:]
        room = max(MAX_LINES - len(kept_failed), 0)
        kept_ok = ok[-room:] if room else []
        keep = {id(r) for r in kept_failed} | {id(r) for r in kept_ok}
        shown = [r for r in records if id(r) in keep]
        skipped_ok = [r for r in ok if id(r) not in keep]
        skipped_failed = [r for r in failed if id(r) not in keep]
    notes = []
    for group, what in ((skipped_ok, "more cells ran ok"), (skipped_failed, "older cells failed")):
        if group:
            counts = [r.count for r in group if r.count is not None]
            notes.append(f"[{len(group)} {what}" + (f" (In [{min(counts)}]–[{max(counts)}])" if counts else "") + "]")
    return HEADER + "\n" + "\n".join([r.line() for r in shown] + notes)


_FAILED = re.compile(r"^In \[(\d+| )\] error (.*?)(?: · [\d.]+ s · #|$)")


def failed_lines(content: str) -> list[str]:
    """The failed cells of a cell-log event, as `cell In [N] failed: ErrorName: message` lines."""
    out = []
    for line in content.splitlines():
        m = _FAILED.match(line)
        if m:
            out.append(f"cell In [{m.group(1)}] failed: {m.group(2)}")
    return out
