"""Pure functions from engine objects to JSON-ready view data and escaped fallbacks.

Widgets only display what these return; nothing here holds memory logic. Every string that came
from a user, a model or a file is escaped before it goes into HTML.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..events import Event
from ..usage import Usage, human

TIER_COLOURS = {"ok": "#2e7d32", "warn": "#f9a825", "compress": "#ef6c00", "hard": "#c62828"}
FOLD_CHARS = 2_000


def status_data(usage: Usage, notices: Sequence[str] = ()) -> dict[str, Any]:
    """The status line under a reply: meter numbers, tier, cache, session, notices."""
    return {
        "line": usage.status_line(),
        "tokens": usage.tokens,
        "window": usage.window,
        "effective": usage.effective,
        "ratio": round(usage.ratio, 4),
        "tier": usage.tier,
        "colour": TIER_COLOURS.get(usage.tier, "#555"),
        "source": usage.source,
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
        f"<span style='display:inline-block;width:80px;height:6px;background:#eee;vertical-align:middle'>"
        f"<span style='display:block;height:6px;width:{width:.1f}%;background:{data['colour']}'></span></span> "
        f"{html.escape(data['line'])}{notices}</div>"
    )


def event_data(event: Event) -> dict[str, Any]:
    """One event for the recall viewer."""
    calls = [
        {"name": (c.get("function") or {}).get("name", ""), "arguments": (c.get("function") or {}).get("arguments", "")}
        for c in event.tool_calls
    ]
    return {
        "uid": event.uid,
        "turn": event.turn,
        "role": event.role,
        "origin": event.origin,
        "name": event.name,
        "created_at": event.created_at,
        "content": event.content,
        "chars": len(event.content),
        "tool_calls": calls,
        "folded": len(event.content) > FOLD_CHARS,
    }


def recall_text(events: Sequence[Event]) -> str:
    """Plain-text recall: a header per event, then its exact content."""
    from ..tools import format_events

    return format_events(events, max_chars=10**9)


def recall_html(events: Sequence[Event]) -> str:
    rows = []
    for e in events:
        d = event_data(e)
        head = f"#{d['uid']} · {d['role']}" + (f" · {d['origin']}" if d["origin"] != d["role"] else "")
        head += f" · turn {d['turn']} · {d['created_at']}"
        calls = "".join(f"<div>→ {html.escape(c['name'])}({html.escape(c['arguments'])})</div>" for c in d["tool_calls"])
        opened = "" if d["folded"] else " open"
        rows.append(
            f"<details{opened} class='mfs-event'><summary style='font:12px monospace;color:#555'>{html.escape(head)}"
            f" ({d['chars']:,} chars)</summary><pre style='white-space:pre-wrap'>{html.escape(e.content)}</pre>"
            f"{calls}</details>"
        )
    return "<div class='mfs-recall'>" + "".join(rows) + "</div>"


def layers_text(layers: Sequence[Any]) -> str:
    lines = []
    for layer in layers:
        span = f"uids {layer.uid_from}-{layer.uid_to}" if layer.uid_from is not None else "static"
        extra = f" L{layer.level}" if layer.level is not None else ""
        extra += " degraded" if layer.degraded else ""
        lines.append(f"{layer.kind:<10} {span:<18} {human(layer.tokens):>7} tokens  {layer.messages} msgs{extra}")
    return "\n".join(lines)
