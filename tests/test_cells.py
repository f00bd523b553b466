"""The cell log (issue 18 deliverable 3): executed code cells join the session as compact events."""

from __future__ import annotations

import base64

import pytest
from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.layers.cells import CellRecord, event_text, mime_digest

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(34_000)).decode()


@pytest.fixture
def ip(ip):
    """The shell of conftest, its session answering from a fake model."""
    session = ip.magics_manager.registry["MfsMagics"].get_session()
    session._injected_llm = session._llm = FakeLLM(default="fine")
    return ip


def _session(shell):
    return shell.magics_manager.registry["MfsMagics"].get_session()


def test_cells_between_chats_become_one_event_with_outcomes_and_digests(ip):
    ip.run_cell("x = 41 + 1", store_history=True)
    ip.run_cell("print('rows loaded: 1200')\nx", store_history=True)
    bad = ip.run_cell("1 / 0", store_history=True)
    ip.run_cell("from IPython.display import display\n"
                f"display({{'image/png': '{PNG}', 'text/plain': '<Figure>'}}, raw=True)", store_history=True)
    ip.run_cell("print('y' * 1_000_000)", store_history=True)
    ip.run_cell("%%chat\nwhy did the division fail?", store_history=True)
    s = _session(ip)
    cells = [e for e in s.events if e.role == "tool" and e.name == "notebook"]
    assert len(cells) == 1 and cells[0].uid < s.events[-2].uid  # before the user's message
    text = cells[0].content
    lines = [x for x in text.splitlines() if x.startswith("In [")]
    assert len(lines) == 5
    assert lines[0].startswith("In [2] ok") and "`x = 41 + 1`" in lines[0]
    assert "rows loaded: 1200" in lines[1] and "42" in lines[1]
    assert f"In [{bad.execution_count}] error ZeroDivisionError: division by zero" in lines[2]
    assert "image/png 33 kB" in lines[3] and PNG[:40] not in text  # the size, never the bytes
    assert len(lines[4]) < 400  # a huge output is a bounded digest
    # the model saw it, as a tool result of the notebook, right before the question
    sent = s.llm.received[-1]
    assert sent[-2]["content"].startswith(f"[tool result #{cells[0].uid} from notebook]")
    assert "ZeroDivisionError" in sent[-2]["content"]
    # the chat cell and mfs's own magics are not logged
    ip.run_cell("%context", store_history=True)
    ip.run_cell("%%chat\nand now?", store_history=True)
    assert len([e for e in s.events if e.name == "notebook"]) == 1


def test_the_cell_log_can_be_switched_off(ip):
    ip.run_cell("%mfs config cell_log=false", store_history=True)
    ip.run_cell("a = 1", store_history=True)
    ip.run_cell("%%chat\nhello", store_history=True)
    assert not [e for e in _session(ip).events if e.name == "notebook"]


def test_mime_digest_names_binary_outputs_by_type_and_size():
    assert mime_digest({"image/png": PNG, "text/plain": "<Figure size 640x480>"}) == "image/png 33 kB"
    assert mime_digest({"text/plain": "a\nb"}) == "a b"
    assert mime_digest({"text/html": "<b>x</b>" * 300, "text/plain": "df"}).startswith("df, text/html 2 kB")


def test_many_cells_list_every_failure_and_count_the_rest():
    records = [CellRecord(i, "abcd1234", f"step_{i}()", "KeyError: 'k'" if i % 25 == 0 else "", 0.01, "")
               for i in range(1, 201)]
    text = event_text(records)
    for i in range(25, 201, 25):
        assert f"In [{i}] error KeyError" in text
    assert "more cells ran ok" in text and len(text.splitlines()) <= 42


def test_failed_cells_stay_named_in_the_payload_after_compaction(store_dir, roomy_layers):
    """After compactions, every failed cell's execution count and error name is still in the payload
    (fact track or segment), though the events that said so are compacted."""
    s = Session("cl", store=store_dir, window_tokens=8000, llm=FakeLLM(default="Looked at it; see above. " * 10),
                background_compaction=False)
    failed = []
    n = 0
    for turn in range(40):
        records = []
        for _ in range(5):
            n += 1
            error = ""
            if n % 11 == 0:
                error = ["KeyError: 'region'", "ValueError: bad shape", "ZeroDivisionError: division by zero"][n % 3]
                failed.append((n, error.split(":")[0]))
            records.append(CellRecord(n, f"{n:08x}", f"df_{n} = step({n})", error, 0.1, f"DataFrame {n} rows"))
        s.record_cells(records)
        s.chat(f"turn {turn}: what does step {n} tell us about the staging data? " * 3)
    assert s.segments or s.compactor.evicted
    first_raw = min(s.send_view().raw_uids())
    compacted = [e for e in s.events if e.name == "notebook" and e.uid < first_raw]
    assert compacted, "some cell events were compacted"
    payload = "\n".join(m["content"] or "" for m in s.send_view().messages)
    for count, name in failed:
        assert f"In [{count}]" in payload and name in payload.split(f"In [{count}]", 1)[1][:80], (count, name)


def test_keys_in_cells_never_reach_the_store_and_stdout_is_always_restored(ip):
    import sys

    real = sys.stdout
    ip.run_cell("print('token:', 'sk-proj-AbCdEfGhIjKlMnOpQrStUv0123')", store_history=True)
    ip.run_cell("get_ipython().run_cell('inner = 2')\nouter = 3", store_history=True)  # a cell running a cell
    ip.run_cell("import sys\ntry:\n    sys.stdout.write(b'bytes')\nexcept TypeError:\n    pass", store_history=True)
    ip.run_cell("enc = sys.stdout.encoding\nfd = sys.stdout.isatty()", store_history=True)
    assert sys.stdout is real and "publish" not in vars(ip.display_pub)
    assert ip.user_ns["enc"] == getattr(real, "encoding", None)
    ip.run_cell("%%chat\nwhat ran?", store_history=True)
    text = [e for e in _session(ip).events if e.name == "notebook"][0].content
    assert "AbCdEfGhIjKlMnOpQrStUv0123" not in text and "sk-proj" in text
    lines = [x for x in text.splitlines() if x.startswith("In [")]
    assert len(lines) == 4 and "inner = 2" not in "".join(lines[2:])  # the nested cell is part of the outer one


def test_a_line_that_mentions_an_error_is_not_a_failure():
    from mfs_nb.layers.cells import failed_lines

    ok = CellRecord(3, "ab", "print(report)", "", 0.1, "[step 3] error rate 0.2 · ] error budget 3%").line()
    bad = CellRecord(4, "cd", "d['x']", "KeyError: 'x'", 0.1, "").line()
    assert failed_lines(ok + "\n" + bad) == ["cell In [4] failed: KeyError: 'x'"]
    many = [CellRecord(i, "ab", "f()", "KeyError: 'k'" if i <= 45 else "", 0.1, "") for i in range(1, 1046)]
    text = event_text(many)
    assert len(text.splitlines()) <= 48 and "[1000 more cells ran ok (In [46]–[1045])]" in text
