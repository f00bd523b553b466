"""The background encoder in a process of its own (mfs_nb/models/offprocess.py, issue 44): the same
vectors and latent terms as in this process, stopped while a turn or a search runs, and the passes
back in this process when the child cannot serve."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from conftest import FakeLLM

from mfs_nb.models import offprocess
from mfs_nb.models.embed import LATENT_TERMS, E5Embedder
from mfs_nb.session import Session

TEXTS = ["the pool pump runs at 2,400 rpm", "keep the filter at /srv/pool/filter.cfg", "chlorine at 1.5 ppm"]


def _state(pid: int, want: str = "") -> str:
    """A process's state letter from /proc (T: stopped); with `want`, once it reads so (a signal takes
    a moment to land), or after a second."""
    for _ in range(100):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if not want or (state == "T") == (want == "T"):
            return state
        time.sleep(0.01)
    return state


def test_a_routed_thread_gets_the_same_vectors_and_latent_terms_from_the_encoder_process(monkeypatch):
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    e5 = E5Embedder()
    here, terms = e5.embed(TEXTS), e5.latent(TEXTS)  # not routed: this process
    assert encoder.started == 0
    ops: list[str] = []
    real = encoder.call
    monkeypatch.setattr(encoder, "call", lambda op, texts, top_k=0: (ops.append(op), real(op, texts, top_k))[1])
    with offprocess.routed():
        there, terms_there = e5.embed(TEXTS), e5.latent(TEXTS)
    assert ops == ["passage", "latent"]  # both passes went to the child
    assert encoder.started == 1 and encoder.failed is None and encoder.pid is not None
    assert np.allclose(here, there, atol=1e-5)
    assert [ids for ids, _ in terms] == [ids for ids, _ in terms_there]
    assert len(terms_there[0][0]) == LATENT_TERMS
    assert np.allclose([w for _, ws in terms for w in ws], [w for _, ws in terms_there for w in ws], atol=1e-5)
    encoder.close()


def test_the_encoder_process_is_stopped_while_a_turn_runs_and_answers_once_it_ends(monkeypatch):
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    assert encoder.call("passage", TEXTS[:1]) is not None  # started, model loaded
    turn = offprocess.foreground()
    turn.__enter__()  # a turn starts
    pid = encoder.pid
    assert pid is not None and _state(pid, "T") == "T"  # stopped at once: the turn has the cores to itself
    got: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: got.append(encoder.call("passage", TEXTS * 20)))
    worker.start()
    with offprocess.foreground():  # a search during the turn: when it ends, the turn still holds the child
        pass
    time.sleep(0.5)
    assert not got and _state(pid) == "T"  # still stopped: the search's end did not let it go during the turn
    turn.__exit__(None, None, None)  # the turn ended
    worker.join(60)
    assert got and got[0].shape == (60, 384) and _state(pid, "R") != "T"
    encoder.close()


def test_a_chat_and_a_search_stop_the_encoder_process_while_they_run(store_dir, monkeypatch):
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    assert encoder.call("passage", TEXTS[:1]) is not None
    seen: list[str] = []

    class Watching(FakeLLM):
        def complete(self, *args, **kwargs):
            seen.append(_state(encoder.pid, "T"))
            return super().complete(*args, **kwargs)

    s = Session("s", store=store_dir, recall_index=True, llm=Watching())
    s.chat("where is the filter config?")
    assert seen == ["T"] and _state(encoder.pid, "R") != "T"
    from mfs_nb.recall import searcher

    with searcher.reading():
        seen.append(_state(encoder.pid, "T"))
    assert seen[-1] == "T" and _state(encoder.pid, "R") != "T"
    encoder.close()


def test_when_the_encoder_process_cannot_start_the_index_is_built_in_this_process(store_dir, monkeypatch, tmp_path,
                                                                                   vectors):
    broken = tmp_path / "child.py"
    broken.write_text("import sys; sys.exit(3)\n")
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    monkeypatch.setattr(offprocess, "CHILD", broken)
    s = Session("s", store=store_dir, recall_index=True, llm=FakeLLM())
    for t in TEXTS:
        s.record("user", t, new_turn=True)
    assert s.indexer.wait(120)
    model = s.indexer.model()
    assert s.store.recall_state("s", model.model_id)[0] == s.events[-1].uid  # every vector written
    assert encoder.started == 2 and encoder.failed  # tried twice, then gave up: passes stay here
    assert s.search("filter.cfg").hits and s.indexer.failed is None


def test_a_sessions_background_indexer_embeds_in_the_encoder_process(store_dir, monkeypatch, vectors):
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    s = Session("s", store=store_dir, recall_index=True, llm=FakeLLM())
    for t in TEXTS:
        s.record("user", t, new_turn=True)
    assert s.indexer.wait(120)
    assert encoder.started == 1 and encoder.failed is None  # the passes went to the child
    uids = [e.uid for e in s.events]
    stored = s.store.own_word_vectors(s.indexer.model().model_id, "s", uids)
    here = E5Embedder().embed(TEXTS)  # a user message's plain row is its own words' vector
    assert np.allclose(np.array([stored[u] for u in uids]), here, atol=2e-3)  # float16 on disk
    assert s.search("filter.cfg").hits
    s.close(wait_s=30)


def test_where_a_child_cannot_be_stopped_turns_go_on_and_the_passes_stay_here(monkeypatch):
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    monkeypatch.setattr(offprocess, "ON", False)  # Windows, macOS: no SIGSTOP, or no PR_SET_PDEATHSIG
    # a turn and a search: nothing to stop, nothing fails; the background thread's passes stay in this process
    with offprocess.foreground(), offprocess.foreground(), offprocess.routed():
        rows = E5Embedder().embed(TEXTS)
    assert rows.shape == (3, 384) and encoder.started == 0 and encoder.pid is None


def test_a_child_stopped_too_long_goes_on_and_a_lost_hold_cannot_stop_indexing_for_good(monkeypatch):
    encoder = offprocess.EncoderProcess()
    monkeypatch.setattr(offprocess, "ENCODER", encoder)
    monkeypatch.setattr(offprocess, "HOLD_LIMIT_S", 0.5)
    assert encoder.call("passage", TEXTS[:1]) is not None
    encoder.hold()  # never released (an interrupt at the wrong moment, a turn that waits on the network)
    assert _state(encoder.pid, "T") == "T"
    started = time.monotonic()
    got = encoder.call("passage", TEXTS)
    assert got is not None and got.shape == (3, 384) and time.monotonic() - started < 10
    encoder.close()
