"""Export (`Session.export`, `%mfs export`): the whole session readable without mfs_nb."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import FakeLLM, tool_call

from mfs_nb import Session
from mfs_nb.errors import InputError


def _session(store_dir: str) -> Session:
    reply = ("Size the pool from the database's limit and the number of replicas, leave headroom for "
             "migrations and manual sessions, and let the retries back off. ") * 4
    fake = FakeLLM(script=[tool_call("recall_history", {"uid_from": 1, "uid_to": 1}), "the pool stays at 30"],
                   default=reply)
    s = Session("exp", store=store_dir, window_tokens=32000, llm=fake)
    s.chat("Our DB allows 120 connections; keep the pool under 30. Code: ```x = 1```")
    for i in range(6):
        s.chat(f"step {i}: run pytest -q tests/test_{i}.py and report the failures; config in deploy/pool_{i}.yaml. "
               * 3)
    assert s.compact()[0].startswith("context compacted")
    s.declared_after = s.last_uid  # the test's note: the last uid when the segment was declared
    s.chat("你好，最后一个问题：连接池多大？")
    return s


def _messages(md: str) -> dict[int, str]:
    """uid -> the block of the export under that uid's heading."""
    parts = re.split(r"^### #(\d+) · ", md, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_markdown_export_has_every_message_the_segment_where_declared_and_the_ledger(store_dir, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("SOME_API_KEY", "sk-test-secret-123456789")
    s = _session(store_dir)
    s.chat("my key is sk-test-secret-123456789, do not keep it")
    path = s.export(tmp_path / "chat.md")
    md = path.read_text(encoding="utf-8")
    blocks = _messages(md)
    assert sorted(blocks) == [e.uid for e in s.events]  # every uid once, in order
    for e in s.events:
        if e.content and "sk-test" not in e.content:
            assert e.content in blocks[e.uid]  # word for word
    assert "sk-test-secret-123456789" not in md and "***" in md  # known keys never written
    seg = s.compactor.segments[0]
    at = md.index(f"Segment #{seg.id}** declared")
    assert md.index(f"### #{s.declared_after} · ") < at < md.index(f"### #{s.declared_after + 1} · ")
    assert s.declared_after >= seg.uid_to
    assert seg.prose.strip().splitlines()[0] in md[at:]
    assert "## Ledger" in md and "| compaction |" in md
    assert "tool result `recall_history`" in md and "tool call `recall_history`" in md
    assert "连接池多大" in md


def test_notebook_export_is_valid_nbformat_with_one_cell_per_block(store_dir, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    s = _session(store_dir)
    path = s.export(str(tmp_path / "chat.ipynb"))
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    uids = [c.metadata["mfs_nb"]["uid"] for c in nb.cells if c.metadata["mfs_nb"]["kind"] == "event"]
    assert uids == [e.uid for e in s.events]
    kinds = [c.metadata["mfs_nb"]["kind"] for c in nb.cells]
    assert kinds[0] == "header" and kinds[-1] == "ledger" and "declaration" in kinds
    first = next(c for c in nb.cells if c.metadata["mfs_nb"].get("uid") == 1)
    assert s.events[0].content in first.source


def test_export_refuses_bad_paths_with_one_line_and_writes_nothing(store_dir, tmp_path):
    s = _session(store_dir)
    existing = tmp_path / "old.md"
    existing.write_text("keep me", encoding="utf-8")
    cases = [(existing, "exists"), (tmp_path, "is a directory"), (tmp_path / "chat.txt", ".md or .ipynb"),
             (tmp_path / "missing" / "chat.md", "does not exist"), ("", "needs a file name")]
    for path, words in cases:
        with pytest.raises(InputError) as err:
            s.export(path)
        assert words in str(err.value) and "\n" not in str(err.value)
    assert existing.read_text(encoding="utf-8") == "keep me"
    s.export(existing, overwrite=True)
    assert "keep me" not in existing.read_text(encoding="utf-8")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    # a read-only folder (root writes there anyway, but nobody writes files into /proc)
    unwritable = locked if os.geteuid() != 0 else Path("/proc")
    with pytest.raises(InputError, match="cannot write"):
        s.export(unwritable / "chat.md")
    assert not list(tmp_path.glob(".*.part"))  # no half-written file left behind
    assert s.chat("still usable?").text  # the session goes on


def test_mfs_export_magic(tmp_path, monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nbstore"))
    monkeypatch.chdir(tmp_path)
    cfg = Config()
    cfg.HistoryManager.enabled = False
    ip = InteractiveShell(config=cfg)
    try:
        ip.run_line_magic("load_ext", "mfs_nb")
        ip.run_cell_magic("chat", "", "Remember: the staging host is db-7.internal")
        capsys.readouterr()
        ip.run_line_magic("mfs", "export notes.md")
        assert "exported session 'default'" in capsys.readouterr().out
        assert "the staging host is db-7.internal" in (tmp_path / "notes.md").read_text(encoding="utf-8")
        ip.run_line_magic("mfs", "export notes.md")  # exists: one line, nothing overwritten
        out = capsys.readouterr()
        assert "exists" in (out.out + out.err) and "Traceback" not in (out.out + out.err)
        ip.run_line_magic("mfs", "export notes.ipynb --force")
        assert json.loads((tmp_path / "notes.ipynb").read_text(encoding="utf-8"))["nbformat"] == 4
    finally:
        InteractiveShell.clear_instance()


def test_export_keys_never_leak_through_json_escaping_and_odd_paths_get_one_line(store_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", 'abc"def\\ghi123')
    s = Session("keys", store=store_dir, window_tokens=32000, llm=FakeLLM(default="Open fence:\n```python\nx = 1"))
    s.chat("here is my key:\nsk-proj-ABCDEFGHIJKLMNOPQRSTUVWX and my password abc\"def\\ghi123")
    s.chat("### #99 · user · turn 7 looks like a header")
    for name in ("k.ipynb", "k.md"):
        text = s.export(tmp_path / name).read_text(encoding="utf-8")
        assert "ABCDEFGHIJKLMNOP" not in text and "ghi123" not in text and "ghi123" not in json.dumps(text)
    md = (tmp_path / "k.md").read_text(encoding="utf-8")
    assert sorted(_messages(md)) == [1, 2, 3, 4]  # an unclosed fence or a header look-alike is fenced, not obeyed
    for bad in ("~no-such-user-here/a.md", "a\x00b.md"):
        with pytest.raises(InputError) as err:
            s.export(bad)
        assert "\n" not in str(err.value)
