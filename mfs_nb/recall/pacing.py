"""How the background indexer shares the machine with the notebook (docs/architecture.md, "Recall"): it
embeds on one core at the lowest priority while the session is in use and on all of them once nothing has
happened for a while, waits while a turn or a search runs, and writes the rows it holds right after one
ends — the furthest from the next one."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..models import offprocess
from ..models.embed import limit_this_thread
from .searcher import last_search, searching

if TYPE_CHECKING:
    from ..host import Host

BACKGROUND_CORE = threading.Lock()  # held by a background indexer while it embeds (`Pacing.core`)
SHADOW_S = 0.15  # "right after a turn ended"
IDLE_GRACE_S = 0.1  # after a turn, wait this long before indexing again
IDLE_CORES_S = 2.0  # no turn, write or search for this long: the background indexer embeds on every core


class Pacing:
    """One indexer's pacing: `background()` says whether the calling thread is the indexer's own (only it
    waits and yields), `stopped()` whether the indexer is closing."""

    def __init__(self, host: Host, background: Callable[[], bool], stopped: Callable[[], bool]):
        self.host, self.background, self.stopped = host, background, stopped
        self.active_at = time.monotonic()  # the last turn, write or search the background thread saw
        self.threads = 0  # the encoder threads the background thread is set to (0: not set yet)
        self.resumed_at = 0.0  # when the background thread last went on after waiting for a turn

    def touch(self) -> None:
        """Something happened (a turn, a write): the machine is in use."""
        self.active_at = time.monotonic()

    @contextlib.contextmanager
    def core(self) -> Iterator[None]:
        """The background core: the indexers of every session of this process (a server holds many)
        embed one at a time between them, each on one thread, so the rest of the machine stays free;
        their passes run in the encoder process (`offprocess`), which turns and searches stop."""
        if not self.background():
            yield
            return
        with BACKGROUND_CORE, offprocess.routed():
            yield

    def yield_to_turn(self, limit_s: float = 60.0) -> None:
        """Wait while the session is busy (a turn holds its lock) or a search runs in this process (a
        server's request, another session's tool call), and a little after: embedding and writes compete
        with them for the cores, the interpreter, the caches and the store. Only the background thread waits."""
        if not self.background():
            return

        def busy() -> bool:
            return self.host.busy() or searching()

        end = time.monotonic() + limit_s
        waited = False
        while time.monotonic() < end and not self.stopped():
            if not busy():
                if not waited:
                    return
                time.sleep(IDLE_GRACE_S)  # the next turn of a loop of turns usually starts right away
                if not busy():
                    self.resumed_at = time.monotonic()
                    return
            waited = True
            self.active_at = time.monotonic()
            time.sleep(0.02)

    def time_to_write(self) -> bool:
        """Whether the background thread writes the rows it holds now: right after a turn or a search
        ended (the next one is furthest away) — within `SHADOW_S` of its end, or of this thread going
        on after waiting for it (`yield_to_turn` goes on `IDLE_GRACE_S` after the end) — or once none
        has come for `IDLE_CORES_S` (a person reading, a history left to index). Any other thread
        writes at once."""
        if not self.background():
            return True
        now = time.monotonic()
        since = now - max(self.host.turn_ended(), last_search())
        return since < SHADOW_S or now - self.resumed_at < SHADOW_S or since >= IDLE_CORES_S

    def set_threads(self) -> None:
        """The background thread embeds on one core while the session is in use, so a turn or a
        search keeps the others; once nothing has happened for `IDLE_CORES_S` (a person reading, an
        imported history left to index), on all of them. A turn that starts then waits for one text."""
        if not self.background():
            return
        quiet = time.monotonic() - max(self.active_at, last_search()) >= IDLE_CORES_S and not searching()
        want = cores() if quiet else 1
        if want != self.threads:
            limit_this_thread(want)
            self.threads = want
        offprocess.ENCODER.threads = want  # every time: one child serves every session, each with its own count


def cores() -> int:
    """The cores this process may run on (its affinity where the OS tells, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def lower_priority() -> None:
    """Run this thread (and the threads it starts) at the lowest CPU priority, where the OS allows."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per thread
    except (AttributeError, OSError):
        pass
