"""Access to the shared conversation data, through the `loaders.py` that ships beside it.

The data is never copied into this repository; a benchmark takes its directory as an argument.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_DIRS = ("../shared/data", "../../shared/data")


def find_data(explicit: str | None) -> Path | None:
    """The data directory: the argument, else `../shared/data` when it exists."""
    candidates = [explicit] if explicit else list(DEFAULT_DIRS)
    for c in candidates:
        if c and (Path(c) / "loaders.py").is_file():
            return Path(c).resolve()
    return None


class Data:
    """Lazily loaded data sets of one data directory."""

    def __init__(self, root: Path):
        self.root = root
        spec = importlib.util.spec_from_file_location("mfs_bench_loaders", root / "loaders.py")
        if spec is None or spec.loader is None:
            raise FileNotFoundError(root / "loaders.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.loaders: ModuleType = module
        self._cache: dict[str, Any] = {}

    def has(self, name: str) -> bool:
        if not hasattr(self.loaders, name):
            return False
        try:
            self.get(name)
        except (OSError, ValueError, KeyError):
            return False
        return True

    def get(self, name: str) -> list[dict[str, Any]]:
        if name not in self._cache:
            self._cache[name] = getattr(self.loaders, name)()
        return self._cache[name]


def to_openai(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Loader messages → OpenAI format. Coding-agent `[tool_use NAME] {json}` lines become tool
    calls and the following tool messages their results, so tool pairing is real."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    n = 0
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and content.startswith("[tool_use "):
            name, _, args = content[len("[tool_use "):].partition("] ")
            n += 1
            call_id = f"call_{n}"
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args or "{}"}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and pending:
                out[-1]["tool_calls"].append(call)  # parallel calls of one round
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                pending = []
            pending.append(call_id)
            continue
        if role == "tool":
            call_id = pending.pop(0) if pending else ""
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
            continue
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                n += 1
                args = tc.get("arguments", "")
                calls.append({"id": f"call_{n}", "type": "function",
                              "function": {"name": tc.get("name", ""),
                                           "arguments": args if isinstance(args, str) else json.dumps(args)}})
            out.append({"role": "assistant", "content": content, "tool_calls": calls})
            pending = [str(c["id"]) for c in calls]
            continue
        pending = []
        out.append({"role": role, "content": content})
    return out
