"""Table maintenance at quiet moments (issue 19).

Every write to a LanceDB table is a version and, until the table is folded, a fragment of its own.
Turns fold the tables they write now and then (`Store._fold`), keeping the versions of the last
seconds for readers in other kernels; what a busy stretch leaves behind (the versions and loose
fragments of its last seconds, the tables no fold reached, what the recall index wrote after the
last turn) is folded when the session has been quiet for `quiet_maintenance_s` seconds, by one
background thread per session at the lowest priority. A turn that starts meanwhile stops it
between two tables, so it waits for at most one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

RERUNS = 3  # the most runs a work may ask for after the first of a quiet stretch


class Quiet:
    """Runs `work(stop)` once after each stretch of turns, when none has started for `quiet_s()`
    seconds; `stop()` tells the work that a turn is waiting. A work that returns a number of seconds
    runs once more after that long, if nothing has started the clock again meanwhile, and so on up to
    `RERUNS` times in a stretch (other writers to the store could keep a work asking forever)."""

    def __init__(self, work: Callable[[Callable[[], bool]], Any], quiet_s: Callable[[], float], name: str = ""):
        self._work = work
        self._quiet_s = quiet_s
        self._name = name
        self._last = time.monotonic()
        self._due = False  # a turn ended since the last run
        self._turns = 0  # turns started (a run stops when this moves)
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.runs = 0
        self._again = False  # the run now due is one the work asked for
        self._reruns = 0  # runs the work asked for in this quiet stretch

    def turn_started(self) -> None:
        with self._lock:
            self._turns += 1

    def turn_ended(self) -> None:
        """After a turn (whatever its outcome) or a background write (the recall index): start the
        clock again, and the thread if needed."""
        if self._quiet_s() <= 0 or self._closed:
            return
        with self._lock:
            self._last, self._due, self._again, self._reruns = time.monotonic(), True, False, 0
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, daemon=True, name=f"mfs-quiet-{self._name}")
                self._thread.start()

    def _loop(self) -> None:
        from ..recall.pacing import lower_priority

        lower_priority()
        while True:
            quiet = self._quiet_s()
            with self._lock:
                if quiet <= 0 or not self._due or self._closed:
                    self._thread = None
                    return
                left = self._last + quiet - time.monotonic()
                if left <= 0:
                    self._due = False
                    turns = self._turns
                    self._reruns += self._again
                self._wake.clear()
            if left > 0:
                self._wake.wait(left)
                continue
            again = None
            try:
                again = self._work(lambda started=turns: self._closed or self._turns != started)
            except Exception:  # maintenance is an optimisation; the work logs what it did
                pass
            self.runs += 1
            with self._lock:
                # the work asks to run once more after `again` seconds, unless a turn came or comes first,
                # or it has asked RERUNS times in this stretch already
                self._again = (bool(again) and self._reruns < RERUNS and not self._due and not self._closed
                               and self._turns == turns)
                if self._again:
                    self._due, self._last = True, time.monotonic() + float(again or 0) - quiet

    def close(self, wait_s: float = 0.0) -> None:
        """No more runs; one under way stops between two tables, waited for up to `wait_s`."""
        with self._lock:
            self._closed, self._due = True, False
            self._wake.set()
            thread = self._thread
        if wait_s and thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)

    def settled(self) -> bool:
        """Nothing written since the last fold, and no fold waiting or under way."""
        with self._lock:
            return not self._due and (self._thread is None or not self._thread.is_alive())
