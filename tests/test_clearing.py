"""S2: trimming, clearing and pruning on the send copy; notebook tools; the compressor digest."""

from __future__ import annotations

import json
import re
import time

import pytest
from conftest import FakeLLM, tool_call, without_budget_note
from hypothesis import given, settings
from hypothesis import strategies as st
from test_view import assert_paired, histories

from mfs_nb import Session
from mfs_nb.events import content_hash
from mfs_nb.layers import clearing
from mfs_nb.layers.clearing import Clearing, apply, cleared_text, trimmed_text
from mfs_nb.layers.facts import tool_digest
from mfs_nb.layers.view import pair_tool_messages, project
from mfs_nb.recall.tools import MAX_RESULT_CHARS, Tool, call_tool

HANDLE = re.compile(r"recall_history\((\d+), (\d+)\)")


def big_output(i: int, n: int = 3000) -> str:
    return f"Compiling lib/app_{i}.ex\n" + ("row data 12345 " * (n // 15)) + f"\nERROR lib/app_{i}.ex:{i}: boom {i}\n"


def tool_session(store_dir, rounds: int = 30, window: int = 16000, size: int = 1500) -> tuple[Session, FakeLLM]:
    script = []
    for i in range(rounds):
        script += [tool_call("build", {"target": f"t{i}"}, f"call_{i}"), f"round {i} done"]
    fake = FakeLLM(script=script)
    s = Session("s2", store=store_dir, window_tokens=window, llm=fake)
    s.register_tool(Tool("build", "build a target", {"type": "object"}, lambda target: big_output(int(target[1:]), size)))
    for i in range(rounds):
        s.chat(f"build target t{i}")
    return s, fake


def test_old_results_are_cleared_once_with_a_notice_and_a_ledger_row(store_dir):
    s, fake = tool_session(store_dir)
    rows = [r for r in s.ledger() if r["kind"] == "clearing"]
    assert rows, "pressure crossed the warn line, so S2 must have acted"
    first = rows[0]
    assert first["cleared"] > 0 and first["tokens_after"] < first["tokens_before"] and first["chars_saved"] > 0
    view = s.send_view()
    cleared = [m for m, f in zip(view.messages, view.forms) if f == "cleared"]
    assert cleared and all(m["content"].startswith("[tool result cleared: build output, ") for m in cleared)
    # the newest rounds keep their full results
    assert view.messages[-2]["role"] == "tool" and view.forms[-2] == "full"
    assert_paired(view.messages[1:])
    assert all(p[0]["role"] == "system" for p in fake.received)


def test_notice_is_shown_once_and_payload_is_byte_stable_between_events(store_dir):
    s, fake = tool_session(store_dir)
    notices = [r for r in s.ledger() if r["kind"] == "clearing"]
    events_at = len(fake.received)
    s._llm = FakeLLM(default="plain answer")
    s.chat("a question without tools")
    s.chat("another one")
    assert [r for r in s.ledger() if r["kind"] == "clearing"] == notices  # no new event for ordinary turns
    a, b = without_budget_note(s._llm.received[0]), s._llm.received[1]
    assert b[: len(a)] == a, "an ordinary turn only appends to the payload"
    assert events_at > 0


def test_every_handle_recalls_the_original_bytes(store_dir):
    s, _ = tool_session(store_dir)
    view = s.send_view()
    originals = {e.uid: e for e in s.events}
    handles = [HANDLE.findall(m.get("content") or "") for m in view.messages]
    found = 0
    for pairs in handles:
        for a, b in pairs:
            (event,) = s.recall(int(a), int(b))
            assert event.sha256 == content_hash(originals[int(a)].content) and event.role == "tool"
            found += 1
    assert found > 0


def test_boundaries_survive_a_restart(store_dir):
    s, _ = tool_session(store_dir)
    again = Session("s2", store=store_dir, window_tokens=16000)
    assert again.send_view().messages == s.send_view().messages


def test_oversized_result_is_trimmed_with_facts_and_handle():
    content = "HEAD " + "x" * 60_000 + "\nTimeoutError: pool exhausted after 30.0 s\n" + "y" * 5_000 + " TAIL"
    text = trimmed_text(content, 1204)
    assert text.startswith("HEAD ") and text.endswith("[fact lines]\nTimeoutError: pool exhausted after 30.0 s")
    assert f"[… output trimmed: {len(content):,} chars; recall_history(1204, 1204) …]" in text
    assert "y TAIL" in text and len(text) < 1500
    assert cleared_text(content, 7, "cell_output") == f"[tool result cleared: cell_output output, {len(content):,} chars; recall_history(7, 7)]"


def test_huge_tool_result_in_the_log_is_trimmed_in_the_view_and_recallable(store_dir):
    huge = ("line of output 42\n" * 300_000)[:5_000_000]
    fake = FakeLLM(script=[tool_call("dump", {}), "ok"])
    s = Session("huge", store=store_dir, llm=fake, window_tokens=200_000)
    s.register_tool(Tool("dump", "dump", {"type": "object"}, lambda: huge))
    s.chat("dump it")
    result = [e for e in s.events if e.role == "tool"][0]
    assert len(result.content) <= MAX_RESULT_CHARS + 100  # the tool loop bounds what a tool returns
    s2 = Session("replayed", store=store_dir, window_tokens=200_000, llm=FakeLLM())
    s2.record("user", "show the log", new_turn=True)
    s2.record("assistant", "", tool_calls=[{"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}])
    s2.record("tool", huge, tool_call_id="c1", name="cat")
    view = s2.send_view()
    assert view.forms[-1] == "trimmed" and len(view.messages[-1]["content"]) < 2_000
    (uid,) = {int(a) for a, _ in HANDLE.findall(view.messages[-1]["content"])}
    assert s2.recall(uid)[0].content == huge


def test_pruned_arguments_stay_valid_json_with_a_handle():
    from mfs_nb.events import Event

    events = [Event(1, "s", 1, "user", "write it"),
              Event(2, "s", 1, "assistant", "", tool_calls=({"id": "w", "type": "function",
                    "function": {"name": "write", "arguments": json.dumps({"text": "z" * 5000})}},)),
              Event(3, "s", 1, "tool", "written", tool_call_id="w")]
    items, stats = apply(pair_tool_messages(events), Clearing(prune_before=3))
    args = items[1][0]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"cleared": "arguments of 5,012 chars; recall_history(2, 2)"}
    assert stats.pruned == 1 and items[1][2] == "pruned"


@settings(max_examples=500, deadline=None)
@given(histories(), st.integers(0, 45), st.integers(0, 45), st.integers(0, 400))
def test_pairing_holds_whatever_was_cleared_or_pruned(events, clear_before, prune_before, trim):
    view = project(events, "SYS", clearing=Clearing(trim, clear_before, prune_before))
    assert_paired(view.messages[1:])
    assert len(view.messages) == len(project(events, "SYS").messages)  # only contents change


def test_tool_that_raises_or_returns_50mb_gives_a_bounded_result():
    tools = {"boom": Tool("boom", "", {}, lambda: 1 / 0),
             "flood": Tool("flood", "", {}, lambda: "z" * 50_000_000)}
    assert call_tool(tools, "boom", "{}").startswith("error: boom failed: ZeroDivisionError")
    flood = call_tool(tools, "flood", "{}")
    assert len(flood) < MAX_RESULT_CHARS + 200 and "result cut" in flood


def test_tool_digest_keeps_head_tail_and_facts():
    text = "start\n" + "noise " * 5000 + "\nFAILED tests/test_pool.py::test_x - AssertionError\nend"
    digest = tool_digest(text)
    assert digest.startswith("start") and "FAILED tests/test_pool.py::test_x - AssertionError" in digest
    assert len(digest) < 1200 and tool_digest("short") == "short"


class _Hangs:
    def __repr__(self) -> str:
        time.sleep(30)
        return "never"


class _Raises:
    def __repr__(self) -> str:
        raise ValueError("no repr for you")


def test_notebook_tools(tmp_path, monkeypatch):
    import numpy as np
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from mfs_nb.notebook.kernel_tools import notebook_tools

    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell(config=cfg)
    try:
        shell.run_cell("import numpy as np\narr = np.arange(12).reshape(3, 4)", store_history=True)
        shell.run_cell("arr.sum()", store_history=True)
        shell.user_ns.update({"conf": {"pool": 30}, "hangs": _Hangs(), "raises": _Raises()})
        tools = {t.name: t for t in notebook_tools(shell)}
        out = call_tool(tools, "inspect_variable", '{"name": "arr"}')
        assert "shape: (3, 4)" in out and "dtype: int64" in out and "array(" in out
        assert "{'pool': 30}" in call_tool(tools, "inspect_variable", '{"name": "conf"}')
        assert "repr raised ValueError: no repr for you" in call_tool(tools, "inspect_variable", '{"name": "raises"}')
        started = time.monotonic()
        assert "did not finish within" in call_tool(tools, "inspect_variable", '{"name": "hangs"}')
        assert time.monotonic() - started < 5
        missing = call_tool(tools, "inspect_variable", '{"name": "nope"}')
        assert missing.startswith("error: no variable named 'nope'") and "arr" in missing
        assert call_tool(tools, "inspect_variable", '{"name": "os.system(1)"}').startswith("error: name must be")
        cell = call_tool(tools, "cell_output", '{"n": 2}')
        assert cell.startswith("In [2]:\narr.sum()") and "Out[2]:\nnp.int64(66)" in cell
        assert "no output value" in call_tool(tools, "cell_output", '{"n": 1}')
        assert call_tool(tools, "cell_output", '{"n": 99}').startswith("error: no cell [99]")
        assert np is not None
    finally:
        InteractiveShell.clear_instance()


def test_magics_register_notebook_tools_unless_opted_out(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nb"))
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mfs_nb")
        magics = shell.magics_manager.registry["MfsMagics"]
        session = magics.get_session()
        offered = lambda: {t["function"]["name"] for t in session._tool_schemas()}  # noqa: E731
        assert {"recall_history", "inspect_variable", "cell_output"} <= offered()
        # turned off on an open session, the notebook's tools leave the very next call, and a call the
        # model still makes to one is answered as an unknown tool, not run
        shell.run_line_magic("mfs", "config notebook_tools=false")
        assert "recall_history" in offered() and not {"inspect_variable", "cell_output"} & offered()
        shell.user_ns["secret_frame"] = 42
        from mfs_nb.recall.tools import call_tool

        assert call_tool(session._offered(), "inspect_variable", '{"name": "secret_frame"}').startswith(
            "error: unknown tool")
        shell.run_line_magic("mfs", "config notebook_tools=true")
        assert {"inspect_variable", "cell_output"} <= offered()
        shell.run_line_magic("mfs", "config tools=false")
        assert magics.get_session()._tool_schemas() == []
    finally:
        InteractiveShell.clear_instance()


def test_oversized_arguments_are_trimmed_to_valid_json_with_a_handle():
    from mfs_nb.events import Event

    big = json.dumps({"path": "lib/app.ex", "content": "defmodule App do\n" + "  x = 1\n" * 2000 + "end\n"})
    events = [Event(1, "s", 1, "user", "write it"),
              Event(2, "s", 1, "assistant", "", tool_calls=({"id": "w", "type": "function",
                    "function": {"name": "Write", "arguments": big}},)),
              Event(3, "s", 1, "tool", "written", tool_call_id="w")]
    items, stats = apply(pair_tool_messages(events), Clearing(trim_chars=2000))
    stub = json.loads(items[1][0]["tool_calls"][0]["function"]["arguments"])
    assert stub["trimmed"].startswith('{"path": "lib/app.ex"') and stub["trimmed"].endswith('end\\n"}')
    assert stub["note"] == f"arguments of {len(big):,} chars; recall_history(2, 2)"
    assert items[1][2] == "trimmed" and stats.trimmed == 1 and stats.chars_saved > 10_000


def coding_transcript(rounds: int, size: int = 1800) -> list[dict]:
    out: list[dict] = []
    for i in range(rounds):
        out += [{"role": "user", "content": f"build target t{i} and tell me what broke in lib/app_{i}.ex"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "build", "arguments": f'{{"target": "t{i}"}}'}}]},
                {"role": "tool", "content": big_output(i, size)},
                {"role": "assistant", "content": f"t{i} fails at lib/app_{i}.ex:{i} with boom {i}; the rest compiles."}]
    return out


def _resets(report: dict) -> int:
    calls = report["calls"]
    return sum(1 for p, c in zip(calls, calls[1:]) if c["shared_prefix_tokens"] < 0.5 * p["payload_tokens"])


@pytest.mark.slow  # over 15 s (see pyproject: run with -m slow)
def test_a_clearing_and_a_compaction_share_one_cache_miss(monkeypatch):
    """Both rewrite the payload from the history layers on, so a compaction ready at a clearing is
    committed with it, and a compaction clears whatever it frees at all: fewer resets of the prefix."""
    from mfs_nb.commands.replay import normalise, replay
    from mfs_nb.compaction import Compactor

    messages = normalise(coding_transcript(70))
    together = replay(messages, window=8000)
    notices = [c["notices"] for c in together["calls"]]
    both = [n for n in notices if any(x.startswith("cleared ") for x in n) and any("compacted" in x for x in n)]
    assert both, "a clearing with cold history behind it must take the compaction along"
    assert together["coverage"]["lost"] == 0 and all(c["payload_tokens"] <= 8000 for c in together["calls"])

    monkeypatch.setattr(Compactor, "piggyback", lambda self, tier, sync, effective=None: [])
    monkeypatch.setattr(Session, "_clear_tool_results",
                        lambda self, view, usage, min_gain=0.0, _f=Session._clear_tool_results:
                        _f(self, view, usage, clearing.MIN_GAIN))
    apart = replay(messages, window=8000)
    assert _resets(together) < _resets(apart)


def test_a_clearing_clears_the_oldest_rounds_only_as_far_as_its_target(store_dir):
    """S2 clears down to HEADROOM below the warn line, the oldest rounds first and no further: one round
    fewer would have left the payload over its target, and rounds older than the newest KEEP_ROUNDS stay
    whole when the target did not need them (until 2026-12-05 every round but those was cleared)."""
    script = []
    for i in range(60):
        script += [tool_call("build", {"target": f"t{i}"}, f"call_{i}"), f"round {i} done"]
    s = Session("s2t", store=store_dir, window_tokens=24000, llm=FakeLLM(script=script), auto_compaction=False)
    s.register_tool(Tool("build", "build a target", {"type": "object"}, lambda target: big_output(int(target[1:]), 1500)))
    fewer: list[int] = []
    chosen = s._clear_to_target

    def at_the_clearing(current, starts, target):  # one round fewer, measured when the clearing is chosen
        found = chosen(current, starts, target)
        if found is not None:
            earlier = max(u for u in clearing.rounds(s.events) if u < found[0].clear_before)
            fewer.append(s.usage(s.send_view(Clearing(current.trim_chars, earlier, current.prune_before))).tokens)
        return found

    s._clear_to_target = at_the_clearing
    for i in range(60):
        s.chat(f"build target t{i}")
        if any(r["kind"] == "clearing" for r in s.ledger()):
            break
    row = next(r for r in s.ledger() if r["kind"] == "clearing")
    view = s.send_view()
    usage = s.usage(view)
    target = (s.profile().warn - clearing.HEADROOM) * usage.effective
    assert row["tokens_after"] < target <= row["tokens_before"]
    assert fewer and fewer[0] >= target  # one round fewer would not have reached the target
    starts = clearing.rounds(s.events)
    old_full = [u for u, f, m in zip(view.uids, view.forms, view.messages)
                if m["role"] == "tool" and f == "full" and u is not None and u < starts[-clearing.KEEP_ROUNDS]]
    assert old_full  # rounds older than the kept ones are still whole: the target did not need them
