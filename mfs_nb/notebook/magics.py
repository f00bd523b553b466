"""The IPython boundary: `%%chat`, `%recall`, `%mfs` (docs/architecture.md, "What the user sees").

One error policy (docs/guide/errors.md, "One line, and Run All goes on"): every mistake a person can
make in an mfs cell — a bad option, an empty cell, a malformed range, a bad setting, a failed call —
prints one line `mfs: …` on stderr, leaves the session usable, and does not stop Run All. Settings are traitlets, so `%config MfsMagics.model = "…"` works, and each
value is validated before it is applied.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.display import display
from traitlets import Int, TraitError, Unicode, observe, validate
from traitlets.config import Configurable

from ..errors import InputError, MfsError
from ..recall.ranking import PAGE
from ..settings import Settings
from .commands import MfsCommands
from .display import Progress, Rich, Stream, has_frontend, show_preview

_TEMPLATE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_RANGE = re.compile(r"^\s*#?(\d+)\s*(?:(?:-|–|\.\.|\s)\s*#?(\d+))?\s*$")


def nearest_flag(word: str, flags: Sequence[str]) -> str:
    """'; did you mean --x?' for the flag nearest a mistyped `word`, or '; known: …' when none is near."""
    long = [f for f in flags if f.startswith("--")]
    near = difflib.get_close_matches(word, long, n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else "; known: " + ", ".join(long)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel
        unknown = [w for w in message.partition("unrecognized arguments:")[2].split() if w.startswith("-")]
        what = f"unknown option {unknown[0]}" if unknown else message
        raise InputError(f"{self.prog}: {what}{nearest_flag(unknown[0] if unknown else '', list(self._option_string_actions))}")


def _chat_parser() -> _Parser:
    p = _Parser(prog="%%chat", add_help=False)
    p.add_argument("--session", "-s")
    p.add_argument("--model", "-m")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--quote", action="store_true", help="the cell is pasted AI output; after a --- line, your note")
    p.add_argument("--doc", action="append", default=[], metavar="PATH", help="attach a file (repeatable)")
    p.add_argument("--own", action="store_true", help="your own words, even if long")
    return p


def substitute(text: str, namespace: dict[str, Any]) -> tuple[str, list[str]]:
    """Replace `{name}` by the notebook variable's value; `{{`/`}}` escape; unknown names stay."""
    unknown: list[str] = []

    def repl(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = m.group(1)
        if name in namespace and not name.startswith("_"):
            return str(namespace[name])
        unknown.append(name)
        return token

    return _TEMPLATE.sub(repl, text), unknown


def parse_uid_range(line: str) -> tuple[int, int | None]:
    """`102-140`, `102 140`, `#102`, `102` → (from, to)."""
    m = _RANGE.match(line or "")
    if not m:
        raise InputError(f"%recall: expected a uid or a range like 102-140, got {line.strip()!r}")
    return int(m.group(1)), int(m.group(2)) if m.group(2) else None


def _split(line: str, literal: bool = False) -> list[str]:
    """Shell-like words; `literal`: a backslash is a backslash (`C:\\data`, `\\d+` stay as typed)."""
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""  # as shlex.split: a # is a character, not a comment
    if literal:
        lex.escape = ""
    try:
        return list(lex)
    except ValueError as exc:  # an unclosed quote
        raise InputError(f"cannot read the options {line.strip()!r}: {exc}") from None


def _error(exc: BaseException) -> None:
    print(f"mfs: {exc}", file=sys.stderr)


@magics_class
class MfsMagics(MfsCommands, Magics, Configurable):
    """`%%chat`, `%recall` and `%mfs`: one long conversation across notebook cells."""

    model = Unicode("", help="litellm model name; empty: MFS_MODEL or the offline default").tag(config=True)
    store = Unicode("", help="LanceDB store path or URI; empty: MFS_STORE or ./.mfs").tag(config=True)
    window_tokens = Int(0, help="model window in tokens; 0: MFS_WINDOW or litellm's model map").tag(config=True)
    session = Unicode("default", help="the session %%chat talks to").tag(config=True)

    def __init__(self, shell: Any):
        Configurable.__init__(self, config=shell.config)
        Magics.__init__(self, shell=shell)
        shell.configurables.append(self)
        self._sessions: dict[str, Any] = {}
        self._store: Any = None
        self._read_only = False  # `%mfs open PATH --read-only`: the store is opened for reading only
        # the notebook's settings for every session it talks to (model, endpoint; keys stay in the
        # environment, named by the endpoint): set here, kept in the store, read again after a restart
        self._person: dict[str, Any] = {}
        self._origin: dict[str, str] = {}  # where each of them came from, for %mfs status
        self._notebook_read = False
        self.warmup: Any = None  # set by %load_ext: the background warm-up (mfs_nb.warm)
        self.cells: Any = None  # set by %load_ext: the cell log (mfs_nb.layers.cells)

    # -- traitlets: validate before anything is applied ----------------------------------
    @validate("model")
    def _valid_model(self, proposal: dict[str, Any]) -> str:
        value = proposal["value"].strip()
        if value:
            self._check(model=value)
            from ..models.llm import unknown_model

            if why := unknown_model(value, self._person.get("api_base", "")):
                raise TraitError(why)
        return value

    @validate("window_tokens")
    def _valid_window(self, proposal: dict[str, Any]) -> int:
        value = proposal["value"]
        if value:
            self._check(window_tokens=value)
        return value

    @validate("session")
    def _valid_session(self, proposal: dict[str, Any]) -> str:
        from ..session import valid_session_name

        if not valid_session_name(proposal["value"]):
            raise TraitError(f"session name {proposal['value']!r} is invalid: use letters, digits, '.', '_' or '-'")
        return proposal["value"]

    @staticmethod
    def _check(**values: Any) -> None:
        try:
            Settings().with_values(**values)
        except MfsError as exc:
            raise TraitError(str(exc)) from None

    @observe("model", "window_tokens")
    def _apply(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self._person[change["name"]] = change["new"]
            self._origin[change["name"]] = "this notebook (%config MfsMagics)"
            self._spread({change["name"]: change["new"]})

    # -- sessions ------------------------------------------------------------------------
    def _get_store(self) -> Any:
        if self._store is None:
            from ..store import Store

            self._store = Store(self.store or None, read_only=self._read_only)
        return self._store

    def get_session(self, name: str | None = None) -> Any:
        from ..session import Session

        if not self._notebook_read:
            self._wait_for("store")
            self._read_notebook()
        name = name or self.session
        if name not in self._sessions:
            self._wait_for("store")
            self._adopt(Session(name, store=self._get_store()))
        return self._sessions[name]

    def _wait_for(self, stage: str) -> None:
        """Wait for a warm-up stage still running, saying so in the cell."""
        from .warm import LABELS

        warm = self.warmup
        if warm is None or warm.ready(stage):
            return
        with Progress(self.shell, f"{LABELS[stage]} (first use in this kernel)…"):
            warm.wait(stage)

    # -- %%chat --------------------------------------------------------------------------
    @cell_magic
    def chat(self, line: str, cell: str) -> None:
        """Chat with the model; the whole conversation is remembered across cells.

        %%chat [--session NAME] [--model M] [--no-stream] [--quote] [--doc PATH …] [--own]
        {name} inserts a notebook variable's value ({{ and }} for literal braces).
        --quote: the cell is pasted AI output; text after a line of --- is your own note.
        --doc PATH: attach a file as a content-addressed snapshot (repeatable).
        --own: these are your own words, even if long (no automatic snapshot).
        """
        try:
            args = _chat_parser().parse_args(_split(line))
            if not cell.strip() and not args.doc:
                raise InputError("the %%chat cell is empty: write your message under the %%chat line")
            session = self.get_session(args.session)
            if args.model:
                session.configure(model=args.model, own=True)  # this session's own, over the notebook's
            from ..models.llm import is_offline

            if not is_offline(session.settings.model):
                self._wait_for("model client")
            text, unknown = substitute(cell, self.shell.user_ns if self.shell else {})
            if unknown:
                print(f"mfs: left as written (no such variable): {', '.join('{' + u + '}' for u in unknown)}",
                      file=sys.stderr)
            if self.cells is not None:
                session.record_cells(self.cells.take())  # the cells run since the last chat, as one event
            stream = Stream(self.shell)
            reply = session.chat(text, quote=args.quote, docs=args.doc, own=args.own, on_delta=stream.delta,
                                 on_reset=stream.reset, stream=not args.no_stream)
            stream.finish(reply.text)
            self._show_status(reply.usage, reply.notices, session)
        except MfsError as exc:
            _error(exc)

    def _show_status(self, usage: Any, notices: list[str], session: Any = None) -> None:
        from ..ui.data import status_data

        data = status_data(usage, notices)
        if has_frontend(self.shell):
            from ..ui.data import status_html

            pending = session.compactor.pending if session is not None else None
            text = "\n".join([data["line"], *data["notices"]])
            if pending is None or pending.done.is_set():
                display(Rich(text, status_html(data)))
                return
            # static HTML (readable after a reopen), replaced in place once the background work is done
            running = {**data, "notices": [*data["notices"], "organizing context…"]}
            handle = display(Rich(text + "\norganizing context…", status_html(running)), display_id=True)

            def finish() -> None:
                pending.done.wait()
                handle.update(Rich(text, status_html(data)))

            threading.Thread(target=finish, daemon=True, name="mfs-organizing").start()
        else:
            print(data["line"])
            for notice in notices:
                print(notice)

    # -- %compact ------------------------------------------------------------------------
    @line_magic
    def compact(self, line: str) -> None:
        """Compact the conversation now: %compact [focus instructions for the summary].
        %compact --preview [focus] shows what it would do (range, segment text, tokens, prefix-cache
        miss) and commits nothing; %compact --undo retracts the newest segment."""
        try:
            session = self.get_session()
            words = line.strip().split(None, 1)
            if words and words[0] == "--preview":
                with Progress(self.shell, "preparing a preview…"):
                    preview = session.compact_preview(words[1] if len(words) > 1 else "")
                show_preview(self.shell, preview)
                return
            if words == ["--undo"]:
                for notice in session.undo_compaction():
                    print(notice)
                print(session.usage().status_line())
                return
            if words and words[0].startswith("--"):
                hint = nearest_flag(words[0], ["--preview", "--undo"])
                raise InputError(f"%compact: unknown option {words[0]}{hint}; use %compact [focus], "
                                 "%compact --preview [focus] or %compact --undo")
            session.check_writable()  # before the progress line: a read-only store says so, and only that
            with Progress(self.shell, "organizing context…"):
                notices = session.compact(line.strip())
        except MfsError as exc:
            _error(exc)
            return
        for notice in notices:
            print(notice)
        print(session.usage().status_line())

    # -- %recall -------------------------------------------------------------------------
    @line_magic
    def recall(self, line: str) -> None:
        """Show the original messages of a uid range, verbatim: %recall 102-140 (or 102 140, or 102).
        Quoted text searches the session instead: %recall "pool size" [--k 10]."""
        if line.strip()[:1] in ("'", '"'):
            self._recall_search(line)
            return
        try:
            a, b = parse_uid_range(line)
            session = self.get_session()
            events = session.recall(a, b)
        except MfsError as exc:
            _error(exc)
            return
        from ..ui.data import recall_html, recall_text

        retried = session.retried()
        display(Rich(recall_text(events, retried), recall_html(events, retried)))

    def _recall_search(self, line: str) -> None:
        """%recall "free text" [--k K]: hybrid search of the session, shown as static output like
        every mfs output (one error policy: a malformed line prints one line and stops nothing)."""
        from ..ui.data import recall_data
        from ..ui.recall import RecallView, search_data

        try:
            try:
                words = shlex.split(line)
            except ValueError as exc:
                raise InputError(f"%recall: {exc}; quote the text like %recall \"pool size\"") from None
            k: Any = PAGE
            if len(words) == 3 and words[1] == "--k":
                k = words[2]
            elif len(words) != 1:
                raise InputError('%recall: quote the whole text, e.g. %recall "pool size" (optionally --k 5)')
            if not " ".join(words[0].split()):
                raise InputError('%recall: the search query is empty: say what to look for, e.g. %recall "pool size"')
            session = self.get_session()
            data = {**search_data(session.search(words[0], k)), "query": words[0]}
        except MfsError as exc:
            _error(exc)
            return
        view = RecallView(data=data, recall=lambda uid: recall_data(session.recall(uid), session.retried())["events"])
        display(Rich(view.text(), view.html()))  # static: readable in a reopened notebook

    # -- %context ------------------------------------------------------------------------
    @line_magic
    def context(self, line: str) -> None:
        """Show what the model is sent: the layers of the payload and the tool trajectory."""
        from ..ui.context import ContextView
        from ..ui.data import context_data, recall_data

        try:
            session = self.get_session(line.strip() or None)
            data = context_data(session)
        except MfsError as exc:
            _error(exc)
            return

        def recall(uid: Any) -> list[dict[str, Any]]:
            return recall_data(session.recall(uid), session.retried())["events"]

        view = ContextView(recall=recall, data=data)
        if has_frontend(self.shell):
            display(Rich(view.text(), view.html()))  # static: readable in a reopened notebook
        else:
            print(view.text())

    # -- %mfs ----------------------------------------------------------------------------
    @no_var_expand  # values are kept as typed: `{x}` and `$x` are not expanded (`%mfs pin` keeps them word for word)
    @line_magic
    def mfs(self, line: str) -> None:
        """Session management: %mfs status | sessions | new NAME | use NAME | fork NAME [focus] | fork NAME --store PATH | open PATH [--read-only] | config [--session] [key=value …] | pin [key=value …] | unpin KEY … | optimize | ledger | cost | export FILE.md|FILE.ipynb [--force] | gc [--dry-run] | doctor [--repair] | help"""
        try:
            words = _split(line, literal=line.split(None, 1)[:1] == ["pin"])
            command, rest = (words[0], words[1:]) if words else ("status", [])
            handler: Callable[[list[str]], None] | None = getattr(self, f"_mfs_{command}", None)
            if handler is None:
                raise InputError(f"%mfs: unknown command {command!r}; try status, sessions, new, use, fork, open, config, "
                                 "pin, unpin, optimize, ledger, cost, export, gc, doctor, help")
            handler(rest)
        except MfsError as exc:
            _error(exc)
