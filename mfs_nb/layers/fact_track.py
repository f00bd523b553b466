"""The session's fact track: the working set of history no longer in the payload as it was — compacted
or S2-cleared — as one layer (`FactTrack`, `fact_track`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import lang
from ..events import Event
from ..redaction import redact
from ..window.tokens import estimate_tokens
from .facts import stands_whole
from .workset import Line, budget, lines_of, without_shown


# -- the session's fact track: the working set of history no longer in the payload as it was ----
@dataclass(frozen=True)
class FactTrack:
    """The working-set layer of the payload: lines of compacted and S2-cleared history that no
    segment in the payload shows. `upto`: the newest uid it reads."""

    text: str
    upto: int
    first_uid: int | None
    dropped: tuple[int, int] | None
    tokens: int
    whole: tuple[int, ...] = ()  # messages one of its lines shows whole, word for word (`SendView.shown_uids`)


def caption(upto: int, language: str = "") -> str:
    return lang.text("fact_caption", language, upto=upto)


def fact_track(events: Sequence[Event], text_upto: int, tool_upto: int, skip_uids: Iterable[int], max_tokens: int,
               shown_text: str = "") -> FactTrack | None:
    """Text lines of user and assistant messages up to `text_upto` (the compacted history) and tool
    lines (files, commands, errors, and the commands, paths and numbers the tools printed) up to
    `tool_upto` (compacted, or cleared and pruned by S2),
    less what `shown_text` (the segments in the payload) already says word for word and the messages
    in `skip_uids` (kept whole by the user-verbatim track). Errors, commands and decisions first; what
    tools printed last, newest first, in the room the rest leaves."""
    upto = max(text_upto, tool_upto)
    if max_tokens <= 0 or upto <= 0:
        return None
    scope = [e for e in events if e.uid <= upto]
    lines = without_shown(lines_of(scope, text_upto, tool_upto, skip_uids, outputs=max_tokens), shown_text)
    language = lang.header_language(scope)
    head = caption(upto, language)
    kept = budget(lines, max_tokens - estimate_tokens(head), language=language)
    if not kept.lines:
        return None
    text = redact(head + "\n" + kept.render())  # a key a tool printed stays out, as in the cell log
    dropped = (min(x.uids[0] for x in kept.dropped), max(x.newest for x in kept.dropped)) if kept.dropped else None
    return FactTrack(text, upto, min(x.uids[0] for x in kept.lines), dropped, estimate_tokens(text),
                     _whole(kept.lines, {e.uid: e for e in scope}))


def _whole(lines: Sequence[Line], events: dict[int, Event]) -> tuple[int, ...]:
    """The messages a "said" line of one message shows whole (whitespace aside; what a key was redacted
    from is not whole; a message with tool calls never is, since its arguments are not in the line): a
    search for the model leaves them out of its page."""
    out = []
    for x in lines:
        e = events.get(x.uids[0]) if x.group == "said" and len(x.uids) == 1 else None
        if e is not None and not e.tool_calls and stands_whole(e.content, redact(x.text)):
            out.append(e.uid)
    return tuple(sorted(out))
