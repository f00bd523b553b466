"""Static HTML for every mfs output (issue 17): what a notebook saved with its outputs shows when it
is reopened without a kernel. Only tags and inline styles JupyterLab's sanitizer keeps (div, span,
table, details, pre); every string from a user, a model or a file is escaped."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..window.usage import human

KIND_COLOURS = {"system": "#90a4ae", "knowledge": "#8d6e63", "evicted": "#d7ccc8", "segment": "#7e57c2", "consolidated": "#4527a0",
                "verbatim": "#26a69a", "facts": "#ffb74d", "raw": "#42a5f5", "dropped": "#ef9a9a",
                "tools": "#b0bec5", "measured": "#eceff1"}
PRE = ("white-space:pre-wrap;overflow-wrap:break-word;word-break:normal;font:12px monospace;background:#f7f7f7;"
       "padding:6px;max-height:360px;overflow:auto;margin:4px 0")
PANEL = "font:12px sans-serif;border:1px solid #ddd;border-radius:4px;padding:8px;max-width:100%;box-sizing:border-box"
LEDGER_DEFAULT = ("seq", "kind", "tier", "tokens_before", "tokens_after", "uid_from", "uid_to", "reason")
CHART_MIN_CALLS = 10
CHART_COLUMNS = 160


def escape(value: Any) -> str:
    return html.escape(str(value))


def scale_bar(parts: Sequence[tuple[str, int, str]], total: int, marks: Sequence[tuple[str, int]]) -> str:
    """A bar drawn to the scale of `total` (the window): coloured parts, then thin marks at lines."""
    total = max(total, 1)
    spans = "".join(
        f"<span class='mfs-bar-part' title='{escape(label)}' style='display:inline-block;height:16px;vertical-align:top;"
        f"width:{min(100.0, 100 * tokens / total):.2f}%;background:{colour}'></span>"
        for label, tokens, colour in parts if tokens > 0)
    ticks = "".join(
        f"<span title='{escape(label)}' style='position:absolute;top:-3px;height:22px;width:2px;background:#c62828;"
        f"left:{min(99.8, 100 * at / total):.2f}%'></span>" for label, at in marks)
    return (f"<div style='position:relative;height:16px;width:100%;background:#eee;border-radius:3px;margin:6px 0;"
            f"white-space:nowrap;overflow:visible'>{spans}{ticks}</div>")


def context_html(d: dict[str, Any]) -> str:
    """%context: header with the one number, the bar to the usable window's scale with the compaction line,
    then one collapsible section per layer, the coverage check and the tool trajectory."""
    usage = d["usage"]
    lines = d.get("lines") or {}
    layers = d["layers"]
    parts = [(x["label"], x["tokens"], KIND_COLOURS.get(x["kind"], "#999")) for x in layers if x["kind"] != "measured"]
    marks = [(f"compaction line: {human(lines['compress'])} tokens", lines["compress"])] if "compress" in lines else []
    legend = " ".join(
        f"<span style='white-space:nowrap'><span style='display:inline-block;width:10px;height:10px;"
        f"background:{KIND_COLOURS.get(k, '#999')};margin-right:3px'></span>{escape(k)}</span>"
        for k in dict.fromkeys(x["kind"] for x in layers))
    head = (f"<div><b>{usage['tokens']:,} tokens</b> of {usage['effective']:,} usable "
            f"({escape(usage.get('percent') or format(usage['ratio'], '.0%'))} of the usable window; the model's window is "
            f"{usage['window']:,}) · {escape(usage.get('tier_label') or usage['tier'])} · "
            f"{escape(usage.get('source_label') or usage['source'])}"
            + (f" · red line: compaction at {human(lines['compress'])}" if "compress" in lines else "") + "</div>")
    rows = "".join(
        f"<details class='mfs-layer' style='border-top:1px solid #eee'><summary style='cursor:pointer;font-family:monospace'>"
        f"<span style='display:inline-block;width:10px;height:10px;background:{KIND_COLOURS.get(x['kind'], '#999')};"
        f"margin-right:6px'></span>{escape(x['label'])} · {escape(x['span'])} · {x['tokens']:,} tokens"
        f"{' · degraded' if x['degraded'] else ''}</summary><pre style='{PRE}'>{escape(x['text'])}</pre></details>"
        for x in layers)
    gaps = (f"<div style='color:#c62828;font-weight:600'>coverage gap: {len(d['gaps'])} uid(s) neither raw nor in a "
            f"segment: {escape(d['gaps'][:20])}</div>" if d["gaps"] else
            "<div style='color:#777'>coverage: every uid is raw, in a segment, or in a recorded evicted range</div>")
    tools = ""
    if d["tools"]:
        items = "".join(f"<li>#{t['uid']} {escape(t['name'])} → {escape(t['state'])} ({t['chars']:,} chars)</li>"
                        for t in d["tools"])
        tools = (f"<details class='mfs-tools' style='margin-top:6px'{' open' if len(d['tools']) <= 10 else ''}>"
                 f"<summary style='cursor:pointer'>tool trajectory: {len(d['tools'])} call(s)</summary>"
                 f"<ul style='max-height:240px;overflow-y:auto;margin:4px 0'>{items}</ul></details>")
    return (f"<div class='mfs-context' style='{PANEL}'>{head}{scale_bar(parts, usage.get('effective') or usage['window'], marks)}"
            f"<div style='color:#555'>{legend}</div>{gaps}{rows}{tools}</div>")


def ledger_summary(d: dict[str, Any]) -> str:
    series = d["series"]
    kinds: dict[str, int] = {}
    for r in d["rows"]:
        kinds[str(r.get("kind"))] = kinds.get(str(r.get("kind")), 0) + 1
    peak = max((p.get("tokens", 0) for p in series), default=0)
    last = series[-1].get("tokens", 0) if series else 0
    acted = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no actions yet"
    return (f"{len(series)} call{'s' if len(series) != 1 else ''} · payload at the last call {human(last)}, peak {human(peak)} of "
            f"{human(d.get('effective') or 0)} usable{cache_summary(series)} · {acted}")


def cache_summary(series: list[dict[str, Any]]) -> str:
    """The provider's own cache figures over the calls that reported them, or nothing."""
    reported = [p for p in series if p.get("prompt_tokens")]
    prompt = sum(int(p["prompt_tokens"]) for p in reported)
    if not prompt:
        return ""
    read = sum(int(p.get("cache_read") or 0) for p in reported)
    written = sum(int(p.get("cache_write") or 0) for p in reported)
    return (f" · provider cache: {read / prompt:.1%} of input read" + (f", {written / prompt:.1%} written" if written else "")
            + (f" ({len(reported)} of {len(series)} calls reported)" if len(reported) < len(series) else ""))


