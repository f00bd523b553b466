"""Suite `recall_speed`: search latency and index cost at 1k/10k/100k events, and chat-turn time
with and without background indexing (see `recall` for the method)."""

from __future__ import annotations

from .recallbench import run_speed as run

NAME = "recall_speed"
NEEDS = ("locomo",)
__all__ = ["NAME", "NEEDS", "run"]
