"""`Session.fork` / `%mfs fork` (issue 18 deliverable 2): a new session from a summary of this one."""

from __future__ import annotations

import pytest
from conftest import FakeLLM

from mfs_nb import InputError, Session

REPLY = "We keep the replica count at three and move the nightly export to 02:30 UTC after the freeze. " * 2


def _parent(store_dir: str, name: str = "main") -> Session:
    s = Session(name, store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY), show_budget=False)
    s.pin("bucket", "s3://exports-eu/nightly")
    for i in range(8):
        s.chat(f"step {i}: the export job export-{i} writes to /data/out/part_{i}.parquet and takes {40 + i} s. " * 2)
    return s


def test_fork_starts_from_one_segment_keeps_the_slot_and_leaves_the_parent_untouched(store_dir):
    parent = _parent(store_dir)
    before = parent.send_view().messages
    ledger = len(parent.ledger())
    child = parent.fork("side", "the export paths")
    assert parent.send_view().messages == before and parent.events[-1].uid == 16
    assert [r["kind"] for r in parent.ledger()[ledger:]] == ["fork"]
    assert child.parent["session"] == "main" and (child.parent["uid_from"], child.parent["uid_to"]) == (1, 16)
    assert [(x.uid_from, x.uid_to) for x in child.segments] == [(1, 16)]
    assert "Pay particular attention to: the export paths" in child.llm.summaries[-1][-1]["content"]
    kinds = [layer.kind for layer in child.send_view().layers]
    assert kinds[:3] == ["system", "knowledge", "segment"] and "raw" not in kinds
    assert "verbatim" in kinds  # the user's own words of the inherited history
    assert "- bucket: s3://exports-eu/nightly" in child.knowledge.text()
    # recall in the fork reaches the parent's originals, word for word
    assert [e.content for e in child.recall(3, 5)] == [e.content for e in parent.recall(3, 5)]
    # both go on independently; reopening the fork keeps its parent
    child.chat("only in the fork")
    parent.chat("only in the parent")
    assert child.events[-2].uid == 17 and parent.events[-2].uid == 17
    assert child.events[-2].content != parent.events[-2].content
    again = Session("side", store=store_dir, llm=FakeLLM())
    assert again.parent["session"] == "main" and again.segments[0].uid_to == 16


def test_fork_refuses_bad_names_existing_sessions_and_empty_sessions(store_dir):
    parent = _parent(store_dir)
    Session("taken", store=store_dir, llm=FakeLLM()).chat("hi")
    for name, words in (("taken", "exists already"), ("main", "exists already"), ("bad name!", "cannot fork"),
                        ("", "cannot fork")):
        with pytest.raises(InputError, match=words):
            parent.fork(name)
    with pytest.raises(InputError, match="is empty"):
        Session("empty", store=store_dir, llm=FakeLLM()).fork("empty2")
    assert "bad name!" not in parent.store.sessions() and "empty2" not in parent.store.sessions()
    parent.chat("still usable")


def test_fork_through_the_magic_moves_chat_to_the_fork(ip, capsys):
    magics = ip.magics_manager.registry["MfsMagics"]
    ip.run_line_magic("mfs", "fork nothing-yet")
    assert "is empty" in capsys.readouterr().err
    for i in range(3):
        ip.run_cell_magic("chat", "", f"question {i}: the cache holds {100 + i} MB")
    ip.run_line_magic("mfs", "fork experiment focus on the cache size")
    out = capsys.readouterr().out
    assert "forked default into experiment: uids 1–6" in out and "%%chat now talks to experiment" in out
    ip.run_cell_magic("chat", "", "in the fork now")
    assert magics.get_session("experiment").events[-2].content == "in the fork now"
    assert magics.get_session("default").last_uid == 6
    ip.run_line_magic("mfs", "fork experiment")
    assert "exists already" in capsys.readouterr().err


def test_fork_keeps_the_parents_classifications_and_an_interrupted_fork_is_finished_by_the_next(store_dir,
                                                                                                monkeypatch):
    from mfs_nb.compaction.making import SegmentMaking

    parent = Session("q", store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY), show_budget=False)
    parent.chat("AI said: use a pool of 40 connections and retry forever.\n---\nI doubt the 40", quote=True)
    parent.chat("my own note: the freeze ends on Friday")
    parent.compact()
    real = SegmentMaking.summarize
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SegmentMaking, "summarize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        parent.fork("q2")
    child = parent.fork("q2")  # the same fork again finishes it
    assert child.segments and child.parent["segment"] == child.segments[0].id and len(child.events) == 4
    assert parent.verbatim.verdicts[1].disposition == "quote+note"
    assert all(child.verbatim.verdicts[u].disposition == v.disposition for u, v in parent.verbatim.verdicts.items())
    with pytest.raises(InputError, match="exists already"):
        parent.fork("q2")


def test_a_fork_larger_than_the_compressor_reads_gets_the_parents_summaries(store_dir, monkeypatch):
    import mfs_nb.layers.segments as seg

    parent = Session("big", store=store_dir, window_tokens=32000, show_budget=False,
                     llm=FakeLLM(default=REPLY * 6, summary_text="- the nightly export moved to 02:30 UTC after the "
                                                                   "freeze; the replica count stays at three; BLUEHERON"))
    for i in range(12):
        parent.chat(f"step {i}: export-{i}")
    parent.compact()
    assert parent.segments and not parent.segments[0].degraded
    monkeypatch.setattr(seg, "INPUT_CHARS", 600)
    child = parent.fork("big2")
    prompt = "\n".join(m["content"] for m in child.llm.summaries[-1])
    assert "came before this and are not shown" in prompt and "BLUEHERON" in prompt
