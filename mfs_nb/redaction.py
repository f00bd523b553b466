"""Keys out of every text that may be shown or stored: the values of the environment's key-like
variables, and anything shaped like an `sk-…` key. Pure (it reads the environment, nothing else), so
the knowledge slot, the cell log and the export use it without the model client."""

from __future__ import annotations

import os
import re


def _secrets() -> list[str]:
    return [v for k, v in os.environ.items() if re.search(r"KEY|TOKEN|SECRET|PASSWORD", k) and len(v) >= 8]


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """Remove every key we know of from a text that may be shown or stored."""
    for secret in (*_secrets(), *extra):
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"\b(sk-[A-Za-z0-9_-]{6})[A-Za-z0-9_-]{6,}", r"\1***", text)