def _read_share(p: dict[str, Any]) -> float:
    prompt = int(p.get("prompt_tokens") or 0)
    return min(1.0, int(p.get("cache_read") or 0) / prompt) if prompt else 0.0


def ledger_chart(d: dict[str, Any]) -> str:
    """Payload tokens per call as columns (the sawtooth of compactions), purple where the memory
    layer acted, with the usable window as the top; at most CHART_COLUMNS columns (max per bucket)."""
    series = d["series"]
    top = max([d.get("effective") or 0] + [p.get("tokens", 0) for p in series]) or 1
    marks = set(d.get("marks") or [])
    step = max(1, -(-len(series) // CHART_COLUMNS))
    cols = []
    for i in range(0, len(series), step):
        bucket = series[i:i + step]
        peak = max(bucket, key=lambda p: p.get("tokens", 0))
        tokens = peak.get("tokens", 0)
        acted = any(p.get("call") in marks for p in bucket)
        colour = "#7e57c2" if acted else "#64b5f6"
        read = _read_share(peak)  # the part the provider read from its cache, darker at the bottom
        fill = f"linear-gradient(to top,#1e4f8a {100 * read:.1f}%,{colour} {100 * read:.1f}%)" if read else colour
        said = f", {read:.0%} read from the provider's cache" if peak.get("prompt_tokens") else ""
        cols.append(f"<span title='call {bucket[0].get('call')}: {tokens:,} tokens{said}' style='display:inline-block;"
                    f"vertical-align:bottom;width:{100 / max(1, -(-len(series) // step)):.3f}%;"
                    f"height:{100 * tokens / top:.1f}%;background:{fill}'></span>")
    return ("<div style='height:90px;width:100%;border-top:1px dashed #c62828;border-bottom:1px solid #ccc;"
            f"white-space:nowrap;margin:6px 0;line-height:0'>{''.join(cols)}</div>")


def ledger_html(d: dict[str, Any]) -> str:
    """%mfs ledger: a one-line summary, the chart from CHART_MIN_CALLS calls on, and a table that
    scrolls inside its box: a few columns, the rest of each row folded into its last cell."""
    rows = d["rows"]
    summary = f"<div>{escape(ledger_summary(d))}</div>"
    chart = ""
    if len(d["series"]) >= CHART_MIN_CALLS:
        cached = any(p.get("cache_read") for p in d["series"])
        chart = ("<div style='color:#777'>payload tokens per call; purple: the memory layer acted; "
                 + ("dark blue at the bottom: read from the provider's cache; " if cached else "")
                 + "dashed: the usable window</div>" + ledger_chart(d))
    if not rows:
        return f"<div class='mfs-ledger' style='{PANEL}'>{summary}{chart}<div>ledger is empty: the memory layer " \
               "has not acted yet</div></div>"
    from .data import cell_text, column_name, ledger_phrase

    cols = [c for c in LEDGER_DEFAULT if c in d["columns"]]
    cell = "border-bottom:1px solid #eee;padding:2px 6px;text-align:left;vertical-align:top;font-family:monospace"
    head = "".join(f"<th style='{cell};background:#f3f3f3'>{escape(column_name(c))}</th>" for c in cols) + \
        f"<th style='{cell};background:#f3f3f3'>details</th>"
    body = []
    for r in rows:
        more = ledger_phrase(r, cols)  # every other field, in words: wrapped in its cell, never cut off
        body.append("<tr>" + "".join(f"<td style='{cell}'>{escape(cell_text(c, r.get(c)))}</td>" for c in cols)
                    + f"<td style='{cell};font-family:sans-serif;min-width:240px;white-space:normal;"
                    f"overflow-wrap:anywhere'>{escape(more)}</td></tr>")
    table = (f"<div style='max-width:100%;overflow-x:auto;max-height:420px;overflow-y:auto'>"
             f"<table class='mfs-ledger' style='border-collapse:collapse;font-size:12px'><tr>{head}</tr>"
             f"{''.join(body)}</table></div>")
    return f"<div class='mfs-ledger' style='{PANEL}'>{summary}{chart}{table}</div>"
