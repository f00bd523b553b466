"""The LanceDB log: idempotent writes, no rewrites, concurrent writers."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from conftest import FakeLLM

import mfs_nb
from mfs_nb import Session
from mfs_nb.events import Event
from mfs_nb.store import Store


def test_retried_write_is_a_no_op(store_uri):
    store = Store(store_uri)
    e = Event(uid=1, session="s", turn=1, role="user", content="hello", turn_start=True, created_at="t")
    store.append_events([e], writer="w1")
    store.append_events([e], writer="w1")  # a retry after a timeout, say
    assert [x.content for x in store.load_events("s")] == ["hello"]


def test_no_code_path_updates_or_deletes_events():
    package = Path(mfs_nb.__file__).parent / "store"
    source = "\n".join(p.read_text() for p in sorted(package.glob("*.py")))
    events_writes = re.findall(r"self\._events\.(\w+)\(", source)
    assert events_writes and set(events_writes) <= {"merge_insert", "add", "search", "count_rows", "to_arrow",
                                                    "optimize"}
    log = (package / "eventlog.py").read_text()
    assert "when_matched_update_all" not in log.split("def append_events")[1].split("def load_events")[0]


def test_a_plain_append_still_refuses_another_writers_uid_and_skips_a_retry(store_uri):
    from mfs_nb.store import UidConflict

    store = Store(store_uri)
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
    other = Store(store_uri)
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


def test_concurrent_kernels_lose_and_duplicate_nothing(store_uri):
    Session("race", store=store_uri)  # create the tables once
    errors: list[BaseException] = []

    def kernel(tag: str) -> None:
        try:
            s = Session("race", store=Store(store_uri), llm=FakeLLM(default=f"reply {tag}"))
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
    events = Store(store_uri).load_events("race")
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


@pytest.mark.slow  # over 15 s (see pyproject: run with -m slow)
def test_optimize_folds_versions_and_fragments_and_loses_nothing(store_uri, tmp_path, monkeypatch, capsys):
    """Issue 19, table maintenance: `Session.optimize` / `%mfs optimize` compacts small fragments and
    removes old versions of every table, in the ledger with its effect; never while another kernel
    holds the compaction lock."""
    from conftest import FakeLLM

    from mfs_nb import Session

    s = Session("opt", store=store_uri, llm=FakeLLM(prompt_tokens=300))
    for i in range(25):
        s.chat(f"turn {i}: keep the pool under {20 + i}")
    events, payload = s.events, s.send_view().messages
    notices = s.optimize(keep_s=0.001)
    assert notices[0].startswith("store optimized in ")
    row = [r for r in s.ledger() if r["kind"] == "maintenance"][-1]
    assert row["fragments"][1] < row["fragments"][0] and not row["errors"]
    if "://" not in store_uri:  # object storage keeps versions an hour at least (clock skew between machines)
        assert row["versions"][1] < row["versions"][0] and row["bytes"][1] < row["bytes"][0]
    again = Session("opt", store=store_uri, llm=FakeLLM())
    assert again.events == events and again.send_view().messages == payload
    s.chat("still usable after maintenance")
    s.compactor.pending = object()  # this kernel's own background compaction, under way
    assert "background compaction of this session is under way" in s.optimize(keep_s=0.001)[0]
    s.compactor.pending = None
    other = Session("opt", store=store_uri, llm=FakeLLM())
    assert other.compactor.state.acquire(0.0) is None  # another kernel holds the compaction lock
    try:
        assert "was not optimized" in s.optimize(keep_s=0.001)[0]
    finally:
        other.compactor.state.release()


def test_a_quiet_moment_folds_the_store_then_removes_what_the_fold_replaced_and_loses_nothing(store_dir, monkeypatch):
    """Issue 19, maintenance at quiet moments: a second after the last turn the session folds every
    table in the background (a `maintenance` ledger row, trigger quiet). The fold's rewrite leaves the
    data it replaced in versions younger than QUIET_KEEP_S; once they are that old one more run removes
    them, so a store left alone keeps one version per table (issue 43: that was half the recall index
    of a store at rest). Then nothing more runs until something is written."""
    import time

    from mfs_nb.session import memory as session_module

    monkeypatch.setattr(session_module, "QUIET_KEEP_S", 0.5)
    s = Session("quiet", store=store_dir, llm=FakeLLM(prompt_tokens=300), quiet_maintenance_s=1)
    for i in range(25):
        s.chat(f"turn {i}: keep the pool under {20 + i}")
    events, payload = s.events, s.send_view().messages

    def folds() -> list[dict]:
        return [r for r in s.ledger() if r["kind"] == "maintenance"]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(folds()) < 2 or not s._quiet.settled()):
        time.sleep(0.2)
    first, second = folds()
    assert first["trigger"] == second["trigger"] == "quiet" and not first["errors"] and not second["errors"]
    assert first["fragments"][1] < first["fragments"][0] and first["versions"][1] < first["versions"][0]
    layout = {name: t["after"] for name, t in s.store.maintain(keep_s=3600)["tables"].items()}  # removes nothing
    assert first["versions"][1] > len(layout)  # the fold left what it replaced, in versions too young to remove
    assert second["bytes"][1] < first["bytes"][1]
    # every table but the two each run writes itself (its ledger row, the compaction lock) is down to one version
    assert all(t["versions"] == 1 for name, t in layout.items() if name not in ("ledger", "leases")), layout
    time.sleep(2.0)  # nothing was written since: no third run
    assert len(folds()) == 2 and s._quiet.runs == 2
    again = Session("quiet", store=store_dir, llm=FakeLLM())
    assert again.events == events and again.send_view().messages == payload
    s.chat("still usable after maintenance")


def test_the_quiet_fold_does_not_run_again_while_the_recall_index_is_catching_up(store_dir, monkeypatch):
    """The index's end starts the quiet clock again; folding its tables every half minute meanwhile
    (12 folds while 10,000 events were indexed) only competed with it."""
    import time

    from mfs_nb.session import memory as session_module

    monkeypatch.setattr(session_module, "QUIET_KEEP_S", 0.5)
    s = Session("quiet", store=store_dir, llm=FakeLLM(prompt_tokens=300), quiet_maintenance_s=1)
    monkeypatch.setattr(s.indexer, "wait", lambda timeout=None: False)  # a backlog still being embedded
    for i in range(10):
        s.chat(f"turn {i}: keep the pool under {20 + i}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not s._quiet.runs:
        time.sleep(0.2)
    time.sleep(3.0)  # a second run would have come 1.5 s after the first
    assert s._quiet.runs == 1 and s._quiet.settled()


def test_a_turn_that_starts_stops_the_quiet_fold_between_tables():
    from mfs_nb.store.quiet import Quiet

    seen: list[bool] = []
    started, release = threading.Event(), threading.Event()

    def work(stop):
        started.set()
        seen.append(stop())
        release.wait(10)
        seen.append(stop())

    q = Quiet(work, lambda: 1.0)
    q.turn_started()
    q.turn_ended()
    assert started.wait(10)
    q.turn_started()  # a turn begins while the fold runs: it is told to stop
    release.set()
    for _ in range(100):
        if q.runs:
            break
        threading.Event().wait(0.05)
    assert seen == [False, True] and q.runs == 1
    off = Quiet(work, lambda: 0.0)  # quiet_maintenance_s = 0: no thread at all
    off.turn_ended()
    assert off._thread is None


def test_quiet_runs_asked_for_stop_at_reruns_or_when_the_work_asks_no_more_and_a_turn_under_way_cancels_them():
    """A fold can rewrite again in the run it asked for (the first left two fragments the second
    merged), so a run asked for may ask once more; other writers to the store (another kernel,
    another session's index) could make every run find something rewritten, so at most RERUNS runs
    follow the first of a quiet stretch."""
    from mfs_nb.store.quiet import RERUNS, Quiet

    runs: list[float] = []
    q = Quiet(lambda stop: (runs.append(time.monotonic()), 0.2)[1], lambda: 0.3)  # always asks again
    q.turn_started()
    q.turn_ended()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(runs) < 1 + RERUNS or not q.settled()):
        time.sleep(0.05)
    time.sleep(0.6)
    assert len(runs) == 1 + RERUNS and q.settled()
    q.turn_ended()  # a new stretch may ask again as many times
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(runs) < 2 * (1 + RERUNS) or not q.settled()):
        time.sleep(0.05)
    time.sleep(0.6)
    assert len(runs) == 2 * (1 + RERUNS) and q.settled()

    asks = [0.2, 0.2, None, 0.2]  # the third run rewrote nothing: it asks for nothing, and nothing follows
    runs.clear()
    q = Quiet(lambda stop: (runs.append(time.monotonic()), asks[len(runs) - 1])[1], lambda: 0.3)
    q.turn_ended()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(runs) < 3 or not q.settled()):
        time.sleep(0.05)
    time.sleep(0.6)
    assert len(runs) == 3 and q.settled()

    def starts_a_turn(stop):
        q.turn_started()  # a turn begins as the run ends: no second run while it is under way
        runs.append(time.monotonic())
        return 0.2

    runs.clear()
    q = Quiet(starts_a_turn, lambda: 0.3)
    q.turn_ended()
    while time.monotonic() < deadline + 10 and not runs:
        time.sleep(0.05)
    time.sleep(0.8)
    assert len(runs) == 1 and q.settled()


def test_mfs_optimize_magic(ip, capsys):
    ip.run_cell("%%chat\nhello", store_history=True)
    capsys.readouterr()
    ip.run_line_magic("mfs", "optimize")
    assert capsys.readouterr().out.startswith("store optimized in ")
    ip.run_line_magic("mfs", "optimize now")
    assert "takes no arguments" in capsys.readouterr().err


# -- object storage (the loopback S3 server of conftest) -----------------------------------------
def _event(uid: int, content: str, created_at: str = "2026-01-01T00:00:00.000Z") -> Event:
    return Event(uid=uid, session="s", turn=uid, role="user", content=content, turn_start=True, created_at=created_at)


def test_on_object_storage_the_first_committed_row_wins_a_race(s3_endpoint, monkeypatch, tmp_path):
    """Two machines append uid 1 at the same moment (no lock file can join them): both rows land, each
    writer reads the key again, and only the first committed is told its event is saved, even when
    the later one's clock says it came first. Every reader, then and after compaction, sees that row."""
    from conftest import use_s3

    from mfs_nb.store import UidConflict

    use_s3(monkeypatch, s3_endpoint)
    uri = f"s3://mfs-test/{tmp_path.name}"
    a, b = Store(uri), Store(uri)
    a.append_events([_event(1, "a's", "2026-01-01T00:00:05.000Z")], "wa")
    real, calls = b._rows_under, []

    def looked_up_before_a_committed(keys: str) -> dict:
        calls.append(keys)
        return {} if len(calls) == 1 else real(keys)

    monkeypatch.setattr(b, "_rows_under", looked_up_before_a_committed)
    try:
        b.append_events([_event(1, "b's", "2026-01-01T00:00:01.000Z")], "wb")  # an earlier clock
        raise AssertionError("the later commit was told it won")
    except UidConflict:
        pass
    assert len(calls) == 2  # the look-up, then the check after its commit
    for reader in (a, b, Store(uri)):
        assert [(e.uid, e.content) for e in reader.load_events("s")] == [(1, "a's")]
    b.append_events([_event(2, "b's again")], "wb")  # the loser takes the next uid
    Store(uri).maintain()
    assert [(e.uid, e.content) for e in Store(uri).load_events("s")] == [(1, "a's"), (2, "b's again")]


def test_a_session_on_object_storage_writes_nothing_locally(s3_endpoint, monkeypatch, tmp_path):
    """Events, state, snapshots of attached and pasted documents: all in the bucket; the working
    folder stays empty, and `gc` collects an orphan snapshot there too."""
    import os
    import time

    from conftest import use_s3

    from mfs_nb.layers import snapshots

    use_s3(monkeypatch, s3_endpoint)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nthe pool size is 42 on db-7\n")
    uri = f"s3://mfs-test/{tmp_path.name}"
    s = Session("remote", store=uri, window_tokens=8000, llm=FakeLLM())
    r = s.chat("read this", docs=[doc])
    s.chat("# Runbook\n\n" + "\n".join(f"- step {i}: run make deploy-{i} and check the dashboard" for i in range(40)))
    paths = {p for p, _, _ in s.store.files.listing()}
    assert s.verbatim.verdicts[r.uids[0]].snapshots[0]["path"] in paths and len(paths) == 2
    orphan = snapshots.write(s.store.files, "nobody names me", "orphan")
    assert snapshots.garbage(s.store, [], dry_run=True) == []  # within the grace period
    gone = snapshots.garbage(s.store, [], now=time.time() + 49 * 3600)
    assert gone == [(orphan.path, len("nobody names me"))] and {p for p, _, _ in s.store.files.listing()} == paths
    again = Session("remote", store=uri, window_tokens=8000, llm=FakeLLM())
    assert again.events == s.events and again.send_view().messages == s.send_view().messages
    assert os.listdir(work) == []


@pytest.mark.parametrize("case", ["no bucket", "no credentials", "refused"])
def test_a_bad_object_store_is_one_line_naming_it_without_secrets(case, s3_endpoint, monkeypatch, tmp_path):
    from conftest import use_s3

    from mfs_nb.errors import StoreError

    use_s3(monkeypatch, s3_endpoint)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    monkeypatch.chdir(tmp_path)
    uri = f"s3://mfs-test/{case.replace(' ', '-')}"
    if case == "no bucket":
        uri = "s3://no-such-bucket/p"
    elif case == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(StoreError) as info:
        Session("x", store=uri, llm=FakeLLM())
    line = str(info.value)
    assert "\n" not in line and uri in line and "very-secret-value" not in line
    assert {"no bucket": "bucket does not exist", "no credentials": "credentials are missing",
            "refused": "cannot be reached"}[case] in line
    assert list(tmp_path.iterdir()) == []  # nothing written locally by mistake


@pytest.mark.slow  # over 10 s (see pyproject: run with -m slow)
def test_the_store_going_away_mid_turn_says_what_was_kept(monkeypatch, tmp_path):
    """The object store stops while the model answers: the user's message was saved, the reply was
    not, and the error says so; with the store back, re-running the turn works and no event is half
    written. With the store away before the turn, nothing is saved and the message is still in the cell."""
    import socket

    from conftest import S3_BUCKET, use_s3
    from moto.server import ThreadedMotoServer

    from mfs_nb.bench.storebench import start_s3
    from mfs_nb.errors import StoreError

    with socket.socket() as sock:  # a port of our own, to start the server again on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server, endpoint = start_s3(S3_BUCKET + "-away", port)
    use_s3(monkeypatch, endpoint)
    uri = f"s3://{S3_BUCKET}-away/{tmp_path.name}"
    running = [True]

    def stop_while_answering(messages):
        server.stop()
        running[0] = False
        return "an answer that cannot be saved"

    try:
        s = Session("away", store=uri, llm=FakeLLM(script=["first answer", stop_while_answering]))
        s.chat("first question")
        with pytest.raises(StoreError, match="your message was saved as uid 3, the reply was not: re-run the cell"):
            s.chat("second question")
        with pytest.raises(StoreError, match=r"nothing of this turn is confirmed saved \(your message is still in the cell\)"):
            s.chat("third question")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)  # the store is back
        server.start()
        running[0] = True
        s.chat("second question")
        events = Store(uri).load_events("away")
        assert [(e.uid, e.role, e.content) for e in events] == [
            (1, "user", "first question"), (2, "assistant", "first answer"), (3, "user", "second question"),
            (4, "user", "second question"), (5, "assistant", "ok")]
    finally:
        if running[0]:
            server.stop()


