"""Pure functions from engine objects to JSON-ready view data, and escaped fallbacks.

Widgets only display what these return; nothing here holds memory logic. Every string that came
from a user, a model or a file is escaped before it goes into HTML (and the front ends only ever
set textContent).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from ..compaction.consolidation import labels
from ..events import Event
from ..window.usage import SOURCE_LABELS, Usage, human, tier_label

TIER_COLOURS = {"ok": "#2e7d32", "warn": "#f9a825", "compress": "#ef6c00", "hard": "#c62828"}
FOLD_CHARS = 2_000
LAYER_TEXT_CHARS = 20_000
TOOL_STATES = ("full", "trimmed", "cleared", "compacted", "missing")
LEDGER_COLUMNS = ("seq", "time", "kind", "tier", "tokens_before", "tokens_after", "llm_tokens", "uid_from",
                  "uid_to", "segments", "cleared", "chars_saved", "degraded", "duration_s", "reason")


def status_data(usage: Usage, notices: Sequence[str] = ()) -> dict[str, Any]:
    """The status line under a reply: meter numbers, tier, cache, session, notices."""
    return {
        "line": usage.status_line(),
        "tokens": usage.tokens,
        "window": usage.window,
        "effective": usage.effective,
        "ratio": round(usage.ratio, 4),  # of the usable window, like every percentage shown
        "percent": usage.percent,
        "tier": usage.tier,
        "tier_label": usage.label,
        "colour": TIER_COLOURS.get(usage.tier, "#555"),
        "source": usage.source,
        "source_label": SOURCE_LABELS.get(usage.source, usage.source),
        "cache_ratio": usage.cache_ratio,
        "prefix_ratio": usage.prefix_ratio,
        "session": usage.session,
        "notices": list(notices),
    }


def status_html(data: dict[str, Any]) -> str:
    notices = "".join(f"<div class='mfs-notice'>{html.escape(n)}</div>" for n in data["notices"])
    width = min(100.0, data["ratio"] * 100)
    return (
        "<div class='mfs-status' style='font:12px monospace;color:#666'>"
        f"<span class='mfs-meter' style='display:inline-block;width:80px;height:6px;background:#eee;vertical-align:middle'>"
        f"<span class='mfs-meter-fill' style='display:block;height:6px;width:{width:.1f}%;"
        f"background:{html.escape(data['colour'])}'></span></span> "
        f"<span class='mfs-line'>{html.escape(data['line'])}</span>{notices}</div>"
    )


# -- recall --------------------------------------------------------------------------------
def event_data(event: Event, retried: Mapping[int, int] | None = None) -> dict[str, Any]:
    """One event for the recall viewer; `retried` marks the events of a turn that failed and was asked again."""
    from ..recall.tools import retry_mark

    calls = [{"name": (c.get("function") or {}).get("name", ""), "arguments": (c.get("function") or {}).get("arguments", "")}
             for c in event.tool_calls]
    return {"uid": event.uid, "turn": event.turn, "role": event.role, "origin": event.origin, "name": event.name,
            "created_at": event.created_at, "content": event.content, "chars": len(event.content),
            "tool_calls": calls, "folded": len(event.content) > FOLD_CHARS,
            "mark": retry_mark(retried[event.uid]) if retried and event.uid in retried else ""}


def recall_data(events: Sequence[Event], retried: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The recall viewer's data: each event, and the plain-text form the model's tool also returns."""
    from ..recall.tools import format_events

    return {"events": [event_data(e, retried) for e in events],
            "text": format_events(events, max_chars=10**12, retried=retried)}


def recall_html_from_data(events: Sequence[dict[str, Any]]) -> str:
    rows = []
    for d in events:
        head = f"#{d['uid']} {d['role']}" + (f" · {d['origin']}" if d["origin"] and d["origin"] != d["role"] else "")
        head += (f" · {d['name']}" if d["name"] else "") + f" · turn {d['turn']} · {d['created_at']}"
        head += f" · {d['mark']}" if d.get("mark") else ""
        calls = "".join(f"<div>→ {html.escape(c['name'])}({html.escape(c['arguments'])})</div>" for c in d["tool_calls"])
        rows.append(f"<details{'' if d['folded'] else ' open'} class='mfs-event'><summary style='font:12px monospace;"
                    f"color:#555'>{html.escape(head)} ({d['chars']:,} chars)</summary>"
                    f"<pre style='white-space:pre-wrap;overflow-wrap:break-word;word-break:normal'>"
                    f"{html.escape(d['content'])}</pre>{calls}</details>")
    return "<div class='mfs-recall'>" + "".join(rows) + "</div>"


