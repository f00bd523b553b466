"""The README's "Use your own model" blocks, each run as written against a fake endpoint of its kind
on 127.0.0.1 (the provider's base URL pointed there by its environment variable, the custom
endpoint's URL replaced): the block's model answers, with the block's key, and no key is saved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fake_provider import FakeProvider
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> dict[str, str]:
    """The python blocks of the section, by the line that introduces each."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Use your own model", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"\n([^\n`]+)\n```python\n(.*?)```", section, re.S)
    return {intro.split(":")[0].split(" (")[0].strip(): code for intro, code in found}


def test_the_section_has_the_three_blocks():
    assert set(_blocks()) == {"OpenAI", "Anthropic", "Any OpenAI-compatible endpoint"}
    assert len(README.read_text(encoding="utf-8").split("## Use your own model")[0]) < 3000  # near the top


@pytest.mark.parametrize("name, base_env, key_env, path", [
    ("OpenAI", "OPENAI_BASE_URL", "OPENAI_API_KEY", "/v1/chat/completions"),
    ("Anthropic", "ANTHROPIC_API_BASE", "ANTHROPIC_API_KEY", "/v1/messages"),
    ("Any OpenAI-compatible endpoint", None, "MFS_API_KEY", "/v1/chat/completions"),
])
def test_each_block_reaches_its_endpoint_with_its_key(name, base_env, key_env, path, tmp_path, monkeypatch, capsys):
    provider = FakeProvider(reply="hello from your own model")
    try:
        code = _blocks()[name]
        if base_env:
            url = provider.url if name == "OpenAI" else provider.url.removesuffix("/v1")
            monkeypatch.setenv(base_env, url)
        else:
            code = re.sub(r"http://127\.0\.0\.1:8000/v1", provider.url, code)
        for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MFS_API_KEY", "MFS_MODEL", "MFS_API_BASE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("MFS_STORE", str(tmp_path / "store"))
        monkeypatch.setattr("getpass.getpass", lambda prompt="": "sk-test-0123456789")
        cfg = Config()
        cfg.HistoryManager.enabled = False
        ip = InteractiveShell(config=cfg)
        ip.run_line_magic("load_ext", "mfs_nb")
        assert ip.run_cell(code).success
        assert ip.run_cell("%%chat\nhello").success
        out = capsys.readouterr()
        assert "hello from your own model" in out.out, out
        assert "Traceback" not in out.err
        hits = [h for h in provider.hits if h["path"].endswith(path)]
        assert hits, provider.hits
        headers = {k.lower(): v for k, v in hits[0]["headers"].items()}
        auth = headers.get("authorization", "") + headers.get("x-api-key", "")
        assert "sk-test-0123456789" in auth
        store = (tmp_path / "store")
        assert not any(b"sk-test-0123456789" in f.read_bytes() for f in store.rglob("*") if f.is_file())
    finally:
        InteractiveShell.clear_instance()
        provider.close()
