"""Suite `cost`: what each strategy's calls would cost at a provider, prompt cache included (issue 42).

The shared long sessions (the coding sessions, LoCoMo ×6 as one session) are replayed at 32k and
128k by mfs_nb and by three strategies: truncate-to-fit, a rolling summary, and `compact-90`, the
production assistants' way (at 90 % of the usable window everything is replaced by one summary).
Every call is priced under two rule sets written here, not taken from the engine:

- **Anthropic**: a request is cached only up to blocks it marks (every strategy marks the end of its
  system prompt and its newest message, as assistants that cache do; mfs_nb also marks the end of
  its memory layers — the messages with no uid after the system prompt). A mark reads the longest
  prefix written before that ends at it or at one of the 20 messages before it; the tokens from
  there to the last mark are written. Reads at the cached-read rate, writes at the write rate, the
  rest at the input rate.
- **OpenAI**: the longest prefix shared with any earlier request is read, in 128-token steps from
  1,024 tokens; no write cost.

Tokens are the estimator's (`tokens.message_tokens`), the same for every strategy. The summarizer's
calls are priced apart, at the input and output rates with no cache: mfs_nb's from the `summarizer`
rows its replay leaves in the ledger, the baselines' from what each summary read and wrote. Prices
come from the cost map of the installed litellm, named with its version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ..commands.replay import normalise, replay
from ..window.tokens import message_tokens
from . import baselines
from .dataset import Data, to_openai

NAME = "cost"
NEEDS = ("claude_code_sessions", "locomo")
OPT_IN = True  # minutes of replays; run by name (`mfs-nb bench cost`), not in the quick run CI makes
WINDOWS = (32_000, 128_000)
STRATEGIES = ("truncate", "rolling", "compact-90")
MODELS = {"Anthropic": "claude-sonnet-4-5", "OpenAI": "gpt-4o"}
LOOKBACK = 20
OPENAI_MIN, OPENAI_STEP = 1_024, 128


def _prices(model: str) -> dict[str, float]:
    from ..models.llm import litellm_module

    entry = litellm_module().model_cost[model]
    base = float(entry["input_cost_per_token"])
    return {"input": base, "output": float(entry["output_cost_per_token"]),
            "read": float(entry.get("cache_read_input_token_cost") or base),
            "write": float(entry.get("cache_creation_input_token_cost") or base)}


class _Messages:
    """Each message's bytes and tokens, computed once per message object: a long session's payloads
    share most of their messages, and the estimator is the slow part. The object is kept with its
    figures, so its id stays its own while the memo lives."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[dict[str, Any], bytes, int]] = {}

    def __call__(self, m: dict[str, Any]) -> tuple[bytes, int]:
        hit = self.memo.get(id(m))
        if hit is None:
            hit = self.memo[id(m)] = (m, json.dumps(m, sort_keys=True, default=str).encode(), message_tokens(m))
        return hit[1], hit[2]


def _figures(payload: Sequence[dict[str, Any]], known: _Messages) -> tuple[list[str], list[int]]:
    """The digest of each prefix (up to and including message i) and the tokens up to it."""
    keys, upto, h, running = [], [], hashlib.sha256(), 0
    for m in payload:
        data, tokens = known(m)
        h.update(data)
        keys.append(h.hexdigest())
        running += tokens
        upto.append(running)
    return keys, upto


def price_anthropic(payloads: list[list[dict[str, Any]]], marks: list[list[int]]) -> dict[str, int]:
    """Input, read and written tokens over all calls under the Anthropic rules (see the module doc)."""
    cache: set[str] = set()
    total = read = written = 0
    known = _Messages()
    for payload, marked in zip(payloads, marks):
        keys, upto = _figures(payload, known)
        got = 0
        for i in marked:
            for j in range(max(0, i - LOOKBACK), i + 1):
                if keys[j] in cache:
                    got = max(got, upto[j])
        last = upto[max(marked)] if marked else 0
        cache.update(keys[i] for i in marked)
        total += upto[-1] if upto else 0
        read += got
        written += max(0, last - got)
    return {"input": total, "read": read, "written": written}


def price_openai(payloads: list[list[dict[str, Any]]]) -> dict[str, int]:
    """Input and read tokens under automatic prefix caching (see the module doc)."""
    seen: set[str] = set()
    total = read = 0
    known = _Messages()
    for payload in payloads:
        keys, upto = _figures(payload, known)
        shared = next((upto[i] for i in range(len(keys) - 1, -1, -1) if keys[i] in seen), 0)
        running = upto[-1] if upto else 0
        if shared >= OPENAI_MIN:
            read += shared - shared % OPENAI_STEP
        seen.update(keys)
        total += running
    return {"input": total, "read": read, "written": 0}


