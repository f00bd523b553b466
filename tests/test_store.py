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
    assert set(events_writes) <= {"merge_insert", "search", "count_rows", "to_arrow", "optimize"}
    assert "when_matched_update_all" not in source.split("def append_events")[1].split("def load_events")[0]


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
