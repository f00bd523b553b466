"""S0 token estimation (DESIGN §3 S0, seed 000 §3.2).

`estimate_tokens` weighs character classes (CJK, Latin words, digit runs, punctuation,
line structure). It never raises and never needs a tokenizer file, so it is the fallback and
the fast increment counter. The weights were fitted against o200k_base on real chat, Chinese
chat and tool output; `mfs-nb bench tokens` measures their error.
"""

from __future__ import annotations

import importlib.util
import os
import re
from functools import lru_cache
from typing import Any

_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\u3040-\u30ff]")
_CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff00-\uffef]")
_WORD = re.compile(r"[A-Za-z]+")
_LETTER = re.compile(r"[A-Za-z]")
_DIGIT_RUN = re.compile(r"[0-9]+")
_DIGIT = re.compile(r"[0-9]")
_PUNCT = re.compile(r"[!-/:-@\[-`{-~]")
_NEWLINE = re.compile(r"\n")
_SPACE_RUN = re.compile(r"[ \t]{2,}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_CAMEL = re.compile(r"[a-z][A-Z]")

# (pattern, weight): tokens = sum(weight × number of matches) + _BASE
_CJK_W, _CJK_PUNCT_W, _NON_ASCII_W = 0.772, 0.718, 0.846
_WEIGHTS = (
    (_WORD, 0.72),
    (_LETTER, 0.071),
    # o200k splits digit runs into groups of three: a run of n digits ≈ (n + 2) / 3 tokens
    (_DIGIT_RUN, 0.667),
    (_DIGIT, 0.333),
    (_PUNCT, 0.586),
    (_NEWLINE, 1.121),
    (_SPACE_RUN, 0.904),
    (_CAMEL, 0.603),
)
_BASE = 0.316


def estimate_tokens(text: str) -> int:
    """Estimate how many tokens `text` costs, by character class. Fast, total, never raises."""
    if not text:
        return 0
    if not isinstance(text, str):
        text = str(text)
    cjk = len(_CJK.findall(text))
    cjk_punct = len(_CJK_PUNCT.findall(text))
    other = len(_NON_ASCII.findall(text)) - cjk - cjk_punct
    total = _BASE + _CJK_W * cjk + _CJK_PUNCT_W * cjk_punct + _NON_ASCII_W * other
    for pattern, weight in _WEIGHTS:
        total += weight * len(pattern.findall(text))
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


def _ensure_tiktoken_cache() -> None:
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
    _ensure_tiktoken_cache()
    try:
        import tiktoken

        enc = tiktoken.get_encoding(encoding)
    except Exception:  # no file, no network: the estimator stays in charge
        return None

    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=())) if text else 0

    return count
