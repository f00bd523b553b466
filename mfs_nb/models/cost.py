"""What a session's calls cost in dollars (issue 42): each call priced with litellm's local cost map.

A call's row in the call history carries the provider's own counts — input tokens, the part read
from its cache, the part written to it, output tokens — and the model that answered; compaction
rows carry the summarizer's. Priced at the map's rates: cache reads at the cached-read rate and
cache writes at the write rate where the map has them (Anthropic bills a write above an ordinary
input token), else at the input rate. A model the map does not know is "price unknown", never $0;
the offline default costs nothing and says so. Beside the bill, what the same calls would have cost
with no cache at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .llm import is_offline, litellm_module


@dataclass
class Spend:
    """Tokens and dollars of one kind of call (the chat's, or the summarizer's)."""

    calls: int = 0
    input: int = 0  # all prompt tokens, cached or not
    cached: int = 0  # read from the provider's cache
    written: int = 0  # written to it
    output: int = 0
    dollars: float = 0.0
    uncached_dollars: float = 0.0  # the same calls with no cache
    unpriced: set[str] = field(default_factory=set)  # models the cost map does not know

    def add(self, model: str, prompt: int, cached: int, written: int, output: int) -> None:
        self.calls += 1
        self.input += prompt
        self.cached += cached
        self.written += written
        self.output += output
        if is_offline(model):
            return
        rates = price(model)
        if rates is None:
            self.unpriced.add(model)
            return
        base, out = rates["input"], rates["output"]
        plain = max(prompt - cached - written, 0)
        self.dollars += plain * base + cached * rates["read"] + written * rates["write"] + output * out
        self.uncached_dollars += prompt * base + output * out

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "input_tokens": self.input, "cached_tokens": self.cached,
                "written_tokens": self.written, "output_tokens": self.output,
                "dollars": None if self.unpriced else round(self.dollars, 6),
                "uncached_dollars": None if self.unpriced else round(self.uncached_dollars, 6),
                "unpriced": sorted(self.unpriced)}


def price(model: str) -> dict[str, float] | None:
    """Per-token rates of `model` from litellm's local cost map (input, output, cache read, cache
    write; the last two fall back to the input rate), or None when the map does not know it."""
    entry = _entry(model)
    if entry is None:
        return None
    base = float(entry["input_cost_per_token"])
    return {"input": base, "output": float(entry.get("output_cost_per_token") or 0.0),
            "read": float(entry.get("cache_read_input_token_cost") or base),
            "write": float(entry.get("cache_creation_input_token_cost") or base)}


def _entry(model: str) -> dict[str, Any] | None:
    """The cost map's entry for `model` with an input price, trying it without its provider prefixes."""
    table = litellm_module().model_cost
    name = model
    while name:
        entry = table.get(name)
        if entry and entry.get("input_cost_per_token") is not None:
            return entry
        _, _, name = name.partition("/")  # anthropic/claude-… → claude-…; bedrock/anthropic.… → anthropic.…
    return None


def miss_weight(model: str) -> float | None:
    """What one token of cache miss costs against what one token less in the prefix saves on each
    later call, at `model`'s rates: a missed token is written again (the write rate) where it would
    have been read (the cached-read rate), a freed one is no longer read. (write − read) ÷ read:
    11.5 for Claude Sonnet, 1 for GPT-4o. None when the map has no cached-read rate for the model
    (a payback is then counted in tokens)."""
    entry = _entry(model)
    if entry is None or not entry.get("cache_read_input_token_cost"):
        return None
    rates = price(model)
    assert rates is not None
    return max(rates["write"] - rates["read"], 0.0) / rates["read"]


def session_cost(calls: list[dict[str, Any]], summaries: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The bill of a session: its chat calls (call-history rows with provider counts) and its
    summarizer calls (`summarizer` ledger rows), apart."""
    chat, summarizer = Spend(), Spend()
    for row in calls:
        if "prompt_tokens" in row:
            chat.add(row.get("model") or model, int(row["prompt_tokens"]), int(row.get("cache_read", 0)),
                     int(row.get("cache_write", 0)), int(row.get("completion_tokens", 0)))
    for row in summaries:
        summarizer.add(row.get("model") or model, int(row.get("prompt_tokens", 0)), int(row.get("cached_tokens", 0)),
                       int(row.get("cache_write_tokens", 0)), int(row.get("completion_tokens", 0)))
    unpriced = sorted(chat.unpriced | summarizer.unpriced)
    total = None if unpriced else round(chat.dollars + summarizer.dollars, 6)
    return {"chat": chat.to_json(), "summarizer": summarizer.to_json(), "dollars": total,
            "uncached_dollars": None if unpriced else round(chat.uncached_dollars + summarizer.uncached_dollars, 6),
            "unpriced": unpriced}


def describe(bill: dict[str, Any]) -> str:
    """`%mfs cost` in words: one line a part."""
    def money(value: float | None) -> str:
        return "price unknown" if value is None else f"${value:,.4f}"

    lines = []
    for part in ("chat", "summarizer"):
        p = bill[part]
        if not p["calls"]:
            continue
        cached = f"{p['cached_tokens'] / p['input_tokens']:.1%}" if p["input_tokens"] else "—"
        lines.append(f"{part}: {p['calls']} calls · {money(p['dollars'])} · input {p['input_tokens']:,} tokens "
                     f"({cached} read from the cache, {p['written_tokens']:,} written) · output {p['output_tokens']:,}")
    if not lines:
        return "no priced calls yet: the provider reported no usage (the offline default costs nothing)"
    lines.append(f"total {money(bill['dollars'])}; with no cache {money(bill['uncached_dollars'])}")
    if bill["unpriced"]:
        lines.append(f"price unknown for {', '.join(bill['unpriced'])}: litellm's cost map does not list it")
    return "\n".join(lines)


def budget_line(model: str, settings: Any, effective: int, priced: bool = True) -> str:
    """The `budget` setting in words (`%mfs status`, `%mfs cost`): where a compaction ends, where the warn
    line is, and what 100 calls of a long chat cost at `model`'s prices — a long chat's calls sit
    between the fill and the warn line, about their midpoint on average, priced all read from the
    cache and all uncached. `priced=False`: no prices (the cost map is not loaded for a status line)."""
    from ..window.budget import fill_share

    fill = fill_share(settings, effective)
    mid = int((fill + settings.warn_at) / 2 * effective)
    label = f"fill {fill:.0%}" if getattr(settings, "fill", 0) else f"{settings.budget} ({fill:.0%})"
    line = (f"budget {label}: a compaction ends at {int(fill * effective):,} tokens of {effective:,} usable, the warn "
            f"line is at {settings.warn_at:.0%}; a long chat's calls average ~{mid:,} tokens")
    if is_offline(model):
        return line + " (the offline default costs nothing)"
    rates = price(model) if priced else None
    if rates is None:
        return line + ("" if not priced else f" (no price for {model} in litellm's cost map)")
    read, full = 100 * mid * rates["read"], 100 * mid * rates["input"]
    return line + f", ${read:,.2f}–${full:,.2f} of input per 100 calls at {model} (read from the cache – uncached)"
