"""mfs_nb: a notebook-native memory layer for long LLM conversations.

`%load_ext mfs_nb` registers the magics; `from mfs_nb import Session` drives the same engine
from Python. Importing this package is cheap: litellm and LanceDB load on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# litellm reaches for the network at import unless told to read its model map locally; whoever
# imports it after this package (our boundary or the user) gets the offline-safe behaviour.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from .errors import ConfigError, InputError, LLMError, MfsError, PromptTooLong, StoreError
from .settings import VERSION
from .window.tokens import estimate_tokens

__version__ = VERSION

if TYPE_CHECKING:
    from .events import Event
    from .layers.view import Layer, SendView
    from .session import Reply, Session

__all__ = [
    "ConfigError", "Event", "InputError", "LLMError", "Layer", "MfsError", "PromptTooLong", "Reply",
    "SendView", "Session", "StoreError", "estimate_tokens", "load_ipython_extension",
    "unload_ipython_extension",
]

_LAZY = {"Session": "session", "Reply": "session", "Event": "events", "Layer": "layers.view", "SendView": "layers.view"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)


def empty_chat_body(lines: list[str]) -> list[str]:
    """An input transformer: a `%%chat` cell with nothing under its first line gets a blank body.

    IPython itself refuses an empty cell-magic body with a `UsageError` before the magic runs, which
    stops Run All; with a blank body `%%chat` answers with its own one `mfs:` line instead."""
    if lines and lines[0].lstrip().startswith("%%chat") and not "".join(lines[1:]).strip():
        return [lines[0].rstrip("\n") + "\n", " \n"]
    return lines


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext mfs_nb`: register the magics; litellm, LanceDB and the embedder warm up off the cell."""
    from .layers.cells import CellLog
    from .notebook import warm
    from .notebook.magics import MfsMagics

    magics = MfsMagics(ipython)
    ipython.register_magics(magics)
    cleanup = getattr(ipython, "input_transformers_cleanup", None)
    if cleanup is not None and empty_chat_body not in cleanup:
        cleanup.append(empty_chat_body)  # IPython refuses an empty cell magic body with a UsageError
    if getattr(ipython, "events", None) is not None:
        magics.cells = CellLog(ipython)  # executed code cells join the session at the next %%chat
    # store libraries, the model client and the embedding gate load in a background thread
    magics.warmup = warm.start()


def unload_ipython_extension(ipython: Any) -> None:
    """State lives in the store; only the cell log's hooks and the input transformer come off the shell."""
    cleanup = getattr(ipython, "input_transformers_cleanup", None)
    if cleanup is not None and empty_chat_body in cleanup:
        cleanup.remove(empty_chat_body)
    magics = getattr(ipython, "magics_manager", None) and ipython.magics_manager.registry.get("MfsMagics")
    if magics is not None and getattr(magics, "cells", None) is not None:
        magics.cells.close()
        magics.cells = None