def test_messages_never_show_a_password_or_a_secret(monkeypatch):
    from mfs_nb.store import shown_uri

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-secret")
    uri = "s3://AKIAUSER:topsecretpw@bucket/prefix"
    assert shown_uri(uri) == "s3://bucket/prefix"
    assert shown_uri("abfss://container@account.dfs.core.windows.net/p") == "abfss://container@account.dfs.core.windows.net/p"
    exc = ValueError("request to https://AKIAUSER:topsecretpw@bucket.s3/x?X-Amz-Signature=abc123&sig=def456 failed "
                     "with key wJalrXUtnFEMI-secret")
    from mfs_nb.store.connection import store_problem

    line = store_problem(uri, "events", exc)
    assert "\n" not in line and "s3://bucket/prefix" in line
    for secret in ("topsecretpw", "abc123", "def456", "wJalrXUtnFEMI-secret"):
        assert secret not in line


def test_object_storage_refuses_to_write_a_table_that_cannot_settle_a_race(s3_endpoint, monkeypatch, tmp_path):
    """An events table made before stable row ids (no marker) would let two machines both be told their
    event is saved: on object storage it is read, never written."""
    import pyarrow as pa
    from conftest import use_s3

    from mfs_nb.errors import StoreError
    from mfs_nb.store import EVENTS_SCHEMA, SESSIONS_SCHEMA, lancedb_module

    use_s3(monkeypatch, s3_endpoint)
    uri = f"s3://mfs-test/{tmp_path.name}"
    db = lancedb_module().connect(uri)
    old = db.create_table("events", schema=EVENTS_SCHEMA)
    db.create_table("sessions", schema=SESSIONS_SCHEMA)
    old.add(pa.Table.from_pylist([_event(1, "from an older version").to_row("w0")], schema=EVENTS_SCHEMA))
    store = Store(uri)
    assert [e.content for e in store.load_events("s")] == ["from an older version"]
    with pytest.raises(StoreError, match="made by an older mfs_nb"):
        store.append_events([_event(2, "new")], "w1")
    assert [e.uid for e in Store(uri).load_events("s")] == [1]


