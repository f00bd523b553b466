"""The side-by-side harness on small synthetic transcripts made here."""

from __future__ import annotations

from mfs_nb.bench import baselines, sidebyside
from mfs_nb.window.tokens import message_tokens
from mfs_nb.window.usage import ContextProfile


def transcript(turns: int = 120) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"Turn {i}: the pool for service-{i} holds {100 + i} connections, "
                                               f"config at deploy/svc{i}.yaml. " + "Context words. " * 20})
        out.append({"role": "assistant", "content": f"Noted: service-{i} uses {100 + i} connections; run "
                                                    f"`make deploy-{i}` after editing. " + "More detail. " * 20})
    return out


def test_strategies_fit_the_window_and_behave_as_named():
    msgs = transcript()
    window = 8_000
    eff = ContextProfile(window).effective
    runs = {name: baselines.simulate(name, msgs, window) for name in baselines.STRATEGIES}
    calls = sum(1 for m in msgs if m["role"] == "assistant")
    for name, run in runs.items():
        assert len(run.payloads) == calls
        assert all(sum(message_tokens(m) for m in p) <= eff for p in run.payloads), name
        assert len(run.final_raw) == len(run.final)
    last_n = runs["last-n"].final
    assert [m["role"] for m in last_n] == ["system", "user", "assistant", "user"]  # two exchanges
    truncate = runs["truncate"]
    assert truncate.final_raw[-1] == len(msgs) - 2 and not any(truncate.events)
    rolling = runs["rolling"]
    assert any(rolling.events)
    assert rolling.final[1]["content"].startswith("[summary of the earlier conversation]")
    codex = runs["user+summary"]
    kept_users = [r for r, m in zip(codex.final_raw, codex.final) if r is not None and m["role"] == "user"]
    assert kept_users and all(msgs[r]["role"] == "user" for r in kept_users)


def test_prefix_ratio_and_user_words():
    a = [{"role": "system", "content": "s"}, {"role": "user", "content": "one"}]
    b = a + [{"role": "assistant", "content": "two"}]
    c = [{"role": "system", "content": "s"}, {"role": "user", "content": "changed"}]
    assert sidebyside.prefix_ratio([a, b], [False, False]) == 1.0
    assert sidebyside.prefix_ratio([b, c], [False, False]) < 0.5
    assert sidebyside.prefix_ratio([b, c], [False, True]) is None  # a memory event is not an ordinary call
    msgs = [{"role": "user", "content": "keep me"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "lost words here"}, {"role": "assistant", "content": "y"}]
    assert 0 < sidebyside.user_words(msgs, [{"role": "user", "content": "keep me"}], 4) < 1
    tagged = [{"role": "user", "content": "[#3] lost words here"}]  # a uid tag does not hide a kept message
    assert sidebyside.user_words(msgs, tagged, 4) > 0


def test_mfs_run_marks_its_memory_layers():
    msgs = transcript(60)
    run, memory, report = sidebyside.run_mfs(msgs, 8_000)
    assert len(memory) == len(run.final) and not memory[0]  # the system prompt is not memory
    assert any(memory)  # 8k: the history was compacted into segments and tracks
    assert all(run.final[k]["role"] == "user" for k, is_memory in enumerate(memory) if is_memory)
    assert report["coverage"]["lost"] == 0 and len(report["uids"]) == len(msgs)


class _Data:
    def __init__(self, sets: dict):
        self.sets = sets

    def get(self, name: str) -> list:
        return self.sets[name]


def test_overhead_and_production_comparison():
    msgs = transcript(40)
    over = sidebyside.overhead(msgs, (20, 60), window=8_000, turns=4)
    assert set(over) == {20, 60} and all(v["ordinary_p50"] >= 0 and v["calls"] > 0 for v in over.values())
    loader_msgs = [{"role": m["role"], "content": m["content"]} for m in transcript(70)]
    session = {"id": "abcdef123456", "messages": loader_msgs, "compact_at": 120, "pre_tokens": 9000,
               "compact_summary": "Summary: service-3 uses 103 connections; see deploy/svc3.yaml."}
    rows = sidebyside.production(_Data({"claude_code_sessions": [session, {"id": "x", "messages": [],
                                                                           "compact_at": None}]}), window=8_000)
    assert [r["payload"] for r in rows] == ["production summary", "mfs_nb memory layers, cut to the summary's size",
                                            "mfs_nb memory layers, whole", "mfs_nb full payload at 8k"]
    summary, cut, whole, full = rows
    assert summary["session"] == "abcdef12" and summary["n_facts"] == cut["n_facts"] > 0
    # equal size means equal size: the cut layers are no larger than the summary
    assert cut["tokens"] <= summary["tokens"] and whole["tokens"] >= cut["tokens"]
    assert full["facts"] >= whole["facts"] >= cut["facts"] and whole["facts"] > 0


def test_head_within_cuts_each_layer_in_proportion():
    layers = [{"role": "user", "content": "alpha " * 400}, {"role": "user", "content": "beta " * 100}]
    cut = sidebyside.head_within(layers, 100)
    sizes = [sidebyside.estimate_tokens(m["content"]) for m in cut]
    assert sum(sizes) <= 100 and sizes[0] > sizes[1] > 0
    assert sidebyside.head_within(layers, 10_000) == layers
