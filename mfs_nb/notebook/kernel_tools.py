"""Notebook tools for the model: look at a variable, read a cell's input and output.

They read the kernel's namespace and history; they never execute code the model wrote (there is
no `run_code` tool). A repr that raises or hangs gives a bounded answer within `TIMEOUT_S`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from ..recall.tools import Tool

TIMEOUT_S = 2.0
MAX_REPR = 4_000
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _bounded(fn: Callable[[], str], what: str) -> str:
    """Run fn in a helper thread; give up after TIMEOUT_S. The thread is left to finish alone."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # a user's __repr__ may raise anything
            box["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"

    worker = threading.Thread(target=target, daemon=True, name="mfs-inspect")
    worker.start()
    worker.join(TIMEOUT_S)
    if worker.is_alive():
        return f"[{what} did not finish within {TIMEOUT_S:.0f} s]"
    if "error" in box:
        return f"[{what} raised {box['error']}]"
    text = str(box.get("value", ""))
    return text if len(text) <= MAX_REPR else text[:MAX_REPR] + f"\n[… {len(text) - MAX_REPR:,} more chars]"


def describe(value: Any) -> str:
    """Type, size, shape, dtypes and a bounded head or repr of a value."""
    kind = type(value)
    lines = [f"type: {kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else f"type: {kind.__name__}"]
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        lines.append(f"shape: {tuple(shape) if isinstance(shape, (tuple, list)) else shape}")
    else:
        try:
            lines.append(f"len: {len(value)}")
        except Exception:  # no len: fine
            pass
    dtypes = getattr(value, "dtypes", None)
    if dtypes is not None and not callable(dtypes):
        lines.append("dtypes:\n" + _bounded(lambda: str(dtypes), "dtypes"))
    elif getattr(value, "dtype", None) is not None:
        lines.append(f"dtype: {value.dtype}")
    head = getattr(value, "head", None)
    if callable(head) and dtypes is not None:
        lines.append("head:\n" + _bounded(lambda: head(5).to_string(), "head"))
    else:
        lines.append("repr:\n" + _bounded(lambda: repr(value), "repr"))
    return "\n".join(lines)


def notebook_tools(shell: Any) -> list[Tool]:
    """`inspect_variable` and `cell_output` bound to an IPython shell."""

    def inspect_variable(name: Any = None) -> str:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InputError(f"name must be a plain variable name, not {name!r}")
        namespace = shell.user_ns
        if name not in namespace or name.startswith("_"):
            visible = sorted(k for k in namespace if not k.startswith("_") and k not in ("In", "Out", "exit", "quit",
                                                                                         "get_ipython"))
            listing = ", ".join(visible[:30]) + (" …" if len(visible) > 30 else "")
            raise InputError(f"no variable named {name!r} in the notebook; variables: {listing or 'none'}")
        return f"{name}\n" + describe(namespace[name])

    def cell_output(n: Any = None) -> str:
        if isinstance(n, bool) or not isinstance(n, (int, str)) or not str(n).strip().isdigit():
            raise InputError(f"n must be an execution count (a whole number), not {n!r}")
        n = int(n)
        inputs = shell.user_ns.get("In") or []
        if not 0 < n < len(inputs):
            raise InputError(f"no cell [{n}]; execution counts so far: 1-{max(len(inputs) - 1, 0)}")
        out = shell.user_ns.get("Out", {})
        text = f"In [{n}]:\n{inputs[n]}"
        if n in out:
            text += f"\n\nOut[{n}]:\n" + _bounded(lambda: repr(out[n]), "repr")
        else:
            text += f"\n\n(cell [{n}] has no output value; printed output is not kept by IPython)"
        return text

    return [
        Tool("inspect_variable", "Look at a variable of the user's notebook: its type, shape, dtypes and a "
             "bounded head or repr. Reads only; runs no code.",
             {"type": "object", "properties": {"name": {"type": "string", "description": "variable name"}},
              "required": ["name"]}, inspect_variable),
        Tool("cell_output", "The input code and output value of the notebook cell with execution count n.",
             {"type": "object", "properties": {"n": {"type": "integer", "description": "execution count"}},
              "required": ["n"]}, cell_output),
    ]
