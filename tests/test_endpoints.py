"""Keys go only where they belong; endpoint failures (empty/malformed 200s, connection errors) are
clear, fall back, and leave a ledger row; the summarizer's health is its own. Loopback servers only."""

from __future__ import annotations

import socket

import pytest
from fake_provider import FakeProvider

from mfs_nb import LLMError, Session

PROVIDER_KEYS = {"OPENAI_API_KEY": "sk-openai-provider-secret-0001", "ANTHROPIC_API_KEY": "sk-ant-provider-secret-0002",
                 "GEMINI_API_KEY": "gemini-provider-secret-0003"}


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


@pytest.fixture
def provider_keys(monkeypatch):
    for k, v in PROVIDER_KEYS.items():
        monkeypatch.setenv(k, v)
    return PROVIDER_KEYS


def _leaks(hits: list[dict], secrets) -> list[str]:
    return [f"{h['path']} {name}" for h in hits for name, value in h["headers"].items()
            for secret in secrets if secret in value]


def test_custom_endpoint_never_gets_a_provider_key(servers, provider_keys, monkeypatch, store_dir):
    a = servers("ok", reply="from the custom endpoint")
    b = servers("ok", reply="from the fallback endpoint")
    s = Session("keys", store=store_dir, model="openai/local-model", api_base=a.url, window_tokens=8000)
    assert s.chat("hello").text == "from the custom endpoint"
    assert a.hits[-1]["auth"] == "Bearer mfs-no-key"  # no key configured for it: none of the user's keys
    # MFS_API_KEY exported after configuration is read at call time
    monkeypatch.setenv("MFS_API_KEY", "sk-custom-endpoint-key-77")
    s.chat("again")
    assert a.hits[-1]["auth"] == "Bearer sk-custom-endpoint-key-77"
    # the fallback gets MFS_FALLBACK_API_KEY or nothing — never MFS_API_KEY nor a provider key
    s.configure(fallback_model="openai/other", fallback_base_url=b.url)
    a.mode = "500"
    assert s.chat("third").text == "from the fallback endpoint"
    assert b.hits[-1]["auth"] == "Bearer mfs-no-key"
    a.mode = "ok"
    s.compact()  # the summarizer goes to the same custom endpoint
    assert any(h["body"]["messages"][-1]["content"].startswith("<<mfs:summarize>>") for h in a.hits + b.hits)
    assert _leaks(a.hits + b.hits, provider_keys.values()) == []
    assert _leaks(b.hits, ["sk-custom-endpoint-key-77"]) == []
    assert len(a.hits) >= 4


def test_connection_error_is_never_an_http_status(store_dir, provider_keys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = Session("conn", store=store_dir, model="openai/m", api_base=f"http://127.0.0.1:{port}/v1", window_tokens=8000,
                timeout_s=5)
    with pytest.raises(LLMError) as info:
        s.chat("hello")
    text = str(info.value)
    assert "connection error" in text and "HTTP 500" not in text and "OPENAI_API_KEY" not in text
    assert not any(v in text for v in provider_keys.values())


def test_a_rejected_key_names_the_right_variable(servers, store_dir):
    a = servers("401")
    s = Session("k401", store=store_dir, model="openai/m", api_base=a.url, window_tokens=8000)
    with pytest.raises(LLMError, match="MFS_API_KEY") as info:
        s.chat("hello")
    assert "OPENAI_API_KEY" not in str(info.value)


@pytest.mark.parametrize("mode", ["empty", "null", "garbage"])
def test_empty_or_malformed_200_falls_back_with_a_ledger_row(servers, store_dir, mode):
    a, b = servers(mode), servers("ok", reply="backup answer")
    s = Session("e200", store=store_dir, model="openai/m", api_base=a.url, window_tokens=8000,
                fallback_model="openai/n", fallback_base_url=b.url)
    for stream in (True, False):
        reply = s.chat(f"hello {stream}", stream=stream)
        assert reply.text == "backup answer" and reply.endpoint == "fallback"
        s._llm = None  # a fresh client tries the primary first again
    rows = [r for r in s.ledger() if r["kind"] == "endpoint_switch"]
    assert rows and rows[0]["use"] == "chat" and rows[0]["to"] == "fallback" and rows[0]["reason"]
    assert all(e.content for e in s.events if e.role == "assistant")


@pytest.mark.parametrize("mode", ["empty", "null"])
def test_empty_200_without_a_fallback_is_a_clear_failure_not_an_empty_reply(servers, store_dir, mode):
    a = servers(mode)
    s = Session("e200b", store=store_dir, model="openai/m", api_base=a.url, window_tokens=8000)
    with pytest.raises(LLMError, match="empty|malformed") as info:
        s.chat("hello")
    assert "\n" not in str(info.value)
    assert [e.role for e in s.events] == ["user"]  # the message is kept; no empty assistant event
    assert any(r["kind"] == "failure" for r in s.ledger())
    a.mode = "ok"
    assert s.chat("again").text == "hello from fake"  # the session stays usable


def test_switch_and_return_are_ledger_rows(servers, store_dir):
    a, b = servers("500"), servers("ok", reply="backup")
    s = Session("sw", store=store_dir, model="openai/m", api_base=a.url, window_tokens=8000,
                fallback_model="openai/n", fallback_base_url=b.url)
    s.chat("one")
    s.llm.retry_primary_after_s = 0
    a.mode = "ok"
    assert s.chat("two").endpoint == "primary"
    kinds = [(r["kind"], r.get("to")) for r in s.ledger() if r["kind"].startswith("endpoint_")]
    assert kinds == [("endpoint_switch", "fallback"), ("endpoint_return", "primary")]


def test_summarizer_failures_do_not_move_the_chat(servers, store_dir):
    a, b = servers("summary500", reply="primary answer"), servers("ok", reply="backup answer",
                                                                 summary="- the user asked about hello topics")
    s = Session("sep", store=store_dir, model="openai/m", api_base=a.url, window_tokens=8000,
                fallback_model="openai/n", fallback_base_url=b.url)
    for i in range(3):
        assert s.chat(f"hello number {i} about topics").endpoint == "primary"
    s.compact()
    assert s.chat("after the compaction").endpoint == "primary"
    switches = [r for r in s.ledger() if r["kind"] == "endpoint_switch"]
    assert switches and {r["use"] for r in switches} == {"summarizer"}
    assert "summarizer" in s.status() and "fallback" in s.status()["summarizer"]
