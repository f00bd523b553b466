"""The side-by-side harness on small synthetic transcripts made here."""

from __future__ import annotations

from mfs_nb.bench import baselines, sidebyside
from mfs_nb.tokens import message_tokens
from mfs_nb.usage import ContextProfile


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


def test_atoms_and_fact_survival():
    found = sidebyside.atoms("TimeoutError after 30.0 s in deploy/pool.yaml; run `pytest -k pool` with 120 users")
    assert {"TimeoutError", "30.0 s", "deploy/pool.yaml", "pytest -k pool", "120 users"} <= found
    msgs = [{"role": "user", "content": "the limit is 4242 rows in data/big.csv"},
            {"role": "assistant", "content": "ok, 4242 rows"},
            {"role": "user", "content": "and the port is 8081"},
            {"role": "assistant", "content": "fine"}]
    final = [{"role": "system", "content": "s"}, {"role": "user", "content": "summary: 4242 rows"},
             msgs[2]]
    stated, every, n = sidebyside.fact_survival(msgs, final, [None, None, 2], 3)
    # left: messages 0 and 1; their atoms 4242 rows, data/big.csv, (4242); the summary keeps "4242 rows"
    assert n == len(sidebyside.atoms(msgs[0]["content"]) | sidebyside.atoms(msgs[1]["content"]))
    assert 0 < stated < 1 and every == stated


def test_named_uids_prefix_ratio_and_user_words():
    texts = ["[segment #3 · uids 12–15]\n- a fact [#40]", "[earlier history, uids 1–3, 5–6, was compressed]",
             "[older user messages #20–#22 left this track]"]
    assert sidebyside.named_uids(texts) == {12, 13, 14, 15, 40, 1, 2, 3, 5, 6, 20, 21, 22}
    a = [{"role": "system", "content": "s"}, {"role": "user", "content": "one"}]
    b = a + [{"role": "assistant", "content": "two"}]
    c = [{"role": "system", "content": "s"}, {"role": "user", "content": "changed"}]
    assert sidebyside.prefix_ratio([a, b], [False, False]) == 1.0
    assert sidebyside.prefix_ratio([b, c], [False, False]) < 0.5
    assert sidebyside.prefix_ratio([b, c], [False, True]) is None  # a memory event is not an ordinary call
    msgs = [{"role": "user", "content": "keep me"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "lost words here"}, {"role": "assistant", "content": "y"}]
    assert 0 < sidebyside.user_words(msgs, [{"role": "user", "content": "keep me"}], 4) < 1


def test_mfs_run_maps_its_raw_tail_back_to_the_transcript():
    msgs = transcript(60)
    run, uid_of, report = sidebyside.run_mfs(msgs, 8_000)
    raw = [r for r in run.final_raw if r is not None]
    assert raw and raw == list(range(raw[0], len(msgs) - 1))  # a contiguous suffix before the last reply
    assert all(run.final[k]["content"] == msgs[r]["content"] for k, r in enumerate(run.final_raw) if r is not None)
    assert report["coverage"]["lost"] == 0 and len(uid_of) == len(msgs)


class _Data:
    def __init__(self, sets: dict):
        self.sets = sets

    def get(self, name: str) -> list:
        return self.sets[name]


def test_overhead_and_production_comparison():
    msgs = transcript(40)
    over = sidebyside.overhead(msgs, (20, 60), window=8_000, turns=4)
    assert set(over) == {20, 60} and all(v["ordinary_p50"] >= 0 and v["calls"] > 0 for v in over.values())
    loader_msgs = [{"role": m["role"], "content": m["content"]} for m in transcript(30)]
    session = {"id": "abcdef123456", "messages": loader_msgs, "compact_at": 40, "pre_tokens": 9000,
               "compact_summary": "Summary: service-3 uses 103 connections; see deploy/svc3.yaml."}
    rows = sidebyside.production(_Data({"claude_code_sessions": [session, {"id": "x", "messages": [],
                                                                           "compact_at": None}]}))
    assert [r["facts"] for r in rows] == ["stated", "all"] and rows[0]["session"] == "abcdef12"
    r = rows[0]
    assert r["items"] == r["both"] + r["mfs_only"] + r["production_only"] + r["neither"]
    assert r["mfs"] > r["production"] > 0  # at 200k nothing left the window; the summary kept a few atoms
