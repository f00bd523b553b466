"""%compact --preview (`Session.compact_preview`): what a compaction would do, committing nothing."""

from __future__ import annotations

import re

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
    assert 0 < p["cache_miss_tokens"] <= p["tokens_before"] and p["would_commit"]
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
        session = ip.magics_manager.registry["MfsMagics"].get_session()
        session._injected_llm = session._llm = FakeLLM(default=REPLY)  # replies long enough to be worth compacting
        for i in range(6):
            ip.run_cell_magic("chat", "", f"note {i}: the cache at node-{i} holds {100 + i} MB; see conf/cache_{i}.toml. " * 3)
        capsys.readouterr()
        ip.run_line_magic("compact", "--preview")
        out = capsys.readouterr().out
        assert "preview, nothing committed: uids 1–" in out and "prefix-cache miss" in out and "[segment #" in out
        from mfs_nb.store import Store

        assert not [r for r in Store(tmp_path / "nbstore").load_compactions("default") if r["phase"] == "declared"]
        ip.run_line_magic("compact", "--undo")
        assert "nothing to undo" in capsys.readouterr().out
        ip.run_line_magic("compact", "")
        ip.run_line_magic("compact", "--undo")
        assert "undid segment #1 (uids 1–" in capsys.readouterr().out
        ip.run_line_magic("compact", "--undo-everything")
        out = capsys.readouterr()
        assert "unknown option --undo-everything" in out.out + out.err
    finally:
        InteractiveShell.clear_instance()


def test_undo_retracts_the_newest_segment_append_only(store_dir):
    s = _session(store_dir, "undo")
    raw_before = s.send_view().raw_uids()
    s.compact()
    seg = s.segments[0]
    assert s.send_view().raw_uids() != raw_before
    notices = s.undo_compaction()
    assert notices[0].startswith(f"undid segment #{seg.id} (uids {seg.uid_from}–{seg.uid_to})")
    assert not s.segments and s.send_view().raw_uids() == raw_before  # the originals are raw again
    assert s.coverage()["lost"] == 0
    phases = [(r["phase"], r.get("type")) for r in s.store.load_compactions("undo")]
    assert ("declared", None) in phases and ("declared", "retract") in phases  # nothing deleted, one more row
    assert s.undo_compaction() == ["nothing to undo: no segment is in the payload"]  # twice
    again = Session("undo", store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY))
    assert not again.segments and again.send_view().raw_uids() == raw_before  # a restart projects the same
    assert any(r["kind"] == "undo" and r["segment"] == seg.id for r in s.ledger())
    s.chat("and after the undo, one more turn")
    s.compact()
    assert s.segments and s.segments[0].uid_from == 1  # the range can be compacted again


def test_undo_refuses_a_consolidated_segment_and_one_that_would_not_fit(store_dir):
    s = _session(store_dir, "undo2")
    s.compact()
    seg = s.segments[-1]
    s.configure(window_tokens=4096, warn_at=0.3)  # the raw originals would now be past the warn line
    out = s.undo_compaction()
    assert out[0].startswith("nothing undone: with uids") and "would compact them again" in out[0]
    assert s.segments == [seg]
    s.configure(window_tokens=32000, warn_at=0.85)
    merged = {**seg.to_json(), "id": 99, "level": 1}
    s.store.append_compaction("undo2", 99, "declared", {"type": "consolidate", "segment_ids": [seg.id],
                                                        "segment": merged})
    out = s.undo_compaction()
    assert out[0].startswith("nothing undone: segment #99") and "consolidates earlier segments" in out[0]
    assert [x.id for x in s.segments] == [99]


def test_summaries_are_asked_for_in_the_conversations_language(store_dir):
    from mfs_nb.layers.segments import conversation_language

    zh = Session("zh", store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY))
    for i in range(6):
        zh.chat(f"第{i}步：连接池的上限是{20 + i}，配置文件在 deploy/pool_{i}.yaml，请不要超过这个数字。" * 3)
    zh.compact()
    assert "Write the guide in Chinese, the language of this conversation" in zh.llm.summaries[-1][-1]["content"]
    en = _session(store_dir, "en")
    en.compact()
    assert en.llm.summaries[-1][-1]["content"].endswith("Write the guide in the language the user writes in.")
    assert conversation_language([]) is None
    from mfs_nb.events import Event

    def says(text: str) -> str | None:
        return conversation_language([Event(1, "s", 1, "user", text)])

    assert says("これは日本語のテストです。設定を確認してください") == "Japanese"
    assert says("연결 풀의 상한은 스무 개입니다") == "Korean"
    assert says("please check src/app.py line 12 and the 连接 pool") is None  # one CJK word in English


