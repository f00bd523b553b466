"""S3: segments over the append-only log — coverage, exact inputs, determinism, protocol, failures."""

from __future__ import annotations

import json

import pytest
from conftest import FakeLLM
from hypothesis import given, settings
from hypothesis import strategies as st

from mfs_nb import LLMError, PromptTooLong, Session
from mfs_nb.commands.replay import normalise, replay
from mfs_nb.events import Event
from mfs_nb.layers.facts import COMMAND, ERROR, NUMBER, PATH, classify, extract
from mfs_nb.layers.segments import HONESTY, compressor_messages, select_range
from mfs_nb.layers.workset import budget, lines_of


def chatty(i: int) -> str:
    return (f"Turn {i}: the pool for service-{i % 7} should stay under {20 + i % 10} connections; "
            f"config lives in deploy/pool_{i}.yaml and `pytest tests/test_{i}.py` took {i * 3} ms. " * 3)


# a model's prose reply: what compaction shrinks (a session of user messages and one-word replies
# cannot shrink: the user's words are kept verbatim, and such a compaction is not committed)
REPLY = ("Here is how I would think about it: size the pool from the database's limit and the number of "
         "replicas, leave headroom for migrations and manual sessions, and let the retries back off. ") * 4


def covered_ok(s: Session) -> None:
    """Every uid is raw in the payload or inside exactly one segment / evicted range."""
    raw = s.send_view().raw_uids()
    spans = [(x.uid_from, x.uid_to) for x in s.compactor.segments] + list(s.compactor.evicted)
    for e in s.events:
        inside = sum(a <= e.uid <= b for a, b in spans)
        assert (e.uid in raw) + inside == 1, f"uid {e.uid}: raw={e.uid in raw} spans={inside}"


@pytest.mark.slow
def test_coverage_holds_at_every_turn_over_160_turns(store_dir):
    fake = FakeLLM(default="Noted, I will keep the pool under the limit you gave.")
    s = Session("long", store=store_dir, window_tokens=4096, llm=fake, background_compaction=False)
    peak = 0
    for i in range(160):
        s.chat(chatty(i))
        covered_ok(s)
        peak = max(peak, s.last_plan.usage.tokens)
        assert s.last_plan.usage.tokens <= s.usage().effective
    assert s.coverage()["lost"] == 0 and s.coverage()["in_segments"] > 0.9 * len(s.events)
    assert [r["kind"] for r in s.ledger()].count("compaction") >= 5


def test_input_of_each_compression_is_exactly_its_declared_range(store_dir):
    fake = FakeLLM(default="ok then")
    s = Session("exact", store=store_dir, window_tokens=4096, llm=fake, background_compaction=False)
    for i in range(40):
        s.chat(chatty(i))
    declared = [r for r in s.store.load_compactions("exact") if r["phase"] == "declared" and "segment" in r
                and r.get("type") not in ("upgrade", "consolidate")]
    assert declared and len(declared) == len(fake.summaries)
    events = {e.uid: e for e in s.events}
    for row, request in zip(declared, fake.summaries):
        seg = row["segment"]
        expected = compressor_messages([events[u] for u in range(seg["uid_from"], seg["uid_to"] + 1)])
        assert request[1:-1] == expected
        assert request[0]["role"] == "system" and request[0]["content"] == s._system()


def test_segment_text_has_header_honesty_line_prose_and_facts(store_dir, monkeypatch):
    import mfs_nb.layers.segments as segments

    monkeypatch.setattr(segments, "FACT_BLOCK", 0.4)  # room for several fact lines at this small window
    s = Session("text", store=store_dir, window_tokens=4096, llm=FakeLLM(), background_compaction=False)
    for i in range(30):
        s.chat(chatty(i))
    first = s.compactor.segments[0] if s.compactor.segments else None
    assert first is not None
    text = first.render()
    header, _, rest = text.partition("\n")
    assert header.startswith(f"[segment #{first.id} · uids {first.uid_from}–{first.uid_to}") and header.endswith("]")
    assert " · topics: " in header  # a few topic words, so the model knows what to search for
    assert rest.startswith(f"{HONESTY}\n\n- " + ("summary of" if first.level == 0 else "merged guide"))
    assert "Facts (verbatim):\nsaid (user and assistant):\n- user: " in text and "deploy/pool_" in text
    view = s.send_view()
    contents = [m["content"] for m in view.messages]
    k = 1
    if s.compactor.evicted:  # older maps left the payload: one note names their range, before the block
        a, b = s.compactor.evicted[0][0], s.compactor.evicted[-1][1]
        assert contents[1].startswith(f"[earlier history, uids {a}–") and b == first.uid_from - 1
        k = 2
    assert contents[k] == text  # the oldest segment in force opens the block, byte for byte
    assert any(layer.kind == "segment" for layer in view.layers)


