"""A team gateway: `api_base` points to a litellm proxy that holds the provider's key and the team's
models, and each person uses a key of their own (docs/guide/stores.md, "A team gateway"; how it is
tested: CONTRIBUTING.md, "The gateway test").

The proxy runs from its own environment, as a team's gateway would (the `litellm[proxy]` extra pins
packages the notebook's environment does not need): `MFS_LITELLM_PROXY` names its `litellm`
command, or `.gateway/bin/litellm` in this checkout (`.ci/run` makes it). The test starts it on
127.0.0.1 with a fake upstream (`fake_provider.py`) and per-user keys (`gateway/team_auth.py`). Where
the proxy is missing the tests skip with the reason, unless MFS_REQUIRE_GATEWAY=1 (set by CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from fake_provider import FakeProvider
from procs import free_port, stop

from mfs_nb import LLMError, Session

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KEYS = {"sk-team-alice-5501": "alice", "sk-team-bob-5502": "bob"}
UPSTREAM_KEY = "sk-upstream-provider-secret-9931"
START_S = 90


def _proxy() -> str | None:
    path = os.environ.get("MFS_LITELLM_PROXY") or str(ROOT / ".gateway" / "bin" / "litellm")
    return path if Path(path).is_file() and os.access(path, os.X_OK) else None


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health/liveliness", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    proxy = _proxy()
    if proxy is None:
        why = "no litellm proxy (set MFS_LITELLM_PROXY, or see CONTRIBUTING.md, \"The gateway test\")"
        if os.environ.get("MFS_REQUIRE_GATEWAY"):
            pytest.fail(f"gateway test required but {why}")
        pytest.skip(why)
    work = tmp_path_factory.mktemp("gateway")
    shutil.copy(HERE / "gateway" / "team_auth.py", work / "team_auth.py")
    upstream = FakeProvider("ok", reply="answer from the team's model", summary="- the summary, from upstream")
    (work / "config.yaml").write_text(
        "model_list:\n"
        "  - model_name: team-small\n"
        "    litellm_params:\n"
        "      model: openai/upstream-model\n"
        f"      api_base: {upstream.url}\n"
        "      api_key: os.environ/UPSTREAM_KEY\n"
        "general_settings:\n"
        "  master_key: sk-gateway-admin\n"
        "  custom_auth: team_auth.user_api_key_auth\n", encoding="utf-8")
    port = free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "UPSTREAM_KEY": UPSTREAM_KEY,
           "MFS_GATEWAY_KEYS": ",".join(f"{k}={u}" for k, u in KEYS.items()), "PYTHONPATH": str(work)}
    env.pop("MFS_API_KEY", None)
    log = (work / "proxy.log").open("wb")
    process = subprocess.Popen([proxy, "--config", str(work / "config.yaml"), "--host", "127.0.0.1", "--port", str(port)],
                               cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while not _up(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (work / "proxy.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"the litellm proxy did not start on {url}:\n{tail}")
            time.sleep(0.5)
        yield {"url": url, "upstream": upstream}
    finally:
        stop(process, 10)
        log.close()
        upstream.close()


def _files_holding(folder: Path, secrets) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(folder)}: {s[:10]}…" for s in secrets if s.encode() in data]
    return found


def test_two_people_chat_through_the_gateway_each_with_their_own_key(gateway, monkeypatch, tmp_path):
    upstream = gateway["upstream"]
    store = tmp_path / "store"
    for key, user in KEYS.items():
        monkeypatch.setenv("MFS_API_KEY", key)
        s = Session(f"{user}-work", store=store, model="openai/team-small", api_base=gateway["url"], window_tokens=8000)
        before = len(upstream.hits)
        reply = s.chat(f"{user} here: the staging bucket is s3://acme-stage-7 and the pool limit is 30")
        assert reply.text == "answer from the team's model"
        hits = upstream.hits[before:]
        assert hits and all(h["model"] == "upstream-model" for h in hits)  # the gateway's model name, not the team's
        # the upstream sees the gateway's provider key, never a person's key
        assert all(h["auth"] == f"Bearer {UPSTREAM_KEY}" for h in hits)
        assert any(f"{user} here" in str(m.get("content")) for h in hits for m in h["body"]["messages"])
        s.chat("and the retry budget is 3 attempts")
        s.compact()  # the summarizer goes through the same gateway with the same key
        assert any(str(h["body"]["messages"][-1]["content"]).startswith("<<mfs:summarize>>")
                   for h in upstream.hits[before:])
    # nobody's key is written anywhere in the store (the log, the state, the ledger, snapshots)
    assert _files_holding(store, [*KEYS, UPSTREAM_KEY]) == []


def test_an_unknown_key_is_one_clear_line_and_the_message_is_kept(gateway, monkeypatch, tmp_path):
    monkeypatch.setenv("MFS_API_KEY", "sk-not-a-team-key-0000")
    s = Session("eve", store=tmp_path / "store", model="openai/team-small", api_base=gateway["url"], window_tokens=8000)
    with pytest.raises(LLMError) as info:
        s.chat("the deploy window is Tuesday 14:00 UTC")
    message = str(info.value)
    assert "\n" not in message and "MFS_API_KEY" in message and "rejected the key" in message
    assert "sk-not-a-team-key" not in message
    assert [e.content for e in s.events if e.role == "user"] == ["the deploy window is Tuesday 14:00 UTC"]
    monkeypatch.setenv("MFS_API_KEY", next(iter(KEYS)))  # the right key, and the session goes on
    assert s.chat("and the freeze starts Friday").text == "answer from the team's model"
