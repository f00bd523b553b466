"""Consolidation and the terminal chain: old history stays as coarser layers, gated, bounded."""

from __future__ import annotations

from collections import Counter

from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb import consolidation as con
from mfs_nb.segments import Segment


def segment(i: int, level: int = 0, tokens: int = 500) -> Segment:
    return Segment(i, 10 * i + 1, 10 * i + 10, f"- user: step {i} of the rollout", "", level, False, tokens, f"h{i}")


def test_the_oldest_run_below_max_depth_never_the_newest():
    block = [segment(1, 3), segment(2, 1), segment(3), segment(4), segment(5)]
    assert con.choose_run(block, max_depth=3) == [1, 2, 3]  # the L3 stays; the newest stays L0
    assert con.choose_run([segment(1, 3), segment(2, 3), segment(3)], max_depth=3) == []  # depth exhausted
    assert con.choose_run([segment(1), segment(2)], max_depth=3) == []  # one candidate is not a run
    assert con.choose_run(block, max_depth=3, eager=True) == [2, 3]  # tier ①: two adjacent of one level
    assert con.sink_run([segment(1, 3), segment(2, 3), segment(3), segment(4)]) == [0, 1, 2]
    assert con.sink_run([segment(1, 3), segment(2, 1), segment(3)]) == [0, 1]  # no L0 but the newest
    assert con.sink_run([segment(1, 3), segment(2)]) == []


def test_gates():
    ok = con.gates(miss=4_000, block_before=3_000, block_after=1_500, hard=False)
    assert ok.passed and ok.payback == 4_000 / 1_500 and ok.shrink == 0.5
    assert con.gates(4_000, 3_000, 2_500, hard=False).failed == "shrink"  # frees only 17 %
    assert con.gates(200_000, 3_000, 1_500, hard=False).failed == "payback"  # 133 calls to pay back
    assert con.gates(200_000, 3_000, 2_900, hard=True).passed  # hard tier: really smaller is enough
    assert con.gates(1, 3_000, 3_000, hard=True).failed == "not_smaller"


def test_positional_labels_are_display_only():
    assert con.labels([3, 1, 0, 0]) == ["L1", "L2", "L0", "L0"]
    assert con.labels([0, 0]) == ["L0", "L0"]


def chatty(i: int) -> str:
    return (f"Turn {i}: the pool for service-{i % 7} holds {20 + i % 10} connections and the report "
            f"for week {i} lives in reports/week_{i}.md. ") * 6


def long_session(store_dir, name: str, turns: int, **settings) -> Session:
    s = Session(name, store=store_dir, window_tokens=4096, llm=FakeLLM(default="Noted, the pool stays as agreed."),
                background_compaction=False, **settings)
    for i in range(turns):
        s.chat(chatty(i))
    return s


def test_history_stays_as_coarser_layers_instead_of_being_evicted(store_dir):
    s = long_session(store_dir, "cons", 120)
    rows = [r for r in s.ledger() if r["kind"] == "consolidation"]
    accepted = [r for r in rows if r["accepted"]]
    assert accepted, "the block passed 80 % of its budget, so the oldest run must have been consolidated"
    for r in rows:  # every figure is logged, and nothing passed that failed a gate below the hard tier
        assert {"miss", "freed", "payback", "shrink", "block_before", "gate"} <= r.keys()
        if r["accepted"] and r["tier"] != "hard" and r["merge"] == "consolidate":
            assert r["payback"] <= con.PAYBACK_MAX and r["shrink"] >= con.SHRINK_MIN
    levels = [x.level for x in s.compactor.segments]
    assert max(levels) >= 1 and max(levels) <= s.settings.max_consolidations
    assert Counter(levels)[0] <= 6  # a handful of L0s at most
    assert s.coverage()["lost"] == 0
    evicted = sum(b - a + 1 for a, b in s.compactor.evicted)
    baseline = long_session(store_dir, "evict", 120, consolidation=False)
    evicted_before = sum(b - a + 1 for a, b in baseline.compactor.evicted)
    assert evicted_before > 0 and evicted < evicted_before  # fewer uids held by an evicted-range line only


def test_a_restart_sees_the_same_block(store_dir):
    s = long_session(store_dir, "again", 90)
    assert any(x.level for x in s.compactor.segments)
    block = [(x.id, x.level, x.uid_from, x.uid_to) for x in s.compactor.segments]
    reopened = Session("again", store=store_dir, window_tokens=4096, llm=FakeLLM())
    assert [(x.id, x.level, x.uid_from, x.uid_to) for x in reopened.compactor.segments] == block
    assert reopened.send_view().messages == s.send_view().messages


def test_a_failed_merge_keeps_the_originals(store_dir):
    s = long_session(store_dir, "fail", 40, consolidation=False)
    before = [(x.id, x.level) for x in s.compactor.segments]
    assert len(before) >= 3
    s._injected_llm.summary_text = ""  # an empty merged guide is rejected
    assert s.compactor._merge([0, 1], s.usage().effective, "compress") is None
    assert [(x.id, x.level) for x in s.compactor.segments] == before
    aborted = [r for r in s.store.load_compactions("fail") if r["phase"] == "aborted"]
    assert aborted and "rejected" in aborted[-1]["reason"]
