"""Warm-up off the cell (issue 17): at `%load_ext` a daemon thread imports the store's libraries,
the model client (litellm) and settles the embedding gate's verdict, so no cell waits on them
unless it needs them before they are ready — and then it says what it is waiting for.

`MFS_WARM=0` turns the thread off (the test suite does, for determinism); everything still loads
lazily on first use.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..settings import warm_up_enabled

STAGES = ("store", "model client", "embedder")
LABELS = {"store": "opening the store", "model client": "loading the model client",
          "embedder": "checking the embedding model"}


class Warmup:
    """One background warm-up: which stage is running, what each took, and any error (never raised)."""

    def __init__(self, embedding_model: str = "auto"):
        self.embedding_model = embedding_model
        self.done: dict[str, threading.Event] = {s: threading.Event() for s in STAGES}
        self.seconds: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.stage: str | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> Warmup:
        self.thread = threading.Thread(target=self._run, daemon=True, name="mfs-warm")
        self.thread.start()
        return self

    def _run(self) -> None:
        for stage in STAGES:
            self.stage = stage
            started = time.perf_counter()
            try:
                _STEPS[stage](self)
            except Exception as exc:  # a warm-up failure only means the first use loads it itself
                self.errors[stage] = f"{type(exc).__name__}: {exc}"
            self.seconds[stage] = round(time.perf_counter() - started, 3)
            self.done[stage].set()
        self.stage = None

    def ready(self, stage: str) -> bool:
        return self.done[stage].is_set()

    def wait(self, stage: str, timeout: float | None = None) -> bool:
        return self.done[stage].wait(timeout)


def _store(_: Warmup) -> None:
    from .. import session, store  # noqa: F401
    from ..window.tokens import exact_counter

    store.lancedb_module()  # the import is what takes the time
    exact_counter("o200k_base")  # the offline default counts usage with it: load its table now


def _model_client(_: Warmup) -> None:
    """Import litellm ahead of the first call only for a configured real model, and only when asked
    (MFS_WARM_MODEL_CLIENT=1): importing it in a thread while the notebook's thread collects one of
    its half-built HTTP clients deadlocked on the import lock (seen in `mfs-nb bench ux`). The
    offline default never needs it."""

    from ..models.llm import is_offline, litellm_module
    from ..settings import OFFLINE_MODEL

    if os.environ.get("MFS_WARM_MODEL_CLIENT") == "1" and not is_offline(os.environ.get("MFS_MODEL") or OFFLINE_MODEL):
        litellm_module()


def _embedder(w: Warmup) -> None:
    if w.embedding_model != "off":
        from ..layers.track import warm_gate

        warm_gate(w.embedding_model)


_STEPS: dict[str, Any] = {"store": _store, "model client": _model_client, "embedder": _embedder}


def start(embedding_model: str | None = None) -> Warmup | None:
    """Start the warm-up thread (unless MFS_WARM=0)."""
    if not warm_up_enabled():
        return None
    if embedding_model is None:
        try:
            from ..settings import Settings, from_environment

            embedding_model = Settings().with_values(**from_environment()).embedding_model
        except Exception:
            embedding_model = "auto"
    return Warmup(embedding_model).start()