def test_a_state_row_that_cannot_be_saved_after_the_turn_is_a_notice_not_a_lost_reply(store_dir, monkeypatch):
    from mfs_nb.errors import StoreError

    s = Session("meta", store=store_dir, llm=FakeLLM(script=["the answer"]))

    def refuse(*args, **kwargs):
        raise StoreError("table sessions of the store cannot be written (disk full)")

    monkeypatch.setattr(s.store, "save_meta", refuse)
    reply = s.chat("a question")
    assert reply.text == "the answer" and any("state row was not saved" in n for n in reply.notices)
    assert [e.content for e in Store(store_dir).load_events("meta")] == ["a question", "the answer"]


def test_vectors_are_stored_as_float16_and_an_older_float32_table_keeps_working(store_uri):
    """Issue 19 (store size): a new store keeps recall vectors and origin vectors in float16 (half the
    bytes) and latent weights in one byte each, steps of the row's largest; a table an older mfs_nb
    wrote (float32 vectors, float16 weights) is written and searched as it is."""
    import numpy as np
    import pyarrow as pa

    from mfs_nb.store import schemas as st

    s = Store(store_uri)
    fields = {"session": "s", "kind": "event", "uid_to": 0, "turn": 1, "role": "user", "chunk": 0}
    rows = [{**fields, "key": f"k{u}", "uid": u, "uid_to": u, "vector": v}
            for u, v in ((1, [1.0, 0.0, 0.0, 0.0]), (2, [0.0, 1.0, 0.0, 0.0]), (3, [0.6, 0.8, 0.0, 0.0]))]
    s.index_vectors("new/4d", rows)
    s.save_vectors("new/4d", "s", [(1, [0.5, 0.5, 0.5, 0.5])])
    s.index_latent("new/4d", [{k: r[k] for k in ("key", "session", "kind", "uid", "uid_to", "turn", "role", "chunk")}
                              | {"terms": [7, 9], "weights": [1.25, 0.5]} for r in rows])
    db = s._db
    for name in (st.recall_vectors_name("new/4d"), st.vectors_table_name("new/4d")):
        assert db.open_table(name).schema.field("vector").type.value_type == pa.float16(), name
    assert db.open_table(st.recall_latent_name("new/4d")).schema.field("weights").type.value_type == pa.int8()
    hits = s.search_vectors("new/4d", "session = 's'", [0.59, 0.81, 0.0, 0.0], 3)
    assert [h["uid"] for h in hits] == [3, 2, 1]
    weights = s.latent_rows("new/4d", "session = 's'", [1])[0]["weights"]
    assert weights[0] == pytest.approx(1.25) and weights[1] == pytest.approx(0.5, abs=1.25 / 254)  # half a step
    s.index_latent("new/4d", [{**fields, "key": "nan", "uid": 4, "terms": [1, 2, 3], "weights": [0.0, float("nan"), -2.0]}])
    assert s.latent_rows("new/4d", "session = 's'", [4])[0]["weights"].tolist() == [0.0, 0.0, -2.0]  # NaN weighs nothing

    # an older store's latent table: float16 weights, no scale
    old_latent = pa.schema([(f.name, pa.list_(pa.float16()) if f.name == "weights" else f.type)
                            for f in st.RECALL_LATENT_SCHEMA if f.name != "scale"])
    s._table(st.recall_latent_name("old/4d"), old_latent)
    s.index_latent("old/4d", [{**fields, "key": "k1", "uid": 1, "terms": [7, 9], "weights": [1.25, 0.5]}])
    assert "scale" not in db.open_table(st.recall_latent_name("old/4d")).schema.names
    assert s.latent_rows("old/4d", "session = 's'", [1])[0]["weights"].tolist() == [1.25, 0.5]  # exact in float16
    s.index_latent("old/4d", [{**fields, "key": "bad", "uid": 2, "terms": [1, 2], "weights": [1.0, 2.0, 3.0]}])
    from mfs_nb.errors import StoreError

    with pytest.raises(StoreError, match="differ in length"):  # a damaged row: said, not read onto its neighbour
        s.latent_rows("old/4d", "session = 's'", [1, 2])

    # an older store: the same tables made in float32 before this change
    old = pa.schema([(f.name, pa.list_(pa.float32(), 4) if f.name == "vector" else f.type)
                     for f in st.recall_vectors_schema("old/4d", 4)],
                    metadata={"embedding_model": "old/4d", "dim": "4"})
    s._table(st.recall_vectors_name("old/4d"), old)
    s.index_vectors("old/4d", rows)
    assert db.open_table(st.recall_vectors_name("old/4d")).schema.field("vector").type.value_type == pa.float32()
    got = s.search_vectors("old/4d", "session = 's'", [0.59, 0.81, 0.0, 0.0], 1)
    assert got[0]["uid"] == 3
    stored = db.open_table(st.recall_vectors_name("old/4d")).search().where("uid = 3").to_list()[0]["vector"]
    assert np.array_equal(np.float32(stored), np.float32([0.6, 0.8, 0.0, 0.0]))  # float32 kept exactly


