"""Regenerate mfs_nb/data/o200k_cjk.txt: the CJK pieces that o200k_base encodes as one token.

The estimator segments CJK runs greedily with this table (tokens.py). It is a fact about the
tokenizer, read from the tokenizer itself; no conversation data goes into it.
Run: python scripts/make_cjk_table.py
"""

from __future__ import annotations

import re
from pathlib import Path

from mfs_nb.window.tokens import CJK_PIECE, _ensure_tiktoken_cache

OUT = Path(__file__).resolve().parent.parent / "mfs_nb" / "data" / "o200k_cjk.txt"


def main() -> None:
    _ensure_tiktoken_cache()
    import tiktoken

    enc = tiktoken.get_encoding("o200k_base")
    pieces, singles = set(), set()
    piece = re.compile(CJK_PIECE)
    for rank in range(enc.n_vocab):
        try:
            text = enc.decode_single_token_bytes(rank).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        if piece.fullmatch(text):
            (pieces if len(text) >= 2 else singles).add(text)
    lines = ["# CJK pieces that o200k_base encodes as one token (scripts/make_cjk_table.py)",
             "".join(sorted(singles))] + sorted(pieces, key=lambda p: (len(p), p))
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(singles)} single characters, {len(pieces)} longer pieces")


if __name__ == "__main__":
    main()