def recall_text(events: Sequence[Event], retried: Mapping[int, int] | None = None) -> str:
    return str(recall_data(events, retried)["text"])


def recall_html(events: Sequence[Event], retried: Mapping[int, int] | None = None) -> str:
    return recall_html_from_data(recall_data(events, retried)["events"])


# -- the layered send view ------------------------------------------------------------------
def _label(kind: str, position: str | None) -> str:
    if kind == "segment":  # L0: made from the original messages; L1, L2, …: merged from older summaries
        return "summary" if (position or "L0") == "L0" else "merged summary"
    return {"system": "system", "evicted": "evicted maps", "raw": "raw tail", "dropped": "dropped",
            "verbatim": "user's words", "facts": "fact lines",
            "knowledge": "knowledge slot"}.get(kind, kind)


def context_data(session: Any) -> dict[str, Any]:
    """Layers of the current payload with their exact text, coverage gaps, and the tool trajectory."""
    from ..layers.segments import uncovered

    view = session.send_view()
    usage = session.usage(view)
    layers = []
    i = 0
    positions = iter(labels([x.level for x in view.layers if x.kind == "segment"]))
    for layer in view.layers:
        text = "\n\n".join(f"[{m['role']}] {m.get('content') or ''}" + (
            "\n[tool calls] " + "; ".join(f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
                                          for c in m.get("tool_calls") or ()) if m.get("tool_calls") else "")
            for m in view.messages[i:i + layer.messages])
        if len(text) > LAYER_TEXT_CHARS:
            text = text[:LAYER_TEXT_CHARS] + f"\n[… {len(text) - LAYER_TEXT_CHARS:,} more chars; %recall shows them]"
        i += layer.messages
        span = "static" if layer.uid_from is None else (
            f"uid {layer.uid_from}" if layer.uid_from == layer.uid_to else f"uids {layer.uid_from}–{layer.uid_to}")
        position = next(positions) if layer.kind == "segment" else None
        layers.append({"kind": layer.kind, "label": _label(layer.kind, position),
                       "uid_from": layer.uid_from, "uid_to": layer.uid_to, "span": span, "tokens": layer.tokens,
                       "level": layer.level, "degraded": layer.degraded, "messages": layer.messages, "text": text})
    _add_unlisted_tokens(layers, session, usage)
    spans = [(x.uid_from, x.uid_to) for x in session.compactor.segments] + list(session.compactor.evicted)
    # a failed turn asked again is in the log, left out of the payload on purpose: not a gap
    gaps = uncovered([e.uid for e in session.events], view.raw_uids() | set(session.retried()), spans)
    forms = {u: f for u, f in zip(view.uids, view.forms) if u is not None}
    results = {e.tool_call_id: e for e in session.events if e.role == "tool"}
    tools = []
    for e in session.events:
        for call in e.tool_calls:
            fn = call.get("function") or {}
            result = results.get(str(call.get("id", "")))
            if result is None:
                state = "missing"
            elif result.uid not in forms:
                state = "compacted"  # inside a segment: only the summary and fact lines remain
            else:
                state = {"full": "full", "trimmed": "trimmed", "cleared": "cleared"}.get(forms[result.uid], "full")
            tools.append({"uid": e.uid, "name": fn.get("name", ""), "arguments": fn.get("arguments", ""),
                          "result_uid": result.uid if result else None, "state": state,
                          "chars": len(result.content) if result else 0})
    profile = session.profile()
    lines = {t: int(getattr(profile, t) * profile.effective) for t in ("warn", "compress", "hard")}
    return {"usage": status_data(usage), "layers": layers, "gaps": gaps, "tools": tools, "lines": lines}


