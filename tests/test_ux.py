"""A newcomer's first hour: the gate's verdict cached per machine, one token number, one error policy."""

from __future__ import annotations

import numpy as np

from mfs_nb.layers import track


class Meaningful:
    """Paraphrases close, unrelated text far: a tiny bag-of-words embedder."""

    model_id = "test/bow"
    version = "1"

    def embed(self, texts):
        vocab: dict[str, int] = {}
        rows = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                rows[i, vocab.setdefault(w, len(vocab) % 64)] += 1
        rows[:, -1] += 0.01
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_gate_verdict_is_cached_per_machine_with_the_embedder_version(monkeypatch, tmp_path):
    monkeypatch.setenv("MFS_CACHE_DIR", str(tmp_path / "cache"))
    runs: list[str] = []
    monkeypatch.setattr(track, "gate", lambda e: runs.append(e.model_id) or "verdict from the gate")
    monkeypatch.setattr(track, "_GATES", {})
    emb = track.CachedEmbedder(Meaningful())  # type: ignore[arg-type]
    assert track.cached_gate(emb) == "verdict from the gate" and runs == ["test/bow"]
    monkeypatch.setattr(track, "_GATES", {})  # a new process on the same machine reads the file
    assert track.cached_gate(track.CachedEmbedder(Meaningful())) == "verdict from the gate"  # type: ignore[arg-type]
    assert runs == ["test/bow"]
    newer = Meaningful()
    newer.version = "2"  # type: ignore[misc]
    monkeypatch.setattr(track, "_GATES", {})
    track.cached_gate(track.CachedEmbedder(newer))  # type: ignore[arg-type]
    assert runs == ["test/bow", "test/bow"]
    assert (tmp_path / "cache" / "gate.json").is_file()


