"""The one number: what the meter shows is what fires the tiers (docs/architecture.md, "Token
accounting and the compaction tiers")."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ConfigError

TIERS = ("ok", "warn", "compress", "hard")
# what a person reads for each tier (the internal names stay in code, settings and ledger rows); the
# hard tier is named by what it does, not "over the window": its line is a share of the usable window
# that may be set as low as the warn line, so the percentage beside it is often well below 100 %
TIER_LABELS = {"ok": "ok", "warn": "clearing soon", "compress": "compacting", "hard": "compacting now"}
TIER_LABELS_ZH = {"ok": "正常", "warn": "即将清理", "compress": "正在压缩", "hard": "立即压缩"}
SOURCE_LABELS = {"anchor+estimate": "the provider's count of the last request plus estimates since",
                 "estimate": "estimated (no provider count yet)"}


def tier_label(tier: str, language: str | None = None, over: bool = False) -> str:
    """The tier in words: 'ok', 'clearing soon', 'compacting', 'compacting now' (Chinese too); `over`:
    the payload is at or past the usable window itself, which the hard tier says as 'over the window'
    (the hard line is a share of that window, so below it the words would not be true)."""
    if over and tier == "hard":
        return "超出窗口" if language == "Chinese" else "over the window"
    labels = TIER_LABELS_ZH if language == "Chinese" else TIER_LABELS
    return labels.get(tier, tier)


@dataclass(frozen=True)
class ContextProfile:
    """Window and thresholds. Every threshold is a ratio of the window.

    The effective window is `window − summary_reserve − safety_buffer`; reserve and buffer are
    ratios too (0.1 and 0.065: 20k and 13k of a 200k window, what Claude Code keeps back).
    """

    window_tokens: int
    summary_reserve: float = 0.10
    safety_buffer: float = 0.065
    warn: float = 0.85
    compress: float = 0.90
    hard: float = 0.95

    def __post_init__(self) -> None:
        if self.window_tokens < 1024:
            raise ConfigError(f"window of {self.window_tokens} tokens is too small (at least 1024)")
        if not 0 <= self.summary_reserve + self.safety_buffer < 0.5:
            raise ConfigError("summary_reserve + safety_buffer must stay below half the window")
        if not 0 < self.warn <= self.compress <= self.hard <= 1:
            raise ConfigError("tiers must satisfy 0 < warn ≤ compress ≤ hard ≤ 1")

    @property
    def effective(self) -> int:
        return int(self.window_tokens * (1 - self.summary_reserve - self.safety_buffer))

    def tier(self, tokens: int) -> str:
        eff = self.effective
        if tokens >= self.hard * eff:
            return "hard"
        if tokens >= self.compress * eff:
            return "compress"
        if tokens >= self.warn * eff:
            return "warn"
        return "ok"


@dataclass(frozen=True)
class Usage:
    """Context pressure as the user sees it and as the pipeline acts on it.

    Every percentage shown anywhere (the status line, the notices, `%context`, the note to the model)
    is `ratio`: tokens of the usable window (`effective`), never of the raw window."""

    tokens: int
    window: int
    effective: int
    tier: str
    source: str  # "anchor+estimate" or "estimate"
    session: str
    cache_ratio: float | None = None  # provider-reported cached share of the last call
    prefix_ratio: float | None = None  # share of the last payload identical to the one before
    sent_tokens: int | None = None  # after a reply: the tokens of the last request sent in that turn
    cache_write_ratio: float | None = None  # provider-reported share of the last call written to its cache

    @property
    def ratio(self) -> float:
        """Tokens as a share of the usable window: the one base of every percentage shown."""
        return self.tokens / self.effective if self.effective else 0.0

    @property
    def percent(self) -> str:
        return percent(self.tokens, self.effective)

    @property
    def label(self) -> str:
        return tier_label(self.tier, over=self.tokens >= self.effective)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}

    def status_line(self) -> str:
        """`ctx 28% · 29.4k of 107k usable · cache 99.1% · session nb-main`; after a reply whose request
        was at a different share, `ctx 97% (the request was 94%) · …` (the notices and the note to the model
        give the share of the request); past the warn line the tier in words (`compacting`)."""
        ctx = f"ctx {self.percent}"
        if self.sent_tokens is not None and percent(self.sent_tokens, self.effective) != self.percent:
            ctx += f" (the request was {percent(self.sent_tokens, self.effective)})"
        parts = [ctx, f"{human(self.tokens)} of {human(self.effective)} usable"]
        if self.cache_ratio is not None:
            written = f" (+{self.cache_write_ratio:.1%} written)" if self.cache_write_ratio else ""
            parts.append(f"cache {self.cache_ratio:.1%}{written}")
        elif self.prefix_ratio is not None:
            parts.append(f"prefix {self.prefix_ratio:.1%}")
        if self.tier != "ok":
            parts.append(self.label)
        parts.append(f"session {self.session}")
        return " · ".join(parts)


def percent(tokens: int, effective: int) -> str:
    """Tokens as a whole percentage of the usable window: the one rounding every view uses."""
    return f"{tokens / effective:.0%}" if effective else "0%"


def human_pair(before: int, after: int) -> tuple[str, str]:
    """Two token counts for `before → after`: short forms, or exact ones when the short forms would
    read the same (`1,612 → 1,598`, never `1.6k → 1.6k`)."""
    short = human(before), human(after)
    return short if short[0] != short[1] or before == after else (f"{before:,}", f"{after:,}")


def human(n: int) -> str:
    """29,400 → '29.4k'; 128,000 → '128k'; 950 → '950'."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        value = n / 1000
        return f"{value:.0f}k" if value >= 100 or value == int(value) else f"{value:.1f}k"
    value = n / 1_000_000
    return f"{value:.0f}M" if value == int(value) else f"{value:.2f}M"
