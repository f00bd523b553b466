"""The estimator: total, sane on any input; close to a real tokenizer on ordinary text."""

from __future__ import annotations

import pytest

from mfs_nb import estimate_tokens
from mfs_nb.window.tokens import exact_counter


@pytest.mark.parametrize("text", ["", "\ud800\udfff\ud800", "\x00\x01\x1b[31m", "🙂" * 100, "abc 中文 ١٢٣ Ωμέγα",
                                  "x" * 10_000_000])
def test_any_input_gives_a_sane_count(text):
    n = estimate_tokens(text)
    assert isinstance(n, int) and 0 <= n <= max(1, len(text) * 2)
    assert (n == 0) == (text == "")


def test_digit_runs_are_modelled_as_runs():
    assert 10 <= estimate_tokens("1" * 32) <= 13


def test_close_to_o200k_on_ordinary_text():
    count = exact_counter("o200k_base")
    assert count is not None, "o200k_base must load offline from litellm's bundled files"
    samples = [
        "Help me pick the connection-pool size for this service. Our DB allows 120 connections.",
        "我们的数据库最多允许120个连接，连接池请保持在30以内。预算是2900万美元。",
        'Traceback (most recent call last):\n  File "app/pool.py", line 88, in acquire\n    raise TimeoutError("pool exhausted")',
    ]
    for text in samples:
        real = count(text)
        assert abs(estimate_tokens(text) - real) / real < 0.35, (text, estimate_tokens(text), real)