def test_an_unwritable_cache_only_costs_time(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MFS_CACHE_DIR", str(blocker / "sub"))
    monkeypatch.setattr(track, "_GATES", {})
    monkeypatch.setattr(track, "gate", lambda e: None)
    assert track.cached_gate(track.CachedEmbedder(Meaningful())) is None  # type: ignore[arg-type]


# -- one token number ----------------------------------------------------------------------
def _demo_session(store_dir):
    import pathlib

    from mfs_nb import Session
    from mfs_nb.commands.demo import SCRIPT, incident_review

    doc = pathlib.Path(store_dir).parent / "review.md"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(incident_review(), encoding="utf-8")
    s = Session("one", store=store_dir)  # the offline default: real o200k usage anchors the meter
    replies = [s.chat(text, docs=[str(doc)] if text is SCRIPT[1] else []) for text in SCRIPT]
    return s, replies


def test_one_token_number_across_a_compaction(store_dir):
    from mfs_nb.ui.context import ContextView
    from mfs_nb.ui.data import context_data, status_data
    from mfs_nb.window.usage import human, human_pair

    s, replies = _demo_session(store_dir)
    before = s.usage()
    assert before.source == "anchor+estimate" and replies[-1].usage.tokens == before.tokens
    (notice,) = s.compact()
    after = s.usage()
    shown_before, shown_after = human_pair(before.tokens, after.tokens)  # exact when the short forms read alike
    assert notice.startswith(f"context compacted: {shown_before} → {shown_after} ") and after.tokens < before.tokens
    data = context_data(s)
    assert data["usage"]["tokens"] == after.tokens == sum(x["tokens"] for x in data["layers"])
    assert human(after.tokens) in status_data(after)["line"]
    assert f"{after.tokens:,} tokens" in ContextView(data=data).html()
    reply = s.chat("What did the review recommend?")
    data = context_data(s)
    assert reply.usage.tokens == s.usage().tokens == data["usage"]["tokens"] == sum(x["tokens"] for x in data["layers"])
    assert reply.usage.source == "anchor+estimate"  # the provider's count of the new payload anchors it again


def test_a_compaction_that_would_not_shrink_the_payload_is_not_committed(store_dir):
    from conftest import FakeLLM

    from mfs_nb import Session

    s = Session("tiny", store=store_dir, llm=FakeLLM())
    for text in ("keep the pool under 30", "we run 4 replicas", "thanks"):
        s.chat(text)
    tokens = s.usage().tokens
    (notice,) = s.compact()
    assert notice.startswith("nothing worth compacting: 4 messages, ") and f"from {tokens} to " in notice
    assert s.segments == [] and s.usage().tokens == tokens
    skip = s.ledger()[-1]
    assert skip["kind"] == "skip" and skip["reason"] == "not_smaller" and skip["tokens_after"] >= tokens
    phases = [r["phase"] for r in s.store.load_compactions("tiny")]
    assert phases == ["started", "summary_completed", "aborted"]  # recorded, never declared
    assert Session("tiny", store=store_dir, llm=FakeLLM()).segments == []


# -- speed by design (measured in `mfs-nb bench ux`, asserted here only as behaviour) -------
def test_the_offline_default_answers_without_importing_litellm(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from mfs_nb import Session; s = Session('x', store=sys.argv[1]); r = s.chat('hello'); "
            "print('litellm' in sys.modules, r.usage.source, 'No model is configured' in r.text)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "anchor+estimate", "True"], out.stderr


def test_load_ext_warms_up_in_a_background_thread(tmp_path):
    import os
    import subprocess
    import sys

    code = ("import sys, threading; from IPython.core.interactiveshell import InteractiveShell; "
            "ip = InteractiveShell.instance(); ip.run_line_magic('load_ext', 'mfs_nb'); "
            "w = ip.magics_manager.registry['MfsMagics'].warmup; "
            "print(w.thread.name, w.thread.daemon, 'lancedb' in sys.modules); "
            "w.wait('store', 300); w.wait('model client', 300); "
            "print(sorted(m for m in ('lancedb', 'litellm') if m in sys.modules), sorted(w.errors))")
    env = {**os.environ, "MFS_WARM": "1", "MFS_STORE": str(tmp_path / "s")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    first, second = out.stdout.strip().split("\n")
    assert first.split()[:2] == ["mfs-warm", "True"], out.stderr
    assert second == "['lancedb'] []"  # the offline default never imports litellm, not even in the warm-up


# -- outputs that read well without a kernel -----------------------------------------------
def test_static_views_are_to_scale_and_fit_their_box(store_dir):
    import re

    from mfs_nb.ui.data import context_data, ledger_data
    from mfs_nb.ui.html import context_html, ledger_html

    s, _ = _demo_session(store_dir)
    s.compact()
    page = context_html(context_data(s))
    widths = [float(w) for w in re.findall(r"vertical-align:top;width:([\d.]+)%", page)]
    assert widths and sum(widths) < 5  # a 1k-token payload in a 128k window is a sliver, not a full bar
    assert "compaction line" in page and "left:" in page
    history = list(s.history)
    short = ledger_html(ledger_data(s.ledger(), history, s.usage().effective))
    assert f"{len(history)} calls" in short and "payload tokens per call" not in short  # a summary line only
    assert "overflow-x:auto" in short
    long = ledger_html(ledger_data(s.ledger(), history * 4, s.usage().effective))
    assert "payload tokens per call" in long


def test_recall_html_breaks_lines_between_words(store_dir):
    from conftest import FakeLLM

    from mfs_nb import Session
    from mfs_nb.ui.data import recall_html

    s = Session("r", store=store_dir, llm=FakeLLM())
    s.chat("a message with ordinary words")
    page = recall_html(s.recall(1, 2))
    assert "word-break:normal" in page and "overflow-wrap:break-word" in page and "break-all" not in page


def test_cli_progress_line_only_on_a_terminal():
    import io

    from mfs_nb.commands.cli import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = Progress("replay", 3, "calls", stream)
        for _ in range(3):
            bar.step("1,200 tokens")
        bar.close()
    assert "[replay] 3/3 calls · 100%" in tty.getvalue() and tty.getvalue().endswith("\n")
    assert pipe.getvalue() == ""  # logs and captured output stay clean


def test_fact_scan_of_long_lines_in_windows_agrees_with_one_scan():
    from mfs_nb.layers import facts

    def one_scan(line: str):
        for kind, pattern in ((facts.ERROR, facts._ERROR), (facts.COMMAND, facts._COMMAND),
                              (facts.PATH, facts._PATH), (facts.NUMBER, facts._NUMBER)):
            if pattern.search(line):
                return kind
        return None

    filler = "lorem ipsum dolor sit amet " * 40  # ~1,100 chars of prose without facts
    probes = ["deploy/pool.yaml", "took 30 ms", "TimeoutError: pool exhausted", "`pytest -k pool`",
              "https://example.org/a/b", "abc123", "x" * 700, "v2.1.0-rc", "在上海花了 37 元"]
    for probe in probes:
        for at in (0, 250, 256, 300, 511, 700, len(filler)):
            line = filler[:at] + probe + " " + filler[at:]
            assert facts.classify(line) == one_scan(line), (probe, at)
