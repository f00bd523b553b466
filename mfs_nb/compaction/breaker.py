"""The circuit breaker over summarizer failures (the compactor's; see the `compaction` package).

After `threshold` failures in a row automatic LLM compaction stops and history is kept with
zero-LLM segments. After a cool-down, or on the user's %compact, the model gets one try
(half-open); a usable summary closes the breaker. The state is saved with the session through
`Host.save_breaker` and restored from `Host.load_breaker`. The cool-down is passed in by the
caller (`compaction.limits.BREAKER_COOLDOWN_S`), read when it is used.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..host import Host


class Breaker:
    """Open, closed or half-open, with the failures that led there; saved with the session."""

    def __init__(self, host: Host, threshold: int):
        self.host = host
        self.threshold = threshold
        self.failures = 0
        self.open = False
        self.half_open = False
        self.opened_at = 0.0
        self.restore()

    def failed(self) -> bool:
        """Count a summarizer failure; True when this one opened the breaker. A failed half-open
        try re-opens it for another cool-down. The state is saved with the session."""
        self.failures += 1
        if self.half_open:
            self.half_open = False
            self.opened_at = time.time()
            self.host.log("breaker_open", failures=self.failures, half_open_try=True)
            self.save()
            return False
        if self.failures >= self.threshold and not self.open:
            self.open = True
            self.opened_at = time.time()
            self.host.log("breaker_open", failures=self.failures)
            self.save()
            return True
        self.save()
        return False

    def succeeded(self) -> None:
        """A usable summary: the count restarts and an open breaker closes."""
        was_open, self.failures = self.open, 0
        self.open = self.half_open = False
        if was_open:
            self.host.log("breaker_closed")
        self.save()

    def may_try(self, cooldown_s: float) -> bool:
        """Half-open: after the cool-down, or on the user's %compact, the model gets one try."""
        if not self.half_open and time.time() - self.opened_at >= cooldown_s:
            self.half_open = True
        return self.half_open

    def state(self) -> dict[str, Any]:
        return {"failures": self.failures, "open": self.open, "opened_at": self.opened_at}

    def line(self, cooldown_s: float) -> str:
        """For %mfs status: where the breaker stands and what to do."""
        if not self.open:
            return f"circuit breaker closed ({self.failures} summarizer failure{'s' if self.failures != 1 else ''} in a row)"
        wait = max(0, int(cooldown_s - (time.time() - self.opened_at)))
        return (f"circuit breaker open after {self.failures} summarizer failures: automatic LLM compaction is off; "
                f"fix the model, then %compact (tries it once), or wait {wait}s for one automatic try")

    def save(self) -> None:
        state = self.state()
        if self.host.load_breaker() != state:
            try:
                self.host.save_breaker(state)
            except Exception:  # the breaker is advisory; a failed save only forgets it
                pass

    def restore(self) -> None:
        state = self.host.load_breaker() or {}
        try:
            self.failures = max(0, int(state.get("failures", 0)))
            self.open = bool(state.get("open", False))
            self.opened_at = float(state.get("opened_at", 0.0))
        except (TypeError, ValueError, AttributeError):
            self.failures, self.open, self.opened_at = 0, False, 0.0