def test_offline_summary_of_a_chinese_conversation_stays_chinese():
    from mfs_nb.layers.segments import instruction
    from mfs_nb.models.offline import offline_reply

    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"第{i}步：连接池的上限是{20 + i}，配置文件在 deploy/pool_{i}.yaml，请不要超过这个数字。"}
                for i in range(6)]
    prose = offline_reply(messages + [{"role": "user", "content": instruction("bullets", 1, 6, 300, "", "Chinese")}])
    assert "连接池的上限是20" in prose and "连接池的上限是25" in prose
    assert not re.search(r"\b(the|and|of|is)\b", prose)  # no English beyond the role labels


def test_search_finds_the_segment_in_force_after_an_undo(store_dir):
    fake = FakeLLM(default=REPLY, summary_text="- zanzibarword: the pool for service-0 stays under 20 connections (deploy/pool_0.yaml)")
    s = Session("us", store=store_dir, window_tokens=32000, llm=fake)
    for i in range(6):
        s.chat(f"step {i}: the pool for service-{i} stays under {20 + i} connections; see deploy/pool_{i}.yaml. " * 3)
    s.compact()
    s.indexer.catch_up(vectors=False)
    assert [h.kind for h in s.search("zanzibarword", 3, methods=("fts",))][:1] == ["segment"]
    s.undo_compaction()
    fake.summary_text = "- quokkaword: the pool for service-0 stays under 20 connections (deploy/pool_0.yaml)"
    s.compact()
    s.indexer.catch_up(vectors=False)
    assert not [h for h in s.search("zanzibarword", 3, methods=("fts",)) if h.kind == "segment"]  # retracted
    found = [h for h in s.search("quokkaword", 3, methods=("fts",)) if h.kind == "segment"]
    assert found and found[0].uid == s.segments[0].uid_from


def test_after_undoing_the_only_segment_a_stale_declaration_is_not_honoured(store_dir):
    s = _session(store_dir, "stale")
    s.compact()
    seg = s.segments[0]
    s.undo_compaction()
    stale = {**seg.to_json(), "id": 50, "uid_from": seg.uid_from + 2}  # a writer that saw another prefix
    s.store.append_compaction("stale", 50, "declared", {"segment": stale})
    again = Session("stale", store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY))
    assert not again.segments and again.coverage()["lost"] == 0
    assert any("does not follow the covered prefix" in n for n in again.compactor.recovered)


def test_an_automatic_compaction_is_announced_ahead_with_its_uids(store_dir):
    s = Session("ahead", store=store_dir, window_tokens=8000, llm=FakeLLM(default=REPLY))
    ahead, compacted = None, None
    for i in range(60):
        notices = s.chat(f"step {i}: the pool for service-{i} stays under {20 + i} connections; "
                         f"see deploy/pool_{i}.yaml. " * 2).notices
        done = next((n for n in notices if n.startswith("context compacted")), None)
        if done:
            compacted = re.search(r"uids (\d+)–(\d+)", done).groups()
            break
        ahead = next((n for n in notices if n.startswith("compaction ahead")), ahead)
    assert compacted and ahead, "the automatic compaction came unannounced"
    assert f"cover uids {compacted[0]}–{compacted[1]}" in ahead


def test_the_previews_trial_segment_is_never_seen_by_other_threads(store_dir, monkeypatch):
    s = _session(store_dir, "trial")
    seen: list[list[int]] = []
    real = s.send_view

    def watching(*args, **kwargs):
        seen.append([x.id for x in s.indexer.host.segments()])  # what the indexer and search read
        return real(*args, **kwargs)

    monkeypatch.setattr(s, "send_view", watching)
    p = s.compact_preview()
    assert p["tokens_after"] < p["tokens_before"] and len(seen) >= 2  # the trial projection ran
    assert seen == [[]] * len(seen) and s.compactor.trials == []
