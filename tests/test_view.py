"""Projection: S1 full send and the tool pairing invariant (property-based)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mfs_nb.events import Event
from mfs_nb.layers.view import MISSING_RESULT, pair_tool_messages, project


def ev(uid, role, content="x", calls=(), call_id="", name=""):
    return Event(uid=uid, session="s", turn=1, role=role, content=content,
                 tool_calls=tuple({"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in calls),
                 tool_call_id=call_id, name=name)


def assert_paired(messages):
    """Every call is answered right after its assistant message; every result follows its call."""
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m["role"] in ("system", "user", "assistant", "tool")
        if m["role"] == "tool":
            raise AssertionError(f"tool result without its call at {i}")
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            results = [x.get("tool_call_id") for x in messages[i + 1:i + 1 + len(ids)]]
            assert results == ids and all(x["role"] == "tool" for x in messages[i + 1:i + 1 + len(ids)])
            i += 1 + len(ids)
            continue
        i += 1


def test_missing_result_gets_a_fixed_placeholder_and_orphan_becomes_a_note():
    events = [ev(1, "user"), ev(2, "assistant", calls=["a", "b"]), ev(3, "tool", "result a", call_id="a"),
              ev(4, "tool", "stray", call_id="zzz", name="cell_output"), ev(5, "assistant", "done")]
    msgs = [m for m, _ in pair_tool_messages(events)]
    assert_paired(msgs)
    assert msgs[2]["content"] == "result a" and msgs[3] == {"role": "tool", "tool_call_id": "b", "content": MISSING_RESULT}
    assert msgs[4] == {"role": "user", "content": "[tool result #4 from cell_output]\nstray"}


def test_project_layers_cover_every_uid():
    events = [ev(i, "user" if i % 2 else "assistant", f"m{i}") for i in range(1, 8)]
    view = project(events, "SYS")
    assert view.messages[0] == {"role": "system", "content": "SYS"}
    assert view.raw_uids() == set(range(1, 8))
    assert [(la.kind, la.uid_from, la.uid_to, la.messages) for la in view.layers] == \
           [("system", None, None, 1), ("raw", 1, 7, 7)]


@st.composite
def histories(draw):
    events, open_calls = [], []
    for uid in range(1, draw(st.integers(0, 40)) + 1):
        kind = draw(st.sampled_from(["user", "assistant", "calls", "tool", "stray"]))
        if kind == "calls":
            n = draw(st.integers(1, 3))
            ids = [f"c{uid}_{k}" for k in range(n)]
            open_calls = list(ids)
            events.append(ev(uid, "assistant", "", calls=ids))
        elif kind == "tool":
            cid = draw(st.sampled_from(open_calls)) if open_calls and draw(st.booleans()) else f"x{uid}"
            if cid in open_calls:
                open_calls.remove(cid)
            events.append(ev(uid, "tool", "out", call_id=cid))
        elif kind == "stray":
            events.append(ev(uid, "tool", "orphan", call_id=""))
        else:
            open_calls = []
            events.append(ev(uid, kind, "t"))
    return events


@settings(max_examples=500, deadline=None)
@given(histories())
def test_pairing_invariant_holds_for_any_history(events):
    view = project(events, "SYS")
    assert_paired(view.messages[1:])
    assert view.raw_uids() == {e.uid for e in events}


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 45), st.integers(0, 45), st.integers(0, 300))
def test_incremental_projection_equals_a_full_one(events, clear_before, prune_before, trim):
    from mfs_nb.layers.clearing import Clearing
    from mfs_nb.layers.view import RawCache

    events = [Event(e.uid, e.session, e.turn, e.role, e.content, tool_calls=e.tool_calls, tool_call_id=e.tool_call_id,
                    turn_start=e.role == "user" or (i > 0 and e.role == "assistant" and events[i - 1].role == "tool"))
              for i, e in enumerate(events)]
    cache = RawCache()
    clearing = Clearing(trim, clear_before, prune_before)
    for n in range(len(events) + 1):
        full = project(events[:n], "SYS", clearing=clearing)
        cached = project(events[:n], "SYS", clearing=clearing, cache=cache)
        assert cached.messages == full.messages and cached.forms == full.forms
        assert cached.clearing == full.clearing


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(-1, 45), st.integers(0, 5))
def test_reading_the_end_of_the_log_agrees_with_a_full_pass(events, uid, n):
    """`after` and `replies_before` bisect the uid-ordered log instead of scanning all of it."""
    from mfs_nb.events import after, replies_before

    assert list(after(events, uid)) == [e for e in events if e.uid > uid]
    full = [(e.uid, e.content) for e in events if e.uid < uid and e.role == "assistant" and e.content.strip()]
    assert replies_before(events, uid, n) == (full[-n:] if n else [])
