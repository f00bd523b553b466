"""Tools the model can call (docs/architecture.md, "Recall"). Each tool is a JSON schema plus a
function of plain args.

Tool results are always bounded text: a bad argument, an unknown tool or a tool that raises
gives a one-line error result and the turn goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..events import Event
from .ranking import MAX_K, PAGE

MAX_RESULT_CHARS = 60_000
# Results of the memory layer's own tools are paginated to this share of the usable window, and S2
# leaves them whole on the calls that follow (clearing.MEMORY_TOOLS): a recall cut to its head and
# tail would be a recall of nothing.
MEMORY_SHARE = 0.08
MIN_MEMORY_CHARS = 2_000


# Below this usable window (an 8k window's 6,840 tokens; a 16k window's is 13,680) the memory tools are
# offered in their short form (`Tool.short`): the four full schemas take about 680 tokens of every
# request, a tenth of an 8k window, standing before the raw tail like a layer of the budget; the short
# ones keep each tool's use and the search's advice on queries in about 40 % of that (issue 43).
SHORT_BELOW = 10_000


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[..., str]
    short: tuple[str, dict[str, Any]] | None = None  # (description, parameters) offered at a small window

    def schema(self, short: bool = False) -> dict[str, Any]:
        """The OpenAI tool schema (its short form with `short`, when the tool has one)."""
        description, parameters = self.short if short and self.short else (self.description, self.parameters)
        return {"type": "function", "function": {"name": self.name, "description": description,
                                                 "parameters": parameters}}


RECALL_SCHEMA = {
    "type": "object",
    "properties": {
        "uid_from": {"type": "integer", "description": "first uid of the range (inclusive)"},
        "uid_to": {"type": "integer", "description": "last uid of the range (inclusive); defaults to uid_from"},
    },
    "required": ["uid_from"],
}
RECALL_DESCRIPTION = (
    "Return the original messages of this conversation with uids uid_from..uid_to, word for word, "
    "with their roles. Works for any uid ever written, compressed or not."
)

RECALL_SHORT = ("Read messages uid_from..uid_to word for word.", {
    "type": "object", "properties": {"uid_from": {"type": "integer"}, "uid_to": {"type": "integer"}},
    "required": ["uid_from"]})


SEARCH_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "a few keywords and names, not a sentence (e.g. 'billing "
                                                   "pool size', 'Caroline adoption agency'); any language"},
        "k": {"type": "integer", "description": f"how many hits (default {PAGE}, at most {MAX_K})"},
        "role": {"type": "string", "enum": ["user", "assistant", "tool", "segment"],
                 "description": "only messages of this role, e.g. user for what the user said (optional)"},
        "date_from": {"type": "string", "description": "only messages written from this ISO date (optional)"},
        "date_to": {"type": "string", "description": "only messages written up to this ISO date (optional)"},
        "uid_from": {"type": "integer", "description": "only uids from here (optional)"},
        "uid_to": {"type": "integer", "description": "only uids up to here (optional)"},
    },
    "required": ["query"],
}
SEARCH_DESCRIPTION = (
    "Search this whole conversation by meaning and by words, including what is no longer in context. "
    "Query with a few keywords and names; narrow with role or dates when you know them. "
    "Returns uids with a snippet each; then call recall_history with a uid to read the original."
)
SEARCH_SHORT = ("Search all of this conversation, also what is out of context, by a few keywords and names; "
                "read a hit with recall_history.", {
                    "type": "object", "properties": {
                        "query": {"type": "string"}, "role": {"type": "string", "enum": ["user", "assistant"]},
                        "date_from": {"type": "string"}, "date_to": {"type": "string"}},
                    "required": ["query"]})


def memory_result_chars(effective_tokens: int, chars_per_token: float = 3.5) -> int:
    """The page size of recall_history / recall_search results for a window (see MEMORY_SHARE)."""
    return max(MIN_MEMORY_CHARS, min(MAX_RESULT_CHARS, int(MEMORY_SHARE * effective_tokens * chars_per_token)))


def format_hits(results: Any, max_chars: int = MAX_RESULT_CHARS) -> str:
    """Search hits as lines for the model, bounded, with how to read each one in full."""
    hits = list(results)
    notes = [f"[note: {n}]" for n in getattr(results, "notices", [])]
    left = getattr(results, "left_out", ())
    if left:
        notes.append(f"[note: found in your context word for word, so left out of this page: "
                     f"{', '.join(f'#{u}' for u in left)}]")
    if not hits:
        return "\n".join(notes + [("no other matches" if left else "no matches")
                                   + "; try other words, or recall_history with a uid range"])
    lines = [*notes, f"{len(hits)} hits (best first); read one with recall_history(uid, uid):"]
    used = sum(len(x) + 1 for x in lines)
    for i, hit in enumerate(hits):
        line = hit.line()
        if used + len(line) + 1 > max_chars and i:
            lines.append(f"[… {len(hits) - i} more hits left out to fit; call again with a smaller k or narrower "
                         f"uid_from/uid_to]")
            break
        lines.append(line[:max_chars])
        used += len(line) + 1
    return "\n".join(lines)


def format_events(events: Sequence[Event], max_chars: int = MAX_RESULT_CHARS,
                  retried: Mapping[int, int] | None = None) -> str:
    """Events as readable text for the model: a header line per event, then its exact content. An event
    of a turn that failed and was asked again (`retried`: uid → the retry's uid) says so in its header."""
    parts: list[str] = []
    retried = retried or {}
    used = 0
    for i, event in enumerate(events):
        head = f"[#{event.uid} {event.role}"
        if event.origin and event.origin != event.role:
            head += f" · {event.origin}"
        if event.name:
            head += f" · {event.name}"
        head += f" · turn {event.turn}"
        if event.uid in retried:
            head += f" · {retry_mark(retried[event.uid])}"
        head += "]"
        body = event.content
        if event.tool_calls:
            calls = "; ".join(
                f"{c.get('function', {}).get('name', '?')}({c.get('function', {}).get('arguments', '')})"
                for c in event.tool_calls
            )
            body = (body + "\n" if body else "") + f"[tool calls: {calls}]"
        block = f"{head}\n{body}"
        if used + len(block) > max_chars and parts:
            rest = events[i].uid
            parts.append(f"[… output limit reached; call recall_history({rest}, {events[-1].uid}) for the rest]")
            break
        if len(block) > max_chars:
            block = block[:max_chars] + f"\n[… #{event.uid} is {len(event.content):,} chars; shown in part]"
        parts.append(block)
        used += len(block)
    return "\n\n".join(parts)


def retry_mark(uid: int) -> str:
    """The mark of an event whose turn failed and was asked again as `uid`."""
    return f"failed, asked again as #{uid}"


def parse_range(uid_from: Any, uid_to: Any = None) -> tuple[int, int]:
    """Two whole numbers from user or model input; raises InputError with one clear line."""
    def whole(value: Any, what: str) -> int:
        if isinstance(value, bool):
            raise InputError(f"{what} must be a whole number, not {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("#").isdigit():
            return int(value.strip().lstrip("#"))
        raise InputError(f"{what} must be a whole number, not {value!r}")

    a = whole(uid_from, "uid_from")
    b = a if uid_to is None or uid_to == "" else whole(uid_to, "uid_to")
    if b < a:
        raise InputError(f"uid range {a}-{b} is reversed; did you mean {b}-{a}?")
    return a, b


MAX_ARGUMENT_CHARS = 200_000
MAX_ARGUMENT_DEPTH = 32


def check_arguments(arguments: str | None) -> str:
    """Why tool-call arguments are too large or too deeply nested to parse ('' when fine)."""
    text = arguments or ""
    if not isinstance(text, str):
        return "are not text"
    if len(text) > MAX_ARGUMENT_CHARS:
        return f"are {len(text):,} chars, more than {MAX_ARGUMENT_CHARS:,}"
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_ARGUMENT_DEPTH:
                return f"are nested more than {MAX_ARGUMENT_DEPTH} levels deep"
        elif ch in "]}":
            depth -= 1
    return ""


def call_tool(tools: dict[str, Tool], name: str, arguments: str) -> str:
    """Run one tool call; any failure becomes a short error result, never an exception."""
    tool = tools.get(name)
    if tool is None:
        return f"error: unknown tool {name!r}; available: {', '.join(sorted(tools)) or 'none'}"
    bounded = check_arguments(arguments)
    if bounded:
        return f"error: arguments for {name} {bounded}"
    try:
        args = json.loads(arguments) if arguments and arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return f"error: arguments for {name} are not valid JSON ({exc.msg} at position {exc.pos})"
    except RecursionError:
        return f"error: arguments for {name} are nested too deeply"
    if not isinstance(args, dict):
        return f"error: arguments for {name} must be a JSON object"
    try:
        result = tool.run(**args)
    except InputError as exc:
        return f"error: {exc}"
    except TypeError as exc:
        return f"error: bad arguments for {name}: {exc}"
    except Exception as exc:  # a tool must never end the turn
        return f"error: {name} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    text = result if isinstance(result, str) else str(result)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[… result cut at {MAX_RESULT_CHARS:,} of {len(text):,} chars]"
    return text
