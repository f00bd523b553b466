"""The litellm boundary against fake OpenAI-compatible servers on loopback: fallback, usage, keys."""

from __future__ import annotations

import socket
import threading

import pytest
from fake_provider import FakeProvider

from mfs_nb import LLMError, Session
from mfs_nb.models.failures import parse_token_gap
from mfs_nb.models.llm import LLM, Endpoint
from mfs_nb.redaction import redact


@pytest.fixture
def servers():
    made: list[FakeProvider] = []

    def make(mode: str = "ok", **kw) -> FakeProvider:
        p = FakeProvider(mode, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _llm(primary: FakeProvider | str, fallback: FakeProvider | None, timeout_s: float = 10) -> LLM:
    url = primary if isinstance(primary, str) else primary.url
    return LLM(Endpoint("openai/model-a", url, "key-a", "primary"),
               Endpoint("openai/model-b", fallback.url, "key-b", "fallback") if fallback else None,
               timeout_s=timeout_s)


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("stream", [True, False])
def test_ok_primary_streams_and_captures_usage(servers, stream):
    a = servers("ok", reply="one two three")
    deltas: list[str] = []
    result = _llm(a, None).complete([{"role": "user", "content": "hi"}], stream=stream, on_delta=deltas.append)
    assert result.text == "one two three" and result.endpoint == "primary"
    assert result.usage == {"prompt_tokens": 42, "completion_tokens": 4, "cached_tokens": 40, "cache_write_tokens": 0}
    assert a.hits[0]["path"] == "/v1/chat/completions" and a.hits[0]["model"] == "model-a"
    if stream:
        assert "".join(deltas) == "one two three" and a.hits[0]["stream"] is True
        assert a.hits[0]["body"]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("mode, stream", [
    (mode, stream) for mode in ("500", "429", "slow", "refused") for stream in (True, False)
] + [("drop", True)])
def test_transport_failures_switch_to_fallback(servers, mode, stream):
    a = None if mode == "refused" else servers(mode)
    b = servers("ok", reply="from backup")
    llm = _llm(a or _closed_port_url(), b, timeout_s=1)
    resets: list[int] = []
    result = llm.complete([{"role": "user", "content": "hi"}], stream=stream, on_reset=lambda: resets.append(1))
    assert result.text == "from backup" and result.endpoint == "fallback"
    assert [h["model"] for h in b.hits] == ["model-b"]
    if a is not None:
        assert [h["model"] for h in a.hits] == ["model-a"]
    assert llm.state == "fallback" and "primary" in llm.last_switch_reason
    assert resets == [1]
    # the next call goes straight to the fallback
    llm.complete([{"role": "user", "content": "again"}], stream=stream)
    assert len(b.hits) == 2 and (a is None or len(a.hits) == 1)


def test_client_errors_do_not_switch(servers):
    a, b = servers("400"), servers("ok")
    llm = _llm(a, b)
    with pytest.raises(LLMError, match="400") as info:
        llm.complete([{"role": "user", "content": "hi"}])
    assert "\n" not in str(info.value)
    assert b.hits == [] and llm.state == "primary"


def test_both_failing_is_one_clear_error(servers):
    a, b = servers("500"), servers("429")
    with pytest.raises(LLMError, match="primary and fallback endpoints failed"):
        _llm(a, b).complete([{"role": "user", "content": "hi"}])


def test_switch_is_thread_safe(servers):
    a, b = servers("500"), servers("ok")
    llm = _llm(a, b)
    results: list[str] = []

    def call() -> None:
        results.append(llm.complete([{"role": "user", "content": "hi"}], stream=True).endpoint)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["fallback"] * 8
    assert llm.switches == 1 and llm.state == "fallback"


def test_primary_is_retried_after_the_cool_down(servers):
    a, b = servers("500"), servers("ok")
    llm = _llm(a, b)
    llm.retry_primary_after_s = 0
    llm.complete([{"role": "user", "content": "hi"}])
    a.mode = "ok"
    assert llm.complete([{"role": "user", "content": "hi"}]).endpoint == "primary"
    assert llm.state == "primary"


def test_status_says_whether_a_key_is_sent_and_from_where(monkeypatch):
    """Issue 71, item 4: a key that did not survive a restart is not silent."""
    from mfs_nb.models.llm import Endpoint, key_status

    monkeypatch.delenv("MFS_API_KEY", raising=False)
    local = Endpoint("openai/m", "http://127.0.0.1:8000/v1", key_env="MFS_API_KEY")
    assert key_status(local).startswith("key: none (fine for a local server)")
    assert "MFS_API_KEY" in key_status(local)
    monkeypatch.setenv("MFS_API_KEY", "sk-live-abcdef-123456")
    assert key_status(local) == "key: sent, from MFS_API_KEY"
    assert key_status(Endpoint("mfs-offline/default")) == "key: none needed (the embedded offline model)"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert key_status(Endpoint("openai/gpt-4o-mini")).startswith("key: none: OPENAI_API_KEY is not set")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-abcdef")
    assert key_status(Endpoint("openai/gpt-4o-mini")) == "key: sent, from OPENAI_API_KEY"
    assert "sk-" not in key_status(Endpoint("openai/gpt-4o-mini", api_key="sk-given-in-code"))


def test_session_uses_real_endpoints_and_shows_state(servers, store_dir, monkeypatch):
    a, b = servers("429"), servers("ok", reply="backup answer")
    monkeypatch.setenv("MFS_FALLBACK_API_KEY", "sk-fallback-secret-123456")
    monkeypatch.setenv("MFS_API_KEY", "sk-primary-secret-123456")
    s = Session("net", store=store_dir, model="openai/model-a", api_base=a.url, window_tokens=8000)
    s.configure(fallback_model="openai/model-b", fallback_base_url=b.url)
    reply = s.chat("hello")
    assert reply.text == "backup answer" and reply.endpoint == "fallback"
    assert "(the fallback, until the primary" in s.status()["endpoint"] and "429" in s.status()["endpoint"]
    # issue 71, item 4: which key goes with the endpoint in force, named by its variable, never its value
    assert "key: sent, from MFS_FALLBACK_API_KEY" in s.status()["endpoint"]
    assert "secret" not in s.status()["endpoint"]
    assert a.hits[0]["auth"] == "Bearer sk-primary-secret-123456"
    assert b.hits[0]["auth"] == "Bearer sk-fallback-secret-123456"
    assert s.usage().source == "anchor+estimate"
    assert s.usage().cache_ratio == pytest.approx(40 / 42)


def test_missing_key_is_a_clear_error_before_anything_is_sent(store_dir, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    s = Session("nokey", store=store_dir, model="gpt-4o-mini")
    with pytest.raises(Exception, match="OPENAI_API_KEY") as info:
        s.chat("hello")
    assert "\n" not in str(info.value)
    assert s.events == []


def test_redaction_and_gap_parsing(monkeypatch):
    monkeypatch.setenv("SOME_API_KEY", "supersecretvalue123")
    assert "supersecretvalue123" not in redact("auth failed for supersecretvalue123")
    assert "sk-abcdef***" in redact("key sk-abcdefghijklmnopqrstuvwxyz rejected")
    assert parse_token_gap("This model's maximum context length is 8192 tokens. However, your messages "
                           "resulted in 9000 tokens.") == 808
    assert parse_token_gap("prompt is too long: 210000 tokens > 200000 maximum") == 10000
    assert parse_token_gap("nothing here") is None
