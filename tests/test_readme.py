"""The README is a front door: under 12,000 bytes, its first notebook runs offline as written, and
its "Use your own model" blocks each run as written against a fake endpoint of its kind on
127.0.0.1 (the provider's base URL pointed there by its environment variable, a custom endpoint's or
the gateway's URL replaced): the block's model answers, with the block's key, and no key is saved."""

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


def test_the_readme_is_a_three_minute_read():
    assert len(README.read_bytes()) <= 12_000


def test_the_section_has_the_four_blocks():
    assert set(_blocks()) == {"OpenAI", "Anthropic", "Any OpenAI-compatible endpoint", "A team gateway"}
    assert len(README.read_text(encoding="utf-8").split("## Use your own model")[0]) < 3000  # near the top


def test_the_first_notebook_runs_offline_as_written(ip, capsys):
    text = README.read_text(encoding="utf-8")
    section = text.split("## In a notebook", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"```[a-z]*\n(.*?)```", section, re.S)
    assert cells[0].strip() == "%load_ext mfs_nb"  # the fixture ran it, as a notebook's first cell does
    for cell in cells[1:]:
        assert ip.run_cell(cell).success, cell
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert [line for line in out.err.splitlines() if "first use in this kernel" not in line] == []
    assert "pinned db_limit" in out.out
    assert "[#1 user" in out.out and "keep it under 30" in out.out  # %recall 1-2, verbatim


def _shape(line: str) -> str:
    """A status line with its numbers blanked: what the README can promise about the next run."""
    return re.sub(r"\d+(?:[.,]\d+)*[kM]?", "#", line)


def test_the_status_lines_the_readme_shows_are_ones_the_code_prints(ip, capsys):
    """Issue 71, item 6: the README showed `cache 99.1%` where every real line said `prefix …`."""
    text = README.read_text(encoding="utf-8")
    shown = [" ".join(x.split()) for x in re.findall(r"`(ctx \d[^`]*)`", text, re.S)]
    assert len(shown) == 2, shown  # the first reply's line and a later one's
    section = text.split("## In a notebook", 1)[1].split("\n## ", 1)[0]
    chat = next(c for c in re.findall(r"```[a-z]*\n(.*?)```", section, re.S) if c.startswith("%%chat"))
    ip.run_cell(chat)
    ip.run_cell("%%chat\nAnd the config lives at /etc/app/pool.yaml")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ctx ")]
    assert [_shape(x) for x in shown] == [_shape(x) for x in printed], (shown, printed)
    # the note each request ends with, as the README quotes it, is the one the code appends
    from mfs_nb import lang

    template = re.escape(lang.text("budget_note", "", share="§", line="¶")).replace("§", r"\d+%").replace("¶", r"\d+%")
    assert re.search(template, " ".join(text.split())), "the README's budget note is not the one sent"


# (block, the environment variable that points the provider at the fake, the URL in the block that
# the fake replaces and what replaces it, the key's variable, the path the request must reach)
@pytest.mark.parametrize("name, base_env, block_url, key_env, path", [
    ("OpenAI", "OPENAI_BASE_URL", None, "OPENAI_API_KEY", "/v1/chat/completions"),
    ("Anthropic", "ANTHROPIC_API_BASE", None, "ANTHROPIC_API_KEY", "/v1/messages"),
    ("Any OpenAI-compatible endpoint", None, "http://127.0.0.1:8000/v1", "MFS_API_KEY", "/v1/chat/completions"),
    # a litellm proxy serves the OpenAI routes at its root, so the fake stands in without /v1
    ("A team gateway", None, "http://gateway.internal:4000", "MFS_API_KEY", "/chat/completions"),
])
def test_each_block_reaches_its_endpoint_with_its_key(name, base_env, block_url, key_env, path, tmp_path,
                                                      monkeypatch, capsys):
    provider = FakeProvider(reply="hello from your own model")
    try:
        code = _blocks()[name]
        assert f'os.environ["{key_env}"]' in code
        if base_env:
            url = provider.url if name == "OpenAI" else provider.url.removesuffix("/v1")
            monkeypatch.setenv(base_env, url)
        else:
            assert block_url in code
            code = code.replace(block_url, provider.url if block_url.endswith("/v1") else provider.url.removesuffix("/v1"))
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
        hits = [h for h in provider.hits if h["path"] == path]
        assert hits, [h["path"] for h in provider.hits]
        headers = {k.lower(): v for k, v in hits[0]["headers"].items()}
        auth = headers.get("authorization", "") + headers.get("x-api-key", "")
        assert "sk-test-0123456789" in auth
        store = (tmp_path / "store")
        assert not any(b"sk-test-0123456789" in f.read_bytes() for f in store.rglob("*") if f.is_file())
    finally:
        InteractiveShell.clear_instance()
        provider.close()
