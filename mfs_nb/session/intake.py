"""Intake: the checks a user message passes before anything is written, and its channel (a quote,
own words, attached documents, a pasted document) with the verdict the user-verbatim track gets."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError
from ..events import Event, replies_before
from ..layers import snapshots
from ..layers.origin import (
    DOCUMENT,
    OWN,
    QUOTE,
    QUOTE_NOTE,
    RECENT,
    Verdict,
    attachment_block,
    best_overlap,
    first_line,
    looks_like_document,
    split_quote,
)
from ..window.tokens import estimate_tokens
from .parts import MAX_MESSAGE_SHARE
from .planner import CallPlanner


class Intake(CallPlanner):
    """A user's message on its way into the log."""

    def record_user(self, text: str, *, quote: bool = False, attached: Sequence[tuple[str, str]] = (),
                    own: bool = False, notices: list[str] | None = None, origin: str = "user",
                    created_at: str = "") -> Event:
        """Record one user message through its channel: attachments become snapshots and, with
        `--quote`, `--own` or a pasted document, the verbatim track gets its explicit verdict."""
        notices = notices if notices is not None else []
        content, verdict = self._channel(text, quote, list(attached), own, notices)
        if attached:
            self._check_size(content, "the message with its attachments")
        user = self.record("user", content, origin=origin, new_turn=True, created_at=created_at)
        if verdict is not None:
            self.verbatim.add(user.uid, verdict, message=user.content)
        return user

    def _channel(self, text: str, quote: bool, attached: list[tuple[str, str]], own: bool,
                 notices: list[str]) -> tuple[str, Verdict | None]:
        """The content to record and the explicit verdict of the user's chosen channel (if any).
        Checks come first: nothing is written when the channel cannot be used."""
        if quote and own:
            raise InputError("a message is either --quote or --own, not both")
        if quote and not split_quote(text)[0]:
            raise InputError("--quote: nothing to quote above the --- line; paste the AI output first")
        files = self.store.files
        if attached:
            budget = int(self.profile().effective * MAX_MESSAGE_SHARE) - estimate_tokens(text) - 200
            blocks, snaps = [], []
            for name, body in attached:
                snap = snapshots.write(files, body, name)
                snaps.append(snap.to_json())
                inline = body
                size = estimate_tokens(body)
                if size > budget:
                    inline = body[:max(0, int(len(body) * budget / size * 0.95))]
                    inline += (f"\n[truncated: {len(inline):,} of {len(body):,} chars are inline; the snapshot "
                               f"{snap.path} holds all of it]")
                    notices.append(f"{name} is larger than the window allows; the model sees its first "
                                   f"{len(inline):,} chars, the snapshot keeps all {len(body):,}")
                budget -= estimate_tokens(inline)
                blocks.append(attachment_block(snap.path, snap.chars, inline))
            content = "\n\n".join(([text] if text.strip() else []) + blocks)
            return content, Verdict(DOCUMENT, "explicit", text, None, 0.0, len(content), first_line(text or blocks[0]),
                                    tuple(snaps))
        if own:
            return text, Verdict(OWN, "explicit", text, None, 0.0, len(text), first_line(text))
        recent = replies_before(self._events, self.last_uid + 1, RECENT)
        if quote:
            pasted, note = split_quote(text)
            source = best_overlap(pasted, recent)
            kind = QUOTE_NOTE if note else QUOTE
            return text, Verdict(kind, "explicit", text if note else "", source, 0.0, len(text), first_line(pasted))
        if looks_like_document(text) and best_overlap(text, recent) is None:
            snap = snapshots.write(files, text, "paste")
            where = (f"{self.store.shown.rstrip('/')}/{snap.path}" if self.store.is_local
                     else f"{snap.path} in the store's files table")
            notices.append(f"your {len(text):,}-char paste looks like a document: it is saved as {where}; once it "
                           "leaves the recent tail the model keeps a pointer to it (use --own if these are your own words)")
            return text, Verdict(DOCUMENT, "explicit", "", None, 0.0, len(text), snap.first_line, (snap.to_json(),))
        return text, None

    def _check_size(self, text: str, what: str, hint: str = "") -> None:
        limit = int(self.profile().effective * MAX_MESSAGE_SHARE)
        size = estimate_tokens(text)
        if size > limit:
            raise InputError(f"{what} is about {size:,} tokens ({len(text):,} chars), more than half of the "
                             f"{self.profile().effective:,}-token usable window; shorten or split it{hint}")

    def _check_message(self, text: str | bytes) -> str:
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"the message is not UTF-8 text (bad byte at position {exc.start}); "
                                 "paste text, not binary data") from None
        if not isinstance(text, str):
            raise InputError(f"a message must be text, not {type(text).__name__}")
        if not text.strip():
            raise InputError("the message is empty: write something under %%chat")
        if "\x00" in text:
            raise InputError("the message contains NUL bytes, which looks like binary data; paste text instead")
        bad = [i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"]
        if bad:  # undecodable bytes smuggled in as lone surrogates: refused like the bytes themselves
            raise InputError(f"the message is not valid text ({len(bad)} undecodable character"
                             f"{'s' if len(bad) != 1 else ''}, the first at position {bad[0]}); "
                             "decode the source as UTF-8 (or with errors='replace') and paste it again")
        limit = int(self.profile().effective * MAX_MESSAGE_SHARE)
        if estimate_tokens(text) > limit:
            self._check_size(text, "the message", hint="; to send a long text whole, save it to a file and attach it "
                                                       "with %%chat --doc PATH (Session.chat(docs=[PATH]))")
        return text