@pytest.mark.slow  # over 15 s (see pyproject: run with -m slow)
def test_replay_is_deterministic_with_the_offline_default(tmp_path):
    msgs = []
    for i in range(80):
        msgs += [{"role": "user", "content": chatty(i)}, {"role": "assistant", "content": f"Answer {i}: keep it at {i % 9}."}]
    a = replay(normalise(msgs), window=4096)
    b = replay(normalise(msgs), window=4096)
    assert a["segments"] and a["segments"] == b["segments"]
    assert a["final_view"] == b["final_view"] and a["coverage"]["lost"] == 0
    assert max(c["payload_tokens"] for c in a["calls"]) <= int(4096 * 0.835)


def test_crash_between_started_and_finished_is_reported_and_cleaned(store_dir):
    s = Session("crash", store=store_dir, window_tokens=4096, llm=FakeLLM(), background_compaction=False)
    for i in range(30):
        s.chat(chatty(i))
    segments_before = s.segments
    seq = s.compactor.seq + 1
    s.store.append_compaction("crash", seq, "started", {"trigger": "auto", "uid_from": 1, "uid_to": 2})
    s.store.append_compaction("crash", seq, "summary_completed", {"content": "half done"})
    again = Session("crash", store=store_dir, window_tokens=4096, llm=FakeLLM())
    assert again.segments == segments_before
    assert any("recovered an interrupted compaction" in n for n in again.prepare_call().notices)
    phases = [r["phase"] for r in again.store.load_compactions("crash") if r["seq"] == seq]
    assert phases[-1] == "aborted"
    assert again.recall(1, 2)[0].content == chatty(0)
    assert [r["kind"] for r in again.ledger()].count("recovered") == 1
    assert not Session("crash", store=store_dir, window_tokens=4096).compactor.recovered  # cleaned once


def test_summarizer_failure_gives_a_degraded_segment_then_the_breaker_opens(store_dir):
    fake = FakeLLM(summary_text=LLMError("primary endpoint failed: HTTP 503"), default=REPLY)
    s = Session("fail", store=store_dir, window_tokens=4096, llm=fake, background_compaction=False)
    notices = []
    for i in range(80):
        notices += s.chat(chatty(i)).notices
    degraded = [x for x in s.compactor.segments if x.degraded]
    assert degraded and all("#" in x.prose and "Facts" in x.render() for x in degraded)
    assert any("summarizer unavailable" in n for n in notices)
    assert sum("automatic LLM compaction stopped" in n for n in notices) == 1
    assert len(fake.summaries) == 3  # after the breaker opens the model is not asked again
    assert s.coverage()["lost"] == 0


def test_catch_up_upgrade_replaces_the_last_degraded_segment_once(store_dir):
    fake = FakeLLM(summary_text=LLMError("down"), default=REPLY)
    s = Session("up", store=store_dir, window_tokens=4096, llm=fake, background_compaction=False)
    i = 0
    while not s.compactor.segments:
        s.chat(chatty(i))
        i += 1
    assert s.compactor.segments[-1].degraded
    fake.summary_text = "- short summary of the earlier turns: pool under 30, deploy/pool_0.yaml"
    while not any(r["kind"] == "upgrade" for r in s.ledger()):
        s.chat(chatty(i))
        i += 1
        assert i < 200
    row = next(r for r in s.ledger() if r["kind"] == "upgrade")
    assert row["tokens_after"] < row["tokens_before"]
    again = Session("up", store=store_dir, window_tokens=4096)
    assert not any(x.id == row["segment"] and x.degraded for x in again.compactor.segments + [])


def test_manual_compact_and_nothing_to_compact(store_dir):
    s = Session("man", store=store_dir, window_tokens=32000, llm=FakeLLM(default=REPLY))
    assert s.compact() == ["nothing to compact (nothing raw)"]
    for i in range(6):
        s.chat(chatty(i))
    notices = s.compact("the pool limits")
    assert notices[0].startswith("context compacted: ") and "segment #1" in notices[0]
    assert "Pay particular attention to: the pool limits" in s.llm.summaries[-1][-1]["content"]
    assert s.compactor.segments and s.coverage()["lost"] == 0