def test_a_closed_session_leaves_no_thread_writing_into_its_folder(tmp_path):
    """A store folder deleted right after its last chat (a benchmark's temporary folder, a test's) must
    not meet the recall indexer or the quiet fold still writing into it: `Session.close` ends both,
    writes the waiting call rows, and the folder can go. The log reads back whole afterwards."""
    import shutil

    folder = tmp_path / "gone"
    s = Session("closing", store=str(folder), llm=FakeLLM(prompt_tokens=300), quiet_maintenance_s=1)
    for i in range(6):
        s.chat(f"turn {i}: the pool stays under {20 + i}")
    s.close()
    alive = [t.name for t in threading.enumerate() if t.name in ("mfs-index-closing", "mfs-quiet-closing")]
    assert alive == []
    assert [e.content for e in Session("closing", store=str(folder), llm=FakeLLM()).events if e.role == "user"] \
        == [f"turn {i}: the pool stays under {20 + i}" for i in range(6)]
    s._quiet.turn_ended()  # a late write after close starts nothing
    assert s._quiet._thread is None or not s._quiet._thread.is_alive()
    shutil.rmtree(folder)  # raises 'Directory not empty' when a thread is still writing


def test_the_log_folds_beside_the_writes_so_an_append_never_waits_for_it(tmp_path, monkeypatch):
    """The fold of the events table rewrites the whole table, so it runs in a thread of its own: with a
    fold held mid-way, the appends after it go on and return; once it ends, the table is folded and the
    log holds every event once, in order."""
    from mfs_nb.store import core
    from mfs_nb.store.salvage import layout as table_layout

    monkeypatch.setattr(core, "_OPTIMIZE_EVERY", 5)
    store = Store(str(tmp_path / "s"))
    started, release = threading.Event(), threading.Event()
    real_open = store._db.open_table

    def open_table(name, *args, **kwargs):  # the fold's own handle: its optimize waits to be released
        table = real_open(name, *args, **kwargs)
        if name == "events" and threading.current_thread().name.startswith("mfs-fold-"):
            real = table.optimize

            def optimize(**kw):
                started.set()
                release.wait(30)
                return real(**kw)

            table.optimize = optimize
        return table

    monkeypatch.setattr(store._db, "open_table", open_table)

    def event(uid):
        return Event(uid=uid, session="s", turn=uid, role="user", content=f"message {uid}", turn_start=True,
                     created_at="t")

    for uid in range(1, 6):  # the fifth write makes a fold due
        store.append_events([event(uid)], writer="w1")
    assert started.wait(30), "the fold started in its thread"
    for uid in range(6, 21):  # while it is held, the writes go on (inline, the first of them would wait 30 s)
        store.append_events([event(uid)], writer="w1")
    assert store._folder is not None and store._folder.is_alive(), "the appends did not wait for the fold"
    before = table_layout(real_open("events"), None)["fragments"]
    release.set()
    assert store.settle(30)
    assert table_layout(real_open("events"), None)["fragments"] < before
    assert [e.uid for e in store.load_events("s")] == list(range(1, 21))
