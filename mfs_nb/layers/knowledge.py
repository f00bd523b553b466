"""The knowledge slot (docs/architecture.md, "The knowledge slot"): values that must never be
compacted, right after the system prompt.

The user pins them (`%mfs pin key=value`, `Session.pin`), the model saves them with the
`remember(key, value)` tool and drops them with `forget(key)`. The slot is bounded by a share of
the usable window; when a write would pass it, the entries written longest ago leave first and the
writer is told which. Its text depends only on its entries, in the order they were first set, so it
is byte-stable between writes and the provider's prefix cache holds across ordinary calls.

Persistence is the ledger: every write is one `knowledge` row (what was set or removed, who did it,
the tokens the next call reads again because the cached prefix ends at the slot); replaying those
rows in order rebuilds the slot. Nothing here touches the store itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import lang
from ..errors import InputError
from ..redaction import redact
from ..window.tokens import estimate_tokens

MAX_KEYS = 200  # entries in the slot, whatever their size
KEY = re.compile(r"^\w[\w .:/@#+-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

REMEMBER_SCHEMA = {
    "type": "object",
    "properties": {
        "key": {"type": "string", "description": "a short name, e.g. db_port or target_metric"},
        "value": {"type": "string", "description": "the exact value to keep, word for word"},
    },
    "required": ["key", "value"],
}
REMEMBER_DESCRIPTION = (
    "Keep a value that must survive any compaction of this conversation (an exact number, path, name, "
    "decision or constraint) in the knowledge slot, which every later request shows right after the "
    "system prompt. Setting an existing key replaces its value. Keep values short: the slot is small."
)
FORGET_SCHEMA = {
    "type": "object",
    "properties": {"key": {"type": "string", "description": "the key to remove from the knowledge slot"}},
    "required": ["key"],
}
FORGET_DESCRIPTION = "Remove a value you or the user kept in the knowledge slot when it no longer holds."
# the short forms offered at a small window (tools.SHORT_BELOW)
REMEMBER_SHORT = ("Keep an exact value in the knowledge slot, shown in every request.", {
    "type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
    "required": ["key", "value"]})
FORGET_SHORT = ("Remove a key from the knowledge slot.", {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    by: str  # user | model
    touched: int  # the write that last set it (older writes leave first when the slot is full)

    def render(self) -> str:
        who = "" if self.by == "user" else " (saved by you)"
        value = self.value.replace("\n", "\n  ")
        return f"- {self.key}{who}: {value}"


def check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise InputError(f"a knowledge key must be text, got {type(key).__name__}")
    text = key.strip()
    if not KEY.match(text) or any("\ud800" <= c <= "\udfff" for c in text):
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise InputError(f"knowledge key {shown!r} is invalid: 1-64 letters, digits, spaces or _ . : / @ # + -, "
                         "starting with a letter or digit")
    return text


def check_value(key: str, value: Any, budget: int) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise InputError(f"the value of {key!r} is binary data; the knowledge slot keeps text only")
    if value is None or not isinstance(value, (str, int, float, bool)):
        raise InputError(f"the value of {key!r} must be text, got {type(value).__name__}")
    text = str(value).replace("\r\n", "\n").replace("\r", "\n").strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"the value of {key!r} is not valid text (an undecodable character at position "
                         f"{exc.start}); the slot keeps text only") from None
    if not text:
        raise InputError(f"the value of {key!r} is empty; to remove the key use %mfs unpin {key} (or forget)")
    if _CONTROL.search(text):
        raise InputError(f"the value of {key!r} contains control characters (binary data?); the slot keeps text only")
    if redact(text) != text:
        raise InputError(f"the value of {key!r} looks like an API key; keys are read from the environment and "
                         "never saved")
    tokens = estimate_tokens(text)
    if tokens > budget:
        raise InputError(f"the value of {key!r} has about {tokens:,} tokens; the knowledge slot holds {budget:,} "
                         "(knowledge_share of the usable window): keep a shorter value, or attach the text with "
                         "%%chat --doc")
    return text


class KnowledgeSlot:
    """The slot's entries, rebuilt from the ledger's `knowledge` rows."""

    def __init__(self, rows: Iterable[dict[str, Any]] = ()):
        self.entries: dict[str, Entry] = {}
        self.writes = 0
        self.language = ""  # of the header: the conversation's as of the latest write (lang.py)
        for row in rows:
            self.apply(row)

    def apply(self, row: dict[str, Any]) -> None:
        """Replay one ledger row (its `set` entries, then everything it removed)."""
        self.writes += 1
        self.language = row.get("language", self.language)
        entries = dict(self.entries)  # copy on write: a projection in another thread reads a whole dict
        for item in row.get("set") or ():
            # a key set again keeps its place, so the text before it stays byte-identical
            entries[item["key"]] = Entry(item["key"], item["value"], item.get("by", "user"), self.writes)
        for key in [*(row.get("removed") or ()), *(row.get("evicted") or ())]:
            entries.pop(key, None)
        self.entries = entries

    def text(self, entries: Mapping[str, Entry] | None = None) -> str | None:
        shown = self.entries if entries is None else entries
        if not shown:
            return None
        return lang.text("knowledge_header", self.language) + "\n" + "\n".join(e.render() for e in shown.values())

    def tokens(self, entries: Mapping[str, Entry] | None = None) -> int:
        text = self.text(entries)
        return estimate_tokens(text) + 4 if text else 0

    def plan_set(self, items: Mapping[str, Any], by: str, budget: int) -> dict[str, Any]:
        """The ledger row for setting `items` (validated), with the entries that must leave for them
        to fit: written longest ago first, never one of `items`. Raises InputError, changing nothing."""
        if not items:
            raise InputError("nothing to pin: give key=value")
        if len(items) > MAX_KEYS:
            raise InputError(f"{len(items):,} keys at once; the knowledge slot holds at most {MAX_KEYS} entries")
        room = budget - max(estimate_tokens(lang.text("knowledge_header", x)) for x in ("", lang.CHINESE)) - 4
        clean: dict[str, str] = {}
        for key, value in items.items():
            k = check_key(key)
            clean[k] = check_value(k, value, room)
        trial = dict(self.entries)
        for k, v in clean.items():
            trial[k] = Entry(k, v, by, self.writes + 1)
        if self.tokens({k: trial[k] for k in clean}) > budget:
            raise InputError(f"these {len(clean)} values take about {self.tokens({k: trial[k] for k in clean}):,} "
                             f"tokens together; the knowledge slot holds {budget:,}: pin fewer or shorter values")
        evicted: list[str] = []
        for old in sorted((e for e in self.entries.values() if e.key not in clean), key=lambda e: e.touched):
            if self.tokens(trial) <= budget and len(trial) <= MAX_KEYS:
                break
            del trial[old.key]
            evicted.append(old.key)
        changed = [k for k, v in clean.items() if k not in self.entries or self.entries[k].value != v
                   or self.entries[k].by != by]
        return {"set": [{"key": k, "value": v, "by": by} for k, v in clean.items()], "evicted": evicted,
                "changed": changed, "tokens": self.tokens(trial), "budget": budget, "entries": len(trial)}

    def plan_remove(self, keys: Sequence[Any]) -> dict[str, Any]:
        if not keys:
            raise InputError("nothing to unpin: give a key")
        names = [check_key(k) for k in keys]
        missing = [k for k in names if k not in self.entries]
        if missing:
            have = ", ".join(self.entries) or "none"
            raise InputError(f"no key {missing[0]!r} in the knowledge slot (it has: {have[:300]})")
        trial = {k: e for k, e in self.entries.items() if k not in names}
        return {"removed": names, "tokens": self.tokens(trial), "entries": len(trial)}
