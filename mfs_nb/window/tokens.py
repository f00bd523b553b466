"""S0 token estimation (docs/architecture.md, "Token accounting and the compaction tiers").

`estimate_tokens` models how a byte-pair tokenizer (o200k_base) cuts text, with regex counts
that run at C speed: Latin words, contractions, digit runs (cut in threes), punctuation runs and
where they attach, line structure, CJK. CJK runs are segmented greedily with the table of CJK
pieces that o200k encodes as one token (`data/o200k_cjk.txt`, read from the tokenizer by
`scripts/make_cjk_table.py`). The weights were fitted by least absolute relative error on half of
the shared English chat, Chinese chat and coding-agent tool output, and checked on the other
half; `mfs-nb bench tokens` measures them. It never raises and needs no tokenizer file, so it is
the fallback and the fast increment counter.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

_CJ = r"\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\u3040-\u30ff"  # CJK ideographs, kana, hangul
_CP = r"\u3000-\u303f\uff00-\uffef"  # CJK punctuation and full-width forms
_AP = r"!-/:-@\[-`{-~"  # ASCII punctuation
# A CJK run may take one leading punctuation mark, as o200k's pre-tokenizer attaches it.
CJK_PIECE = f"[{_CP}{_AP}]?[{_CJ}]+"
_CJK_RUN = re.compile(CJK_PIECE)
_HAS_CJK = re.compile(f"[{_CJ}]")
_DIGIT_RUN = re.compile(r"[0-9]+")
_PUNCT_RUN = re.compile(f"[{_AP}]+")
_CJK_PUNCT_RUN = re.compile(f"[{_CP}]+")
_NEWLINE_RUN = re.compile(r"\n+")

# (pattern, weight): tokens ≈ Σ weight × matches, plus the run-based terms in estimate_tokens.
# Weights fitted by least absolute relative error against o200k_base (see module doc).
_ASCII_WEIGHTS = tuple((re.compile(p), w) for p, w in (
    (r"[A-Za-z]+", 1.0),
    (r"[ \t]{2,}", 0.3836),
    (r"[a-z][A-Z]", 1.2667),  # camelCase joints
    (r"[A-Z]{2,}", 1.0),
    (r"[A-Za-z]['’](?:s|t|re|ve|m|ll|d)\b", -1.6159),  # contractions stay inside their word
    (r"[A-Za-z][.,!?;:]", 0.3841),
    (f" [{_AP}]", 0.8264),
    (f"[{_AP}]\\n", -1.5622),  # newlines ride on the punctuation before them
    (r" [0-9]", 0.622),
))
_UNICODE_WEIGHTS = tuple((re.compile(p), w) for p, w in (
    (f"[^\\x00-\\x7f{_CJ}{_CP}]", 1.2872),  # other scripts, emoji, accents
    (f"[{_CP}{_AP}][{_CJ}]", -0.8523),
))
_PUNCT_RUN_W, _PUNCT_W = 0.5427, 0.0732
_CJK_PUNCT_RUN_W, _CJK_PUNCT_W = 0.2427, 0.4273
_NEWLINE_RUN_W, _NEWLINE_W = 1.7413, -0.1592
_DIGIT_RUN_W, _DIGIT_W = 0.667, 0.333  # o200k cuts digit runs in threes: n digits ≈ (n + 2) / 3
_SEGMENT_W, _RARE_W = 0.9901, 0.4877
# Runs longer than any real word are cut by the tokenizer into pieces of about this many chars;
# ordinary text never reaches these lengths, so the fitted weights are unaffected.
_LONG_RUN = re.compile(f"[A-Za-z]{{24,}}|[{_AP}]{{16,}}|[ \\t]{{32,}}")
_LONG_CHARS_PER_TOKEN = {"letter": 8.0, "other": 32.0}


@lru_cache(maxsize=1)
def _cjk_table() -> tuple[frozenset[str], frozenset[str], dict[str, tuple[int, ...]]]:
    """One-token single characters, one-token longer pieces, and for each first character the
    lengths of the pieces that start with it (longest first)."""
    text = resources.files("mfs_nb").joinpath("data/o200k_cjk.txt").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    lengths: dict[str, set[int]] = {}
    for piece in lines[1:]:
        lengths.setdefault(piece[0], set()).add(len(piece))
    starts = {k: tuple(sorted(v, reverse=True)) for k, v in lengths.items()}
    return frozenset(lines[0]), frozenset(lines[1:]), starts


def _cjk_tokens(text: str) -> float:
    """CJK runs cut greedily into the longest one-token pieces; rare characters cost extra."""
    singles, pieces, starts = _cjk_table()
    segments = rare = 0
    for run in _CJK_RUN.findall(text):
        i, n = 0, len(run)
        while i < n:
            for length in starts.get(run[i], ()):
                if length <= n - i and run[i:i + length] in pieces:
                    i += length
                    break
            else:
                if run[i] not in singles:
                    rare += 1
                i += 1
            segments += 1
    return _SEGMENT_W * segments + _RARE_W * rare


def estimate_tokens(text: str) -> int:
    """Estimate how many o200k tokens `text` costs. Fast, total, never raises."""
    if not text:
        return 0
    if not isinstance(text, str):
        text = str(text)
    digits = _DIGIT_RUN.findall(text)
    punct = _PUNCT_RUN.findall(text)
    total = (_DIGIT_RUN_W * len(digits) + _DIGIT_W * sum(map(len, digits))
             + _PUNCT_RUN_W * len(punct) + _PUNCT_W * sum(map(len, punct))
             + _NEWLINE_RUN_W * len(_NEWLINE_RUN.findall(text)) + _NEWLINE_W * text.count("\n"))
    for pattern, weight in _ASCII_WEIGHTS:
        total += weight * len(pattern.findall(text))
    if not text.isascii():  # O(1) in CPython: English and code skip the Unicode passes
        cjk_punct = _CJK_PUNCT_RUN.findall(text)
        total += _CJK_PUNCT_RUN_W * len(cjk_punct) + _CJK_PUNCT_W * sum(map(len, cjk_punct))
        for pattern, weight in _UNICODE_WEIGHTS:
            total += weight * len(pattern.findall(text))
        if _HAS_CJK.search(text):
            total += _cjk_tokens(text)
    for run in _LONG_RUN.findall(text):
        per = _LONG_CHARS_PER_TOKEN["letter" if run[0].isalpha() else "other"]
        total += len(run) / per - 1
    return max(1, round(total))


# Per message: role and framing cost a few tokens in every chat format.
MESSAGE_OVERHEAD = 4


def message_tokens(message: dict[str, Any], count=estimate_tokens) -> int:
    """Tokens of one OpenAI-format message: content, tool calls and framing."""
    n = MESSAGE_OVERHEAD + count(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        n += 3 + count(fn.get("name") or "") + count(fn.get("arguments") or "")
    return n


def newest_within(items: Sequence[tuple[int, str]], budget: int, per_item: int = 1,
                  count: Callable[[str], int] = estimate_tokens) -> tuple[list[tuple[int, str]], tuple[int, int] | None]:
    """The newest (uid, text) items that fit `budget` tokens (each costs its tokens + `per_item`),
    in their order, and the uid range of the older items left out (None when all fit). Used by
    the tracks, which keep a suffix so that what is dropped is one recallable range."""
    kept: list[tuple[int, str]] = []
    used = 0
    for uid, text in reversed(items):
        cost = count(text) + per_item
        if used + cost > budget:
            break
        kept.append((uid, text))
        used += cost
    kept.reverse()
    left = len(items) - len(kept)
    return kept, ((items[0][0], items[left - 1][0]) if left else None)


def ensure_tiktoken_cache() -> None:
    """Point tiktoken at the encodings litellm ships, so nothing is downloaded."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.origin:
        folder = os.path.join(os.path.dirname(spec.origin), "litellm_core_utils", "tokenizers")
        if os.path.isdir(folder):
            os.environ["TIKTOKEN_CACHE_DIR"] = folder


@lru_cache(maxsize=4)
def exact_counter(encoding: str = "o200k_base"):
    """An exact counter for a tiktoken encoding available offline, or None."""
    ensure_tiktoken_cache()
    try:
        import tiktoken

        enc = tiktoken.get_encoding(encoding)
    except Exception:  # no file, no network: the estimator stays in charge
        return None

    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=())) if text else 0

    return count
