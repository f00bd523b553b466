"""%compact --preview (`Session.compact_preview`): what a compaction would do, committing nothing."""

from __future__ import annotations

from conftest import FakeLLM

from mfs_nb import Session

REPLY = ("Size the pool from the database's limit and the number of replicas, leave headroom for "
         "migrations and manual sessions, and let the retries back off. ") * 4


def _session(store_dir: str, name: str = "pv") -> Session:
    s = Session(name, store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY))
    for i in range(6):
        s.chat(f"step {i}: the pool for service-{i} stays under {20 + i} connections; see deploy/pool_{i}.yaml. " * 3)
    return s


def test_preview_commits_nothing_and_matches_the_compaction_that_follows(store_dir):
    s = _session(store_dir)
    declared = [r for r in s.store.load_compactions("pv") if r["phase"] == "declared"]
    payload = s.send_view().messages
    p = s.compact_preview("the pool limits")
    assert [r for r in s.store.load_compactions("pv") if r["phase"] == "declared"] == declared
    assert s.send_view().messages == payload and not s.segments  # nothing committed
    assert p["uid_from"] == 1 and p["uid_to"] > 1 and p["tokens_after"] < p["tokens_before"]
    assert 0 < p["cache_miss_tokens"] <= p["tokens_before"]
    assert "Pay particular attention to: the pool limits" in s.llm.summaries[-1][-1]["content"]
    assert f"uids {p['uid_from']}–{p['uid_to']}" in p["segment_text"]
    assert any(r["kind"] == "preview" and r["uid_to"] == p["uid_to"] for r in s.ledger())
    s.compact("the pool limits")
    seg = s.segments[0]
    assert (seg.uid_from, seg.uid_to) == (p["uid_from"], p["uid_to"])
    assert s.usage().tokens == p["tokens_after"]  # the preview's numbers are what the commit did


def test_preview_of_an_empty_session_and_through_the_magic(store_dir, tmp_path, monkeypatch, capsys):
    assert Session("empty", store=store_dir, llm=FakeLLM()).compact_preview() == {"nothing": "nothing raw"}
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nbstore"))
    cfg = Config()
    cfg.HistoryManager.enabled = False
    ip = InteractiveShell(config=cfg)
    try:
        ip.run_line_magic("load_ext", "mfs_nb")
        for i in range(6):
            ip.run_cell_magic("chat", "", f"note {i}: the cache at node-{i} holds {100 + i} MB; see conf/cache_{i}.toml. " * 4)
        capsys.readouterr()
        ip.run_line_magic("compact", "--preview")
        out = capsys.readouterr().out
        assert "preview, nothing committed: uids 1–" in out and "prefix-cache miss" in out and "[segment #" in out
        from mfs_nb.store import Store

        assert not [r for r in Store(tmp_path / "nbstore").load_compactions("default") if r["phase"] == "declared"]
        ip.run_line_magic("compact", "--undo-everything")
        out = capsys.readouterr()
        assert "unknown option --undo-everything" in out.out + out.err
    finally:
        InteractiveShell.clear_instance()
