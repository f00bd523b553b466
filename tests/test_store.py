"""The LanceDB log: idempotent writes, no rewrites, concurrent writers."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from conftest import FakeLLM

import mfs_nb
from mfs_nb import Session
from mfs_nb.events import Event
from mfs_nb.store import Store


def test_retried_write_is_a_no_op(store_dir):
    store = Store(store_dir)
    e = Event(uid=1, session="s", turn=1, role="user", content="hello", turn_start=True, created_at="t")
    store.append_events([e], writer="w1")
    store.append_events([e], writer="w1")  # a retry after a timeout, say
    assert [x.content for x in store.load_events("s")] == ["hello"]


def test_no_code_path_updates_or_deletes_events():
    source = (Path(mfs_nb.__file__).parent / "store.py").read_text()
    events_writes = re.findall(r"self\._events\.(\w+)\(", source)
    assert set(events_writes) <= {"merge_insert", "add", "search", "count_rows", "to_arrow", "optimize"}
    assert "when_matched_update_all" not in source.split("def append_events")[1].split("def load_events")[0]


def test_a_plain_append_still_refuses_another_writers_uid_and_skips_a_retry(store_dir):
    from mfs_nb.store import UidConflict

    store = Store(store_dir)
    names = {c for i in store._events.list_indices() for c in i.columns}
    assert {"key", "session", "uid"} <= names  # a write and a load look keys and uids up, no scan
    a = Event(uid=1, session="s", turn=1, role="user", content="mine", turn_start=True, created_at="t")
    store.append_events([a], writer="w1")
    versions = store._events.version
    store.append_events([a], writer="w1")  # a retry: nothing written, not even a new version
    assert store._events.version == versions
    b = Event(uid=1, session="s", turn=1, role="user", content="theirs", turn_start=True, created_at="t")
    try:
        store.append_events([b, Event(uid=2, session="s", turn=1, role="assistant", content="x", created_at="t")], "w2")
        raise AssertionError("another writer's uid was taken")
    except UidConflict:
        pass
    assert [(e.uid, e.content) for e in store.load_events("s")] == [(1, "mine")]  # nothing of the refused batch
    # another kernel (its own Store) appends uid 2; ours, unaware, tries uid 2 next: refused, not duplicated
    other = Store(store_dir)
    other.append_events([Event(uid=2, session="s", turn=2, role="user", content="theirs", created_at="t")], "w3")
    try:
        store.append_events([Event(uid=2, session="s", turn=2, role="user", content="mine too", created_at="t")], "w1")
        raise AssertionError("a uid another kernel holds was appended again")
    except UidConflict:
        pass
    store.append_events([Event(uid=3, session="s", turn=3, role="user", content="next", created_at="t")], "w1")
    assert [(e.uid, e.content) for e in other.load_events("s")] == [(1, "mine"), (2, "theirs"), (3, "next")]


def test_store_uri_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MFS_STORE", str(tmp_path / "envstore"))
    s = Session("e", llm=FakeLLM())
    s.chat("x")
    assert s.store.uri == str(tmp_path / "envstore") and (tmp_path / "envstore").is_dir()


def test_concurrent_kernels_lose_and_duplicate_nothing(store_dir):
    Session("race", store=store_dir)  # create the tables once
    errors: list[BaseException] = []

    def kernel(tag: str) -> None:
        try:
            s = Session("race", store=Store(store_dir), llm=FakeLLM(default=f"reply {tag}"))
            for i in range(6):
                s.chat(f"{tag}-{i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=kernel, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    events = Store(store_dir).load_events("race")
    assert [e.uid for e in events] == list(range(1, 25))
    assert sorted(e.content for e in events if e.role == "user") == sorted(f"{t}-{i}" for t in "ab" for i in range(6))


def test_lancedb_import_defers_only_the_rest_clients_init(tmp_path):
    """The REST client's package `__init__` is skipped at import, and runs the moment anything it
    defines is asked for; a local store works either way."""
    import subprocess
    import sys

    code = """
import sys
from mfs_nb import store
lancedb = store.lancedb_module()
client = sys.modules["lance_namespace_urllib3_client"]
before = "lance_namespace_urllib3_client.api.table_api" in sys.modules
s = store.Store(sys.argv[1])
from mfs_nb.events import Event
s.append_events([Event(uid=1, session="s", turn=1, role="user", content="hi", turn_start=True, created_at="t")], writer="w")
rows = [e.content for e in s.load_events("s")]
api = client.TableApi  # defined by the package __init__: now it runs
after = "lance_namespace_urllib3_client.api.table_api" in sys.modules
print(before, rows, after, api.__name__)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "st")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.split() == ["False", "['hi']", "True", "TableApi"]


def test_optimize_folds_versions_and_fragments_and_loses_nothing(store_dir, tmp_path, monkeypatch, capsys):
    """Issue 19, table maintenance: `Session.optimize` / `%mfs optimize` compacts small fragments and
    removes old versions of every table, in the ledger with its effect; never while another kernel
    holds the compaction lock."""
    from conftest import FakeLLM

    from mfs_nb import Session

    s = Session("opt", store=store_dir, llm=FakeLLM(prompt_tokens=300))
    for i in range(25):
        s.chat(f"turn {i}: keep the pool under {20 + i}")
    events, payload = s.events, s.send_view().messages
    notices = s.optimize(keep_s=0.001)
    assert notices[0].startswith("store optimized in ")
    row = [r for r in s.ledger() if r["kind"] == "maintenance"][-1]
    assert row["versions"][1] < row["versions"][0] and row["fragments"][1] < row["fragments"][0]
    assert row["bytes"][1] < row["bytes"][0] and not row["errors"]
    again = Session("opt", store=store_dir, llm=FakeLLM())
    assert again.events == events and again.send_view().messages == payload
    s.chat("still usable after maintenance")
    s.compactor.pending = object()  # this kernel's own background compaction, under way
    assert "background compaction of this session is under way" in s.optimize(keep_s=0.001)[0]
    s.compactor.pending = None
    other = Session("opt", store=store_dir, llm=FakeLLM())
    assert other.compactor._acquire(0.0) is None  # another kernel holds the compaction lock
    try:
        assert "was not optimized" in s.optimize(keep_s=0.001)[0]
    finally:
        other.compactor._release()


def test_mfs_optimize_magic(ip, capsys):
    ip.run_cell("%%chat\nhello", store_history=True)
    capsys.readouterr()
    ip.run_line_magic("mfs", "optimize")
    assert capsys.readouterr().out.startswith("store optimized in ")
    ip.run_line_magic("mfs", "optimize now")
    assert "takes no arguments" in capsys.readouterr().err