def test_prompt_too_long_drops_oldest_rounds_for_that_request_only(store_dir):
    fake = FakeLLM()
    s = Session("ptl", store=store_dir, window_tokens=200_000, llm=fake)
    for i in range(10):
        s.chat(chatty(i))
    fake.script = [PromptTooLong("too long", gap_tokens=300), "fits now"]
    reply = s.chat("one more")
    assert reply.text == "fits now" and any("too long" in n for n in reply.notices)
    sent = fake.received[-1]
    assert sent[1]["content"].startswith("[uids 1–") and "recall_history returns them" in sent[1]["content"]
    assert len(sent) < len(fake.received[-2])
    assert len(s.events) == 22 and s.recall(1, 1)[0].content == chatty(0)
    fake.script = [PromptTooLong("too long")] * 4
    with pytest.raises(PromptTooLong, match="still too long after 3 retries"):
        s.chat("again")


def test_atomic_commit_rejects_a_stale_result(store_dir):
    s = Session("atomic", store=store_dir, window_tokens=32000, llm=FakeLLM())
    for i in range(6):
        s.chat(chatty(i))
    events = s.events[:4]
    from mfs_nb.layers.segments import build

    stale = build(99, events, "- a summary that no longer matches")
    forged = type(stale)(**{**stale.to_json(), "covered_hash": "0" * 32})
    assert "lock" in s.compactor.commit(forged)  # without the compaction lock nothing commits
    assert s.compactor.lease.acquire()
    assert "changed" in s.compactor.commit(forged)
    gap = type(stale)(**{**stale.to_json(), "uid_from": 3})
    assert "no longer follows" in s.compactor.commit(gap)


def test_background_pre_compaction_commits_at_the_compress_line(store_dir):
    s = Session("bg", store=store_dir, window_tokens=4096, llm=FakeLLM(), background_compaction=True)
    for i in range(60):
        s.chat(chatty(i))
        if s.compactor.pending is not None:
            s.compactor.pending.done.wait(10)
    kinds = [r["kind"] for r in s.ledger()]
    assert "compaction" in kinds
    phases = [r["phase"] for r in s.store.load_compactions("bg")]
    assert phases.count("started") == phases.count("finished") + phases.count("aborted") + (1 if s.compactor.pending else 0)
    assert s.coverage()["lost"] == 0


def test_range_selection_cuts_at_turn_starts_and_keeps_the_current_turn():
    events = []
    uid = 0
    for t in range(1, 6):
        uid += 1
        events.append(Event(uid, "s", t, "user", "question " * 200, turn_start=True))
        uid += 1
        events.append(Event(uid, "s", t, "assistant", "answer " * 200))
    choice = select_range(events, keep_tail_tokens=500, min_tokens=100)
    assert events[choice.start].turn_start and events[choice.end].turn_start
    assert choice.end <= len(events) - 2  # the current turn stays raw
    assert select_range(events[:2], 500, 100).reason == "only_current_turn"
    assert select_range(events, 500, 10**6).reason == "range_too_small"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tools"]), st.integers(1, 400)), min_size=1, max_size=40),
       st.integers(0, 3000))
def test_selected_ranges_never_split_a_tool_pair(shape, keep):
    events, uid, turn = [], 0, 0
    for kind, size in shape:
        uid += 1
        if kind == "tools":
            events.append(Event(uid, "s", turn, "assistant", "", tool_calls=({"id": f"c{uid}", "type": "function",
                          "function": {"name": "f", "arguments": "{}"}},), turn_start=bool(events) and events[-1].role == "tool"))
            uid += 1
            events.append(Event(uid, "s", turn, "tool", "x" * size, tool_call_id=f"c{uid - 1}"))
        else:
            turn += kind == "user"
            events.append(Event(uid, "s", turn, kind, "w " * size, turn_start=kind == "user" or not events))
    choice = select_range(events, keep, 1)
    if choice.start < choice.end:
        covered = events[choice.start:choice.end]
        calls = {c["id"] for e in covered for c in e.tool_calls}
        results = {e.tool_call_id for e in covered if e.role == "tool"}
        assert calls == results


