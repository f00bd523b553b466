"""A damaged store never silently restarts: clear errors naming the table, and a doctor that finds
what is readable, repairs it, and says exactly which uids were lost (never reused)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "faults"))
from worker import Model  # noqa: E402

from mfs_nb import Session, StoreError  # noqa: E402
from mfs_nb.commands.cli import main  # noqa: E402
from mfs_nb.store.doctor import doctor  # noqa: E402


def _session(store: str, turns: int = 14) -> Session:
    s = Session("d", store=store, window_tokens=4096, llm=Model())
    for i in range(turns):
        s.chat(f"turn {i}: the replica pool for shard {i} should stay under {20 + i} connections " * 4)
    s.compact()
    assert s.compactor.segments  # segments refer to uids, so lost rows are detectable
    return s


def test_removed_events_table_is_an_error_naming_it_then_doctor_repairs(store_dir, capsys):
    s = _session(store_dir)
    last = s.last_uid
    shutil.rmtree(Path(store_dir) / "events.lance")
    with pytest.raises(StoreError, match="table events is missing") as info:
        Session("d", store=store_dir, window_tokens=4096, llm=Model())
    assert "doctor" in str(info.value) and "\n" not in str(info.value)
    assert main(["doctor", "--store", store_dir]) == 1
    assert "MISSING" in capsys.readouterr().out
    lines, _ = doctor(store_dir, repair=True)
    assert any("could not be recovered" in x for x in lines)
    again = Session("d", store=store_dir, window_tokens=4096, llm=Model())
    covered = again.compactor.covered_to
    assert covered <= again.last_uid <= last  # tombstones up to the session's saved high-water mark
    assert again.recall(1, 1)[0].content.startswith("[uid 1 could not be recovered")
    high = again.last_uid
    new = again.chat("after the repair")
    assert new.uids[0] == high + 1  # never a reused uid
    assert again.coverage()["lost"] == 0


def test_a_session_that_never_compacted_keeps_its_uids_after_its_log_is_lost(store_dir):
    s = Session("n", store=store_dir, window_tokens=64_000, llm=Model())
    for i in range(3):
        s.chat(f"turn {i}: nothing to compact yet")
    assert not s.compactor.segments and s.last_uid >= 6
    high = s.last_uid - 1  # the state is saved after the reply is priced: at least up to the user's message
    shutil.rmtree(Path(store_dir) / "events.lance")
    with pytest.raises(StoreError, match="table events is missing"):
        Session("n", store=store_dir, window_tokens=64_000, llm=Model())
    doctor(store_dir, repair=True)
    again = Session("n", store=store_dir, window_tokens=64_000, llm=Model())
    assert again.last_uid >= high  # tombstones up to the saved mark: uids 1.. are not handed out again
    assert again.chat("after the repair").uids[0] > high


def test_changed_byte_and_truncated_file_are_found(store_dir):
    s = _session(store_dir)
    files = sorted((Path(store_dir) / "events.lance" / "data").glob("*.lance"))
    assert len(files) > 3
    victim = files[1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    lines, healthy = doctor(store_dir)
    assert not healthy and any("cannot be read" in x for x in lines), lines
    with pytest.raises(StoreError, match="events") as info:
        Session("d", store=store_dir, window_tokens=4096, llm=Model())
    assert "\n" not in str(info.value)
    lines, _ = doctor(store_dir, repair=True)
    again = Session("d", store=store_dir, window_tokens=4096, llm=Model())
    assert again.last_uid >= s.compactor.covered_to
    assert [e.uid for e in again.events] == list(range(1, again.last_uid + 1))
    assert doctor(store_dir)[1]