def _add_unlisted_tokens(layers: list[dict[str, Any]], session: Any, usage: Usage) -> None:
    """One token number: the rows add up to the meter's total. Tool schemas are sent with every
    call but are not messages; when the provider's count anchors the meter (or the calibration
    factor scales the estimate), the difference from the layers' estimates is its own row."""
    schemas = session._tool_schema_tokens()
    if schemas:
        names = ", ".join(t.get("function", {}).get("name", "") for t in session._tool_schemas())
        layers.append({"kind": "tools", "label": "tool schemas", "uid_from": None, "uid_to": None, "span": "static",
                       "tokens": schemas, "level": None, "degraded": False, "messages": 0,
                       "text": f"sent with every call, outside the messages: {names}"})
    rest = usage.tokens - sum(x["tokens"] for x in layers)
    if rest:
        more = "more" if rest > 0 else "fewer"
        if usage.source == "anchor+estimate":
            label, span = "provider's count", f"{more} than estimated"
            why = (f"the provider counted {abs(rest):,} tokens {more} than the estimates of the rows above add up "
                   "to; the total is the provider's count (plus estimates of what was added since)")
        else:
            label, span = "estimate scaled", f"by {session.calibration:.2f}"
            why = (f"the estimates of the rows above are scaled by {session.calibration:.2f}, how the provider's counts "
                   f"have compared with them so far: {abs(rest):,} tokens {more}")
        layers.append({"kind": "measured", "label": label, "uid_from": None, "uid_to": None,
                       "span": span, "tokens": rest, "level": None, "degraded": False, "messages": 0,
                       "text": why})


# -- the ledger ----------------------------------------------------------------------------
def ledger_data(rows: Sequence[dict[str, Any]], history: Sequence[dict[str, Any]], effective: int) -> dict[str, Any]:
    """Ledger rows with a stable column set, and the payload-tokens-per-call series with marks."""
    columns = [c for c in LEDGER_COLUMNS if any(c in r for r in rows)] or ["seq", "time", "kind"]
    extra = sorted({k for r in rows for k in r} - set(columns))
    marks = [h["call"] for h in history if h.get("acted")]
    return {"columns": columns + extra, "rows": [dict(r) for r in rows], "series": list(history), "marks": marks,
            "effective": effective, "cells": [{k: cell_text(k, v) for k, v in r.items()} for r in rows]}


LIST_ITEMS = 8  # a list in a ledger cell shows this many items, then how many more


def cell_text(key: str, value: Any) -> str:
    """One ledger value as words: tiers by name, yes/no, lists and objects as short phrases (never JSON)."""
    if value is None or value == "" or value == [] or value == {}:
        return ""
    if key == "tier" and isinstance(value, str):
        return tier_label(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return ", ".join(f"{column_name(k)} {cell_text(k, v)}".strip() for k, v in value.items()
                         if cell_text(k, v) != "")
    if isinstance(value, (list, tuple)):
        items = [cell_text(key, v) for v in value[:LIST_ITEMS]]
        more = f" (+{len(value) - LIST_ITEMS} more)" if len(value) > LIST_ITEMS else ""
        return ("; " if any(isinstance(v, dict) for v in value) else ", ").join(items) + more
    return str(value)


def column_name(key: str) -> str:
    """`tokens_before` → 'tokens before'; `upto` → 'up to'."""
    return {"upto": "up to", "uid_from": "from uid", "uid_to": "to uid", "seq": "#",
            **ORIGIN_WORDS}.get(key, key.replace("_", " "))


# the columns of an `origin` row (`track.classify_pending`): how many of your messages each disposition got
ORIGIN_WORDS = {"own": "your own words", "quote": "pasted AI output", "quote_note": "pasted AI output with your note",
                "document": "documents"}


def origin_phrase(row: dict[str, Any]) -> str:
    """An `origin` ledger row in words: `your messages up to uid 7 sorted by who wrote them: 2 your own words`."""
    counts = ", ".join(f"{row[k]} {words}" for k, words in ORIGIN_WORDS.items() if row.get(k))
    return (f"your messages up to uid {row.get('upto', '?')} sorted by who wrote them: {counts or 'none new'}"
            + (f"; time: {row['time']}" if row.get("time") else ""))


def ledger_phrase(row: dict[str, Any], skip: Sequence[str] = ()) -> str:
    """The fields of a ledger row not in `skip`, as `name: value` phrases (an `origin` row as one sentence)."""
    if row.get("kind") == "origin":
        return origin_phrase(row)
    return "; ".join(f"{column_name(k)}: {cell_text(k, v)}" for k, v in row.items()
                     if k not in skip and cell_text(k, v) != "")


def layers_text(layers: Sequence[Any]) -> str:
    lines = []
    for layer in layers:
        span = f"uids {layer.uid_from}-{layer.uid_to}" if layer.uid_from is not None else "static"
        extra = f" merged {layer.level}×" if layer.level else ""
        extra += " degraded" if layer.degraded else ""
        lines.append(f"{layer.kind:<10} {span:<18} {human(layer.tokens):>7} tokens  {layer.messages} msgs{extra}")
    return "\n".join(lines)