def test_fact_track_extraction_and_budget():
    assert classify("ERROR lib/app.ex:42 undefined function") == ERROR
    assert classify("$ mix test --stale") == COMMAND
    assert classify("see notebooks/analysis.ipynb") == PATH
    assert classify("预算 2900万美元，3 晚共 1280 元") == NUMBER
    assert classify("2026年11月29日 出发") == NUMBER
    assert classify("just chatting about nothing") is None
    facts = extract("a " * 150 + "ends with 42 ms of latency and more words " + "z " * 60)
    assert facts and all(len(f.text) <= 201 for f in facts)  # head 150 + "…" + tail 50
    many = [Event(i + 1, "s", i + 1, "assistant", f"line {i}: took {i} ms\nTimeoutError: {i}") for i in range(100)]
    lines = lines_of(many)
    kept = budget(lines, max_tokens=2400, max_lines=40)
    assert len(kept.lines) == 40 and len(kept.dropped) == len({x.text for x in lines}) - 40
    assert sum(x.kind == ERROR for x in kept.lines) == 40  # every kept line is an error: they outrank numbers
    assert "[older fact lines of uids 1–" in kept.render()


def test_compact_magic(tmp_path, monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nb"))
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mfs_nb")
        shell.run_line_magic("compact", "")
        assert "nothing to compact" in capsys.readouterr().out
        doc = tmp_path / "notes.md"  # an attached document: compaction leaves a pointer in its place
        doc.write_text("# Pool notes\n\n" + "The pool was resized after the incident review. " * 80, encoding="utf-8")
        shell.run_cell_magic("chat", f"--no-stream --doc {doc}", "read these notes")
        for i in range(4):
            shell.run_cell_magic("chat", "--no-stream", f"question {i} about the pool")
        shell.run_line_magic("compact", "keep the numbers")
        out = capsys.readouterr().out
        assert "context compacted:" in out and "ctx " in out
    finally:
        InteractiveShell.clear_instance()


def test_compaction_rows_are_in_the_replay_report(tmp_path):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": chatty(i)} for i in range(80)]
    report = replay(normalise(msgs), window=4096)
    rows = [r for r in report["ledger"] if r["kind"] == "compaction"]
    assert rows and all({"tokens_before", "tokens_after", "llm_tokens", "uid_from", "uid_to", "duration_s",
                         "degraded", "tier"} <= r.keys() for r in rows)
    notices = [n for c in report["calls"] for n in c["notices"]]
    assert any(n.startswith("context compacted: ") for n in notices)
    json.dumps(report)


def test_rapid_refill_skips_one_automatic_compaction(store_dir):
    s = Session("refill", store=store_dir, window_tokens=4096, llm=FakeLLM(), background_compaction=False)
    for i in range(8):
        s.chat(chatty(i))
    c = s.compactor
    c.last_compaction_call = c.calls  # a compaction just happened
    assert c.on_tier("compress", synchronous_background=True) == [
        "context refilled right after a compaction; skipping one automatic compaction"]
    assert s.ledger()[-1] == {**s.ledger()[-1], "kind": "skip", "reason": "rapid_refill"}
    second = c.on_tier("compress", synchronous_background=True)  # only one is skipped
    assert not any("skipping" in n for n in second)


def test_a_segment_is_seen_by_other_threads_only_once_it_is_declared(store_dir, monkeypatch):
    """Deciding whether a segment makes the payload smaller projects the session with it in force
    (`payload_with`); the indexer and search, on their own threads, read `Host.segments()` meanwhile.
    Each time the meter is read during a compaction, another thread reads what they would: every segment
    it sees must already be declared in the store (a segment seen before is one that may never commit,
    its prose indexed under an id a later segment takes)."""
    import threading

    s = Session("race", store=store_dir, window_tokens=4096, llm=FakeLLM(default=REPLY), background_compaction=False)
    undeclared: list[int] = []
    reads = 0
    real = s.usage

    def read_elsewhere() -> None:
        nonlocal reads
        ids = [x.id for x in s.indexer.host.segments()]
        declared = {r["seq"] for r in s.store.load_compactions(s.name) if r["phase"] == "declared"}
        undeclared.extend(i for i in ids if i not in declared)
        reads += 1

    def watching(*args, **kwargs):
        t = threading.Thread(target=read_elsewhere)
        t.start()
        t.join()
        return real(*args, **kwargs)

    monkeypatch.setattr(s, "usage", watching)
    for i in range(30):
        s.chat(chatty(i))
    assert s.compactor.segments and reads > 30  # compactions ran while the other thread looked
    assert undeclared == []
