"""A newcomer's first hour: the gate's verdict cached per machine, one token number, one error policy."""

from __future__ import annotations

import numpy as np

from mfs_nb import track


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
