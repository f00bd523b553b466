"""The ways other tools keep (or lose) context, as send-view strategies over the same transcript.

Each strategy sees the messages recorded so far before every assistant message (one *call*, as in
`replay`) and returns the payload it would send. All use the same token estimator, the same usable
window as mfs_nb (`ContextProfile.effective`) and the same deterministic offline summarizer
(`offline.extractive_summary`), so a comparison isolates the memory strategy:

- ``last-n``: the last N exchanges (notebook AI magics keep 2);
- ``truncate``: as many recent messages as fit;
- ``rolling``: when full, one summary of everything before a recent tail, the previous summary
  included (the Claude Code / LangChain shape);
- ``user+summary``: when full, the recent user messages verbatim up to 20k tokens (less in small
  windows) plus one summary of everything (the Codex CLI shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models.offline import extractive_summary
from ..window.tokens import estimate_tokens, message_tokens
from ..window.usage import ContextProfile

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
FULL_AT = 0.85  # share of the usable window at which the summarizing strategies act
COMPACT_AT = 0.90  # compact-90: the production assistants' way (everything becomes one summary)
KEEP_TAIL = 0.25  # the recent tail the rolling summary keeps raw
USER_BUDGET = 20_000


@dataclass
class Run:
    """Payload of every call, which calls followed a summarization, and the final payload's raw
    message indices (into the transcript)."""

    payloads: list[list[dict[str, Any]]] = field(default_factory=list)
    events: list[bool] = field(default_factory=list)
    final: list[dict[str, Any]] = field(default_factory=list)
    final_raw: list[int | None] = field(default_factory=list)
    summaries: list[tuple[int, int]] = field(default_factory=list)  # each summarization: tokens read, written


def _fit_from(messages: Sequence[dict[str, Any]], start: int, end: int, budget: int, counts: list[int]) -> int:
    """The earliest index >= start such that messages[i:end] fit `budget`, never starting on a
    tool result (it would lack its call)."""
    used, i = 0, end
    while i > start and used + counts[i - 1] <= budget:
        i -= 1
        used += counts[i]
    while i < end and messages[i].get("role") == "tool":
        i += 1
    return i


def _summary_target(tokens: int, effective: int) -> int:
    lo, hi = min(1_000, int(0.1 * effective)), min(16_000, int(0.2 * effective))
    return max(lo, min(hi, tokens // 2))


def _summarize(previous: str, messages: Sequence[dict[str, Any]], target: int) -> str:
    items = ([{"role": "user", "content": "Summary so far: " + previous}] if previous else [])
    items += [m for m in messages if m.get("role") in ("user", "assistant")]
    return extractive_summary(items, target)


def simulate(name: str, messages: Sequence[dict[str, Any]], window: int, n_exchanges: int = 2) -> Run:
    """Run strategy `name` over the transcript; a call happens before each assistant message."""
    eff = ContextProfile(window).effective
    counts = [message_tokens(m) for m in messages]
    sys_tokens = message_tokens(SYSTEM)
    run = Run()
    summary, covered = "", 0  # summarizing strategies: text and index of the first raw message
    kept_users: list[int] = []
    last = max((j for j, x in enumerate(messages) if x.get("role") == "assistant"), default=-1)
    user_starts: list[int] = []
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            user_starts.append(i)
        if m.get("role") != "assistant":
            continue
        event = False
        if name == "last-n":
            start = user_starts[-n_exchanges] if len(user_starts) >= n_exchanges else 0
            start = _fit_from(messages, start, i, eff - sys_tokens, counts)
            head: list[dict[str, Any]] = []
            raw = list(range(start, i))
        elif name == "truncate":
            start = _fit_from(messages, 0, i, eff - sys_tokens, counts)
            head, raw = [], list(range(start, i))
        else:
            def size(kept: list[int], text: str, first: int, end: int) -> int:
                extra = sum(counts[j] for j in kept) + (message_tokens({"role": "user", "content": text}) if text else 0)
                return sys_tokens + extra + sum(counts[first:end])

            if size(kept_users, summary, covered, i) > (COMPACT_AT if name == "compact-90" else FULL_AT) * eff:
                event = True
                read = sum(counts[covered:i]) + (message_tokens({"role": "user", "content": summary}) if summary else 0)
                if name == "rolling":
                    cut = _fit_from(messages, covered, i, int(KEEP_TAIL * eff), counts)
                    part = messages[covered:cut]
                    read -= sum(counts[cut:i])
                    summary = _summarize(summary, part, _summary_target(sum(counts[covered:cut]), eff))
                    covered = cut
                elif name == "compact-90":  # everything before the current turn becomes one summary
                    cut = user_starts[-1] if user_starts and user_starts[-1] > covered else i
                    read -= sum(counts[cut:i])
                    summary = _summarize(summary, messages[covered:cut], _summary_target(sum(counts[covered:cut]), eff))
                    covered = cut
                else:  # user+summary: summarize everything, keep recent user messages, no raw tail
                    part = messages[covered:i]
                    summary = _summarize(summary, part, _summary_target(sum(counts[covered:i]), eff))
                    users = user_starts
                    budget, kept_users, used = min(USER_BUDGET, int(0.3 * eff)), [], 0
                    for j in reversed(users):
                        if used + counts[j] > budget:
                            break
                        kept_users.insert(0, j)
                        used += counts[j]
                    covered = i
                run.summaries.append((read, message_tokens({"role": "user", "content": summary})))
            note = {"role": "user", "content": "[summary of the earlier conversation]\n" + summary} if summary else None
            head = [messages[j] for j in kept_users] + ([note] if note else [])
            start = covered
            if size(kept_users, summary, covered, i) > eff:  # still too big: drop the oldest raw messages (the request must fit)
                start = _fit_from(messages, covered, i, eff - sys_tokens - sum(message_tokens(h) for h in head),
                                  counts)
            raw = list(range(start, i))
        payload = [SYSTEM, *head, *(messages[j] for j in raw)]
        run.payloads.append(payload)
        run.events.append(event)
        if i == last:
            run.final = payload
            users_in_head = kept_users if name == "user+summary" else []
            run.final_raw = [None, *users_in_head, *([None] if len(head) > len(users_in_head) else []), *raw]
    return run


STRATEGIES = ("last-n", "truncate", "rolling", "user+summary")


ADVERSARIAL = ("bag-of-atoms", "atoms+filler", "uid-map")
"""Strategies that keep nothing a model could use, kept in the harness so that a metric which
rewards them shows up at once: every atom of the history with no context; every atom followed by
the same few words that are most common around facts in this conversation; segment headers with
no prose. All keep the same raw tail as ``rolling`` and fill the same budget."""


def adversarial(name: str, messages: Sequence[dict[str, Any]], window: int, atoms: Sequence[str],
                filler: Sequence[str] = ()) -> Run:
    """The final payload of adversarial strategy `name` before the last assistant message;
    `atoms` is every atom of the history, oldest first; `filler` the words ``atoms+filler`` adds."""
    eff = ContextProfile(window).effective
    counts = [message_tokens(m) for m in messages]
    last = max((j for j, x in enumerate(messages) if x.get("role") == "assistant"), default=0)
    start = _fit_from(messages, 0, last, int(KEEP_TAIL * eff), counts)
    budget = eff - message_tokens(SYSTEM) - sum(counts[start:last])
    if name == "bag-of-atoms":
        items = list(dict.fromkeys(atoms))
    elif name == "atoms+filler":
        items = [f"{a} {' '.join(filler[:3])}" for a in dict.fromkeys(atoms)]
    elif name == "uid-map":
        items = [f"[segment #{k + 1} · uids {a + 1}–{min(a + 40, start)}]" for k, a in enumerate(range(0, start, 40))]
    else:
        raise ValueError(f"unknown adversarial strategy: {name}")
    lines: list[str] = []
    used = 0
    for item in items:
        cost = estimate_tokens(item) + 1
        if used + cost > budget:
            break
        lines.append(item)
        used += cost
    run = Run()
    note = {"role": "user", "content": "\n".join(lines)}
    run.final = [SYSTEM, note, *messages[start:last]]
    run.final_raw = [None, None, *range(start, last)]
    run.payloads, run.events = [run.final], [False]
    return run