def _marks(payload: list[dict[str, Any]], uids: list[int | None] | None) -> list[int]:
    """System end and newest message; with uids (mfs_nb), also the end of its memory layers."""
    marks = {0, len(payload) - 1}
    if uids:
        memory = [k for k, u in enumerate(uids) if k > 0 and u is None]
        if memory:
            marks.add(memory[-1])
    return sorted(marks)


def _run(name: str, messages: list[dict[str, Any]], window: int) -> dict[str, Any]:
    if name == "mfs_nb":
        payloads: list[list[dict[str, Any]]] = []
        uids: list[list[int | None]] = []
        summaries: list[tuple[int, int]] = []

        def on_call(session: Any, plan: Any) -> None:
            payloads.append(plan.view.messages)
            uids.append(plan.view.uids)

        def keep(session: Any) -> None:
            summaries.extend((int(r.get("prompt_tokens", 0)), int(r.get("completion_tokens", 0)))
                             for r in session.ledger() if r.get("kind") == "summarizer")

        replay(normalise(messages), window=window, on_call=on_call, keep=keep)
        marks = [_marks(p, u) for p, u in zip(payloads, uids)]
    else:
        run = baselines.simulate(name, messages, window)
        payloads, summaries = run.payloads, run.summaries
        marks = [_marks(p, None) for p in payloads]
    output = sum(message_tokens(m) for i, m in enumerate(messages) if m.get("role") == "assistant")
    return {"calls": len(payloads), "anthropic": price_anthropic(payloads, marks), "openai": price_openai(payloads),
            "summarizer": summaries, "output": output}


def dollars(tokens: dict[str, int], prices: dict[str, float], output: int) -> float:
    plain = tokens["input"] - tokens["read"] - tokens["written"]
    return (plain * prices["input"] + tokens["read"] * prices["read"] + tokens["written"] * prices["write"]
            + output * prices["output"])


def run(data: Data, quick: bool, **_: Any) -> dict[str, Any]:
    from ..models.llm import litellm_module

    coding = sorted((c for c in data.get("claude_code_sessions") if len(c["messages"]) > 100),
                    key=lambda c: len(c["messages"]))
    plan = [(f"coding {c['id'][:8]}", to_openai(c["messages"])) for c in (coding[:1] if quick else coding)]
    if not quick:
        locomo = [m for c in data.get("locomo") for m in to_openai(c["messages"])]
        plan.append(("LoCoMo ×6 (one session)", locomo))
    windows = WINDOWS[:1] if quick else WINDOWS
    prices = {rules: _prices(model) for rules, model in MODELS.items()}
    rows: list[list[Any]] = []
    metrics: dict[str, Any] = {}
    for label, messages in plan:
        for window in windows:
            for strategy in ("mfs_nb", *STRATEGIES):
                r = _run(strategy, messages, window)
                metrics[f"{label}@{window}/{strategy}"] = r
                for rules, p in prices.items():
                    t = r[rules.lower()]
                    chat = dollars(t, p, r["output"])
                    summ = sum(i * p["input"] + o * p["output"] for i, o in r["summarizer"])
                    rows.append([label, f"{window // 1000}k", strategy, rules, r["calls"],
                                 f"{t['read'] / max(t['input'], 1):.1%}", f"${100 * chat / max(r['calls'], 1):.2f}",
                                 f"${chat:.2f}", f"${summ:.2f}", f"${chat + summ:.2f}"])
    version = getattr(litellm_module(), "version", "") or _litellm_version()
    return {
        "title": "What the calls cost: mfs_nb against truncation, a rolling summary and compact-at-90 %",
        "tables": [{"caption": "Dollars per session and per 100 calls, the cache-read share of input tokens, and the "
                               "summarizer's dollars apart, under each provider's caching rules",
                    "columns": ["session", "window", "strategy", "rules", "calls", "input read from the cache",
                                "chat $ / 100 calls", "chat $", "summarizer $", "total $"],
                    "rows": rows}],
        "notes": [f"prices from litellm {version}'s cost map: Anthropic as {MODELS['Anthropic']}, OpenAI as "
                  f"{MODELS['OpenAI']}; tokens are the estimator's, output tokens the recorded replies' (the same for "
                  "every strategy)",
                  "mfs_nb's summarizer is the offline default here: its calls are priced by their size as a real "
                  "model's would be"] + (["quick run: the smallest coding session at 32k"] if quick else []),
        "metrics": metrics,
    }


def _litellm_version() -> str:
    from importlib.metadata import version

    try:
        return version("litellm")
    except Exception:
        return "?"
