"""Helpers for tests that start a server on 127.0.0.1 in a child process."""

from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen, wait_s: float) -> None:
    """Terminate, and kill what has not exited after `wait_s`."""
    process.terminate()
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
