"""What every part of the session shares: its numbers, the reply and call-plan records, the model
protocol, the system prompt, and the exit hook that writes the call rows still waiting."""

from __future__ import annotations

import atexit
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol

from ..layers.view import SendView
from ..models.llm import Completion, is_offline, model_window
from ..settings import Settings
from ..window.tokens import estimate_tokens
from ..window.usage import ContextProfile, Usage

DEFAULT_WINDOW = 128_000
SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def valid_session_name(name: Any) -> bool:
    """1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""
    return isinstance(name, str) and bool(SESSION_NAME.match(name))


# A single message may take at most this share of the effective window; more cannot be sent.
MAX_MESSAGE_SHARE = 0.5
# Another kernel appending to the same session makes our uid stale; we reload and retry.
WRITE_ATTEMPTS = 20
PTL_TRIES = 3
HISTORY = 2_000  # calls kept for the ledger plot
CALLS_BATCH = 20  # history rows written together; the rest at the interpreter's exit (a crash loses at most these)
KNOWLEDGE_TOOLS = ("remember", "forget")
NOTEBOOK_TOOLS = ("inspect_variable", "cell_output")  # registered by the notebook (notebook/tools.py)
QUIET_KEEP_S = 30.0  # versions the quiet-moment fold keeps, for a read under way in another kernel


class ChatModel(Protocol):
    """What a Session needs from a model client (the real one is `llm.LLM`; tests pass fakes)."""

    def complete(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                 stream: bool = True, on_delta: Callable[[str], None] | None = None,
                 on_reset: Callable[[], None] | None = None) -> Completion: ...


@dataclass
class Reply:
    """The answer to one `chat` call."""

    text: str
    usage: Usage
    provider_usage: dict[str, int] | None
    notices: list[str] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)
    endpoint: str = "primary"

    def _repr_markdown_(self) -> str:
        return f"{self.text}\n\n`{self.usage.status_line()}`"


@dataclass
class CallPlan:
    """What the memory layer decided before one model call: the payload and its pressure."""

    view: SendView
    usage: Usage
    notices: list[str]


def profile_for(window: int, settings: Settings) -> ContextProfile:
    return ContextProfile(window, warn=settings.warn_at, compress=settings.compress_at,
                          hard=settings.hard_at)


def window_for(settings: Settings) -> int:
    if settings.window_tokens:
        return settings.window_tokens
    return (None if is_offline(settings.model) else model_window(settings.model)) or DEFAULT_WINDOW


def system_prompt(extra: str = "") -> str:
    base = resources.files("mfs_nb").joinpath("prompts/system.md").read_text(encoding="utf-8").strip()
    return base + ("\n\n" + extra.strip() if extra.strip() else "")


@lru_cache(maxsize=8)
def text_tokens(text: str) -> int:
    """`estimate_tokens`, remembered: the tool schemas are measured on every call and rarely change."""
    return estimate_tokens(text)


LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # every open Session (its call rows are flushed at exit)


_EXIT_HOOK: list[bool] = []


def flush_at_exit(wait_s: float = 1.0) -> None:
    """Write the call rows every live session still holds, after its background indexer stopped and a
    fold of its log under way ended (up to `wait_s` each). Not from a garbage-collection finalizer (it
    can run inside a store write of the same thread and wait for its own lock); a store another thread
    holds for `wait_s` is left alone, so a background write never hangs the exit."""
    for session in list(LIVE):
        try:
            # the background indexer stops, and a write of it under way ends, before LanceDB's runtime does
            # (a server that exits mid-backlog crashed in LanceDB's threads: one exit in three of `bench mcp --quick`)
            session.indexer.close(wait_s)
            session.store.settle(wait_s)  # so does a fold of the log under way
            session._flush_calls(timeout=wait_s)
        except Exception:  # the rows are a chart's, never a message
            pass


def register_exit_flush() -> None:
    """Once, after LanceDB is loaded: exit hooks run last-registered first, so this one writes while
    LanceDB's own runtime is still up (registered at import, it ran after it and crashed the exit)."""
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(True)
        atexit.register(flush_at_exit)


def shared_prefix_tokens(before: list[dict[str, Any]], after: list[dict[str, Any]],
                         count: Callable[[int], int]) -> int:
    """Tokens of the longest common prefix of two payloads (whole messages, then characters)."""
    shared = 0
    for i, (a, b) in enumerate(zip(before, after)):
        if a is b or a == b:
            shared += count(i)
            continue
        if a.get("role") == b.get("role"):
            x, y = a.get("content") or "", b.get("content") or ""
            n = 0
            limit = min(len(x), len(y))
            while n < limit and x[n] == y[n]:
                n += 1
            shared += estimate_tokens(x[:n])
        break
    return shared
