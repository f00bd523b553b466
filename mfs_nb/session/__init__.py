"""The orchestrator (docs/architecture.md, "One turn"): one `Session` wires a turn through log, projection and model.

Everything the magics, the CLI and the benchmarks do goes through this class. The memory
logic stays in pure modules (`view`, `tokens`, `usage`); this file owns the order of steps,
persistence of each event the moment it exists, and the tool loop.

The class is built in layers, one module each: `base` (the log, settings, clients, saved state),
`projection` (the payload and its pressure), `planner` (before and around a model call), `intake`
(a user's message and its channel), `memory` (recall, search, export, knowledge, maintenance, fork)
and `turn` (construction and one turn); `parts` holds what they share.
"""

from __future__ import annotations

from .parts import (
    DEFAULT_WINDOW,
    MAX_MESSAGE_SHARE,
    QUIET_KEEP_S,
    CallPlan,
    ChatModel,
    Reply,
    flush_at_exit,
    shared_prefix_tokens,
    system_prompt,
    valid_session_name,
)
from .turn import Session

__all__ = ["DEFAULT_WINDOW", "MAX_MESSAGE_SHARE", "QUIET_KEEP_S", "CallPlan", "ChatModel", "Reply", "Session", "flush_at_exit",
           "shared_prefix_tokens", "system_prompt", "valid_session_name"]
