"""The IPython boundary: `%%chat`, `%recall`, `%mfs` (DESIGN §1).

One error policy (README, "Mistakes and errors"): every mistake a person can make in an mfs cell —
a bad option, an empty cell, a malformed range, a bad setting, a failed call — prints one line
`mfs: …` on stderr, leaves the session usable, and does not stop Run All. Settings are traitlets, so `%config MfsMagics.model = "…"` works, and each
value is validated before it is applied.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.display import Markdown, display
from traitlets import Int, TraitError, Unicode, observe, validate
from traitlets.config import Configurable

from .errors import InputError, MfsError
from .settings import ENV_NAMES, PERSON_KEYS, Settings, from_environment

_TEMPLATE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_RANGE = re.compile(r"^\s*#?(\d+)\s*(?:(?:-|–|\.\.|\s)\s*#?(\d+))?\s*$")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel
        raise InputError(f"{self.prog}: {message}")


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
class MfsMagics(Magics, Configurable):
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
        # the notebook's settings for every session it talks to (model, endpoint; keys stay in the
        # environment, named by the endpoint): set here, kept in the store, read again after a restart
        self._person: dict[str, Any] = {}
        self._origin: dict[str, str] = {}  # where each of them came from, for %mfs status
        self._notebook_read = False
        self.warmup: Any = None  # set by %load_ext: the background warm-up (mfs_nb.warm)
        self.cells: Any = None  # set by %load_ext: the cell log (mfs_nb.cells)

    # -- traitlets: validate before anything is applied ----------------------------------
    @validate("model")
    def _valid_model(self, proposal: dict[str, Any]) -> str:
        value = proposal["value"].strip()
        if value:
            self._check(model=value)
        return value

    @validate("window_tokens")
    def _valid_window(self, proposal: dict[str, Any]) -> int:
        value = proposal["value"]
        if value:
            self._check(window_tokens=value)
        return value

    @validate("session")
    def _valid_session(self, proposal: dict[str, Any]) -> str:
        from .session import _NAME

        if not _NAME.match(proposal["value"]):
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

    # -- what follows the person: the notebook's settings and its current session ------------
    @property
    def _notebook_key(self) -> str:
        """The notebook this kernel runs (Jupyter names it in the kernel's environment); '' elsewhere."""
        return os.environ.get("JPY_SESSION_NAME", "")

    def _read_notebook(self) -> None:
        """Once per kernel, on first use of the store: the session and settings this notebook chose in
        an earlier kernel, where this kernel has not chosen (the environment and %config win)."""
        if self._notebook_read:
            return
        self._notebook_read = True
        try:
            record = self._get_store().load_notebook(self._notebook_key)
        except Exception:  # an unreadable record costs the convenience, nothing else
            return
        env = from_environment()
        for key, value in (record.get("settings") or {}).items():
            if key in PERSON_KEYS and key not in self._person and key not in env and value:
                self._person[key] = value
                self._origin[key] = "this notebook (set in an earlier kernel)"
        name = record.get("session")
        if (name and "session" not in self.config.get("MfsMagics", {}) and self.session == "default"
                and name in self._get_store().sessions()):
            self.session = name

    def _save_notebook(self) -> None:
        try:
            self._get_store().save_notebook(self._notebook_key, {"session": self.session, "settings": self._person})
        except Exception:  # a read-only store: the choice holds for this kernel only
            pass

    def _adopt(self, session: Any) -> Any:
        """Give a session the notebook's settings, except those it keeps as its own."""
        values = {k: v for k, v in self._person.items()
                  if k not in session.overrides and getattr(session.settings, k) != v}
        if values:
            session.configure(**values)
        return session

    def _spread(self, values: dict[str, Any]) -> None:
        """Notebook settings changed: every open session that does not keep its own takes them."""
        for session in self._sessions.values():
            mine = {k: v for k, v in values.items() if k not in session.overrides}
            if mine:
                session.configure(**mine)
        if self._store is not None:
            self._save_notebook()

    def origin(self, key: str, session: Any) -> str:
        """Where the value of a notebook setting in `session` comes from, in words."""
        if key in session.overrides:
            return "this session's own (%mfs config --session)"
        if key in self._person:
            return self._origin.get(key, "this notebook (%mfs config)")
        env = from_environment()
        if key in env:
            return f"the environment ({ENV_NAMES[key]})"
        if key in session._saved:
            return "saved with this session"
        return "the default"

    # -- sessions ------------------------------------------------------------------------
    def _get_store(self) -> Any:
        if self._store is None:
            from .store import Store

            self._store = Store(self.store or None)
        return self._store

    def get_session(self, name: str | None = None) -> Any:
        from .session import Session

        if not self._notebook_read:
            self._wait_for("store")
            self._read_notebook()
        name = name or self.session
        if name not in self._sessions:
            self._wait_for("store")
            session = self._adopt(Session(name, store=self._get_store()))
            if session.settings.notebook_tools:
                from .notebook_tools import notebook_tools

                for tool in notebook_tools(self.shell):
                    session.register_tool(tool)
            self._sessions[name] = session
        return self._sessions[name]

    def _wait_for(self, stage: str) -> None:
        """Wait for a warm-up stage still running, saying so in the cell."""
        from .warm import LABELS

        warm = self.warmup
        if warm is None or warm.ready(stage):
            return
        with _Progress(self.shell, f"{LABELS[stage]} (first use in this kernel)…"):
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
            from .llm import is_offline

            if not is_offline(session.settings.model):
                self._wait_for("model client")
            text, unknown = substitute(cell, self.shell.user_ns if self.shell else {})
            if unknown:
                print(f"mfs: left as written (no such variable): {', '.join('{' + u + '}' for u in unknown)}",
                      file=sys.stderr)
            if self.cells is not None:
                session.record_cells(self.cells.take())  # the cells run since the last chat, as one event
            stream = _Stream(self.shell)
            reply = session.chat(text, quote=args.quote, docs=args.doc, own=args.own, on_delta=stream.delta,
                                 on_reset=stream.reset, stream=not args.no_stream)
            stream.finish(reply.text)
            self._show_status(reply.usage, reply.notices, session)
        except MfsError as exc:
            _error(exc)

    def _show_status(self, usage: Any, notices: list[str], session: Any = None) -> None:
        from .ui.data import status_data

        data = status_data(usage, notices)
        if _has_frontend(self.shell):
            from .ui.data import status_html

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
                with _Progress(self.shell, "preparing a preview…"):
                    preview = session.compact_preview(words[1] if len(words) > 1 else "")
                _show_preview(self.shell, preview)
                return
            if words == ["--undo"]:
                for notice in session.undo_compaction():
                    print(notice)
                print(session.usage().status_line())
                return
            if words and words[0].startswith("--"):
                raise InputError(f"%compact: unknown option {words[0]}; use %compact [focus], "
                                 "%compact --preview [focus] or %compact --undo")
            with _Progress(self.shell, "organizing context…"):
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
            events = self.get_session().recall(a, b)
        except MfsError as exc:
            _error(exc)
            return
        from .ui.data import recall_html, recall_text

        display(Rich(recall_text(events), recall_html(events)))

    def _recall_search(self, line: str) -> None:
        """%recall "free text" [--k K]: hybrid search of the session, shown as static output like
        every mfs output (one error policy: a malformed line prints one line and stops nothing)."""
        from .ui.data import recall_data
        from .ui.recall import RecallView, search_data

        try:
            try:
                words = shlex.split(line)
            except ValueError as exc:
                raise InputError(f"%recall: {exc}; quote the text like %recall \"pool size\"") from None
            k: Any = 10
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
        view = RecallView(data=data, recall=lambda uid: recall_data(session.recall(uid))["events"])
        display(Rich(view.text(), view.html()))  # static: readable in a reopened notebook

    # -- %context ------------------------------------------------------------------------
    @line_magic
    def context(self, line: str) -> None:
        """Show what the model is sent: the layers of the payload and the tool trajectory."""
        from .ui.context import ContextView
        from .ui.data import context_data, recall_data

        try:
            session = self.get_session(line.strip() or None)
            data = context_data(session)
        except MfsError as exc:
            _error(exc)
            return

        def recall(uid: Any) -> list[dict[str, Any]]:
            return recall_data(session.recall(uid))["events"]

        view = ContextView(recall=recall, data=data)
        if _has_frontend(self.shell):
            display(Rich(view.text(), view.html()))  # static: readable in a reopened notebook
        else:
            print(view.text())

    # -- %mfs ----------------------------------------------------------------------------
    @no_var_expand  # values are kept as typed: `{x}` and `$x` are not expanded (`%mfs pin` keeps them word for word)
    @line_magic
    def mfs(self, line: str) -> None:
        """Session management: %mfs status | sessions | new NAME | use NAME | fork NAME [focus] | config [key=value …] | pin [key=value …] | unpin KEY … | optimize | ledger | export FILE.md|FILE.ipynb [--force] | gc [--dry-run] | doctor [--repair] | help"""
        try:
            words = _split(line, literal=line.split(None, 1)[:1] == ["pin"])
            command, rest = (words[0], words[1:]) if words else ("status", [])
            handler: Callable[[list[str]], None] | None = getattr(self, f"_mfs_{command}", None)
            if handler is None:
                raise InputError(f"%mfs: unknown command {command!r}; try status, sessions, new, use, fork, config, "
                                 "pin, unpin, optimize, ledger, export, gc, doctor, help")
            handler(rest)
        except MfsError as exc:
            _error(exc)

    def _mfs_help(self, rest: list[str]) -> None:
        print(self.mfs.__doc__)

    def _mfs_status(self, rest: list[str]) -> None:
        from .usage import SOURCE_LABELS

        s = self.get_session()
        st = s.status()
        u = s.usage()
        print(u.status_line())
        print(f"store {st['store']} · model {st['model']} · {st['events']} events, last uid {st['last_uid']}, "
              f"{st['turns']} turns · measured as {SOURCE_LABELS.get(u.source, u.source)}")
        print(st["endpoint"])
        print("settings: " + "; ".join(
            f"{k} {getattr(s.settings, k)!r} from {self.origin(k, s)}" for k in PERSON_KEYS
            if getattr(s.settings, k) or k == "model"))
        comp = s.compactor
        if comp.segments or comp.evicted:
            spans = ", ".join(f"#{x.id} {x.uid_from}–{x.uid_to}" + (" degraded" if x.degraded else "") for x in comp.segments)
            print(f"segments in payload: {spans or 'none'}" + (f"; evicted maps: uids {comp.evicted[0][0]}–"
                                                                f"{comp.evicted[-1][1]}" if comp.evicted else ""))
        state = s.clearing_state()
        if state.clear_before:
            print(f"tool results before uid {state.clear_before} cleared"
                  + (f"; long arguments before uid {state.prune_before} stubbed" if state.prune_before else ""))
        if comp.breaker_open:
            print(comp.breaker_line())
        p = s.indexer.progress(load=False)
        meaning = (f"by meaning to uid {p['vectors_upto']} ({p['model']})" if p["model"] else
                   f"by meaning: unavailable ({p['failed']})" if p["failed"] else
                   "by meaning: starts when the first search loads the embedding model")
        print(f"search index: {p['last_uid']} messages; by words to uid {p['text_upto']}, {meaning}"
              + ("" if s.settings.recall_index else " (indexing as messages arrive is off)"))

    def _mfs_doctor(self, rest: list[str]) -> None:
        """%mfs doctor [--repair]: check the store (tables, content hashes, missing uids)."""
        from .doctor import doctor

        if any(w != "--repair" for w in rest):
            raise InputError("%mfs doctor takes only --repair")
        store = self._store.uri if self._store is not None else (self.store or None)
        lines, _ = doctor(store, "--repair" in rest)
        print("\n".join(lines))

    def _mfs_sessions(self, rest: list[str]) -> None:
        names = self._get_store().sessions()
        for name in names or ["(none yet)"]:
            print(("* " if name == self.session else "  ") + name)

    def _switch(self, name: str) -> None:
        self.session = name
        self._save_notebook()

    def _mfs_new(self, rest: list[str]) -> None:
        from .session import _NAME

        if len(rest) != 1:
            raise InputError("%mfs new NAME: give exactly one session name")
        if not _NAME.match(rest[0]):
            raise InputError(f"%mfs new: session name {rest[0]!r} is invalid: use letters, digits, '.', '_' or '-'")
        if rest[0] in self._get_store().sessions() or rest[0] in self._sessions:
            raise InputError(f"%mfs new: session {rest[0]!r} exists already; switch to it with %mfs use {rest[0]}")
        s = self.get_session(rest[0])
        self._switch(rest[0])
        print(f"session {s.name} created (model {s.settings.model}); %%chat now talks to it")

    def _mfs_use(self, rest: list[str]) -> None:
        import difflib

        if len(rest) != 1:
            raise InputError("%mfs use NAME: give exactly one session name")
        names = sorted(set(self._get_store().sessions()) | set(self._sessions))
        if rest[0] not in names:
            close = difflib.get_close_matches(rest[0], names, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise InputError(f"%mfs use: there is no session {rest[0]!r}; {hint}%mfs sessions lists them, "
                             f"%mfs new {rest[0]} creates it")
        s = self.get_session(rest[0])
        self._switch(rest[0])
        print(f"session {s.name}: {len(s.events)} events, last uid {s.last_uid}, model {s.settings.model}")

    def _mfs_config(self, rest: list[str]) -> None:
        """%mfs config [--session] [key=value …]: model, api_base, window_tokens and the fallback are the
        notebook's, for every session; --session keeps a value for this session alone."""
        s = self.get_session()
        own = "--session" in rest
        rest = [w for w in rest if w != "--session"]
        if not rest:
            for key, value in s.settings.public().items():
                where = f"  ({self.origin(key, s)})" if key in PERSON_KEYS else ""
                print(f"{key} = {value!r}{where}")
            return
        values = {}
        for word in rest:
            if "=" not in word:
                raise InputError(f"%mfs config: expected key=value, got {word!r}")
            key, value = word.split("=", 1)
            values[key.strip()] = value
        new = s.configure(own=own, **values)  # validated here first: a bad value changes nothing anywhere
        shared = {k: getattr(new, k) for k in values if k in PERSON_KEYS and not own}
        if shared:
            self._person.update(shared)
            for key in shared:
                self._origin[key] = "this notebook (%mfs config)"
            self._spread(shared)
        print("; ".join(f"{k} = {getattr(new, k)!r}" for k in values)
              + (" (this session only)" if own else " (every session of this notebook)" if shared else ""))

    def _mfs_fork(self, rest: list[str]) -> None:
        """%mfs fork NAME [focus …]: a new session starting from a summary of this one; %%chat moves to it."""
        if not rest:
            raise InputError("%mfs fork NAME [focus]: name the new session")
        parent = self.get_session()
        with _Progress(self.shell, f"summarising {parent.name} for the fork…"):
            child = parent.fork(rest[0], " ".join(rest[1:]))
        self._sessions[child.name] = self._adopt(child)
        if child.settings.notebook_tools:
            from .notebook_tools import notebook_tools

            for tool in notebook_tools(self.shell):
                child.register_tool(tool)
        self._switch(child.name)
        p = child.parent or {}
        print(f"forked {parent.name} into {child.name}: uids {p.get('uid_from')}–{p.get('uid_to')} summarised in "
              f"segment #{p.get('segment')}; {child.usage().status_line()}")
        for notice in getattr(child, "fork_notices", []):
            print(notice)
        print(f"%%chat now talks to {child.name}; {parent.name} is unchanged (%mfs use {parent.name} to go back)")

    def _mfs_optimize(self, rest: list[str]) -> None:
        """%mfs optimize: compact the store's small fragments and remove its old versions."""
        if rest:
            raise InputError("%mfs optimize takes no arguments")
        with _Progress(self.shell, "optimizing the store…"):
            notices = self.get_session().optimize()
        for notice in notices:
            print(notice)

    def _mfs_pin(self, rest: list[str]) -> None:
        """%mfs pin key=value …: keep values word for word in the knowledge slot; no argument lists it."""
        s = self.get_session()
        if not rest:
            entries = s.knowledge.entries
            if not entries:
                print("the knowledge slot is empty; %mfs pin key=value adds to it")
            for e in entries.values():
                print(f"{e.key} = {e.value!r}" + ("" if e.by == "user" else "  (remembered by the model)"))
            return
        values: dict[str, str] = {}
        for word in rest:
            if "=" not in word:
                raise InputError(f"%mfs pin: expected key=value, got {word!r} (quote values with spaces)")
            key, value = word.split("=", 1)
            values[key.strip()] = value
        for notice in s.pin(values):
            print(notice)

    def _mfs_unpin(self, rest: list[str]) -> None:
        """%mfs unpin KEY …: remove keys from the knowledge slot."""
        if not rest:
            raise InputError("%mfs unpin KEY …: name the keys to remove")
        for notice in self.get_session().unpin(*rest):
            print(notice)

    def _mfs_gc(self, rest: list[str]) -> None:
        """Remove snapshots nothing references any more (after a 48 h grace); --dry-run only lists them."""
        from . import snapshots

        if rest not in ([], ["--dry-run"]):
            raise InputError("%mfs gc [--dry-run]")
        dry = rest == ["--dry-run"]
        live = [e.content for s in self._sessions.values() for e in s.events if snapshots.DIR in e.content]
        gone = snapshots.garbage(self._get_store(), live, ["."], dry_run=dry)
        verb = "would remove" if dry else "removed"
        if not gone:
            print("no unreferenced snapshots older than 48 h")
        for path, size in gone:
            print(f"{verb} {path} ({size:,} bytes)")

    def _mfs_export(self, rest: list[str]) -> None:
        """%mfs export FILE.md|FILE.ipynb [--force]: the whole session, readable without mfs_nb."""
        force = "--force" in rest
        names = [w for w in rest if w != "--force"]
        if len(names) != 1:
            raise InputError("%mfs export FILE.md|FILE.ipynb [--force]")
        session = self.get_session()
        path = session.export(names[0], overwrite=force)
        print(f"exported session {session.name!r} ({session.last_uid} events) to {path}")

    def _mfs_ledger(self, rest: list[str]) -> None:
        from .ui.data import ledger_data
        from .ui.ledger import LedgerView

        session = self.get_session()
        view = LedgerView(data=ledger_data(session.ledger(), session.history, session.usage().effective))
        if _has_frontend(self.shell):
            display(Rich(view.text(), view.html()))
        else:
            from .ui.html import ledger_summary

            print(ledger_summary(view.data))
            print(view.text())


def preview_lines(p: dict[str, Any]) -> list[str]:
    """The preview as lines of text: the verdict, the numbers, then the segment's text."""
    if "nothing" in p:
        return [f"preview: nothing to compact ({p['nothing']}); nothing committed"]
    lines = [f"preview, nothing committed: uids {p['uid_from']}–{p['uid_to']} ({p['messages']} messages) would become "
             f"one segment of {p['segment_tokens']:,} tokens"
             + (f" (degraded: {p['error']})" if p["degraded"] else "")]
    if not p["would_commit"]:
        lines.append(f"%compact would not commit it: the payload would go from {p['tokens_before']:,} to "
                     f"{p['tokens_after']:,} tokens (nothing worth compacting yet)")
    lines.append(f"payload {p['tokens_before']:,} → {p['tokens_after']:,} tokens; the next call would read "
                 f"{p['cache_miss_tokens']:,} tokens again (prefix-cache miss); the summary cost "
                 f"{p['llm_tokens']:,} LLM tokens")
    return lines


def _show_preview(shell: Any, p: dict[str, Any]) -> None:
    lines = preview_lines(p)
    text = "\n".join(lines + ([p["segment_text"]] if "segment_text" in p else []))
    if not _has_frontend(shell):
        print(text)
        return
    from .ui.html import PANEL, PRE, _e

    body = "".join(f"<div>{_e(line)}</div>" for line in lines)
    if "segment_text" in p:
        body += (f"<details open><summary>the segment it would commit</summary><pre style='{PRE}'>"
                 f"{_e(p['segment_text'])}</pre></details>")
    display(Rich(text, f"<div class='mfs-preview' style='{PANEL}'>{body}</div>"))


class _Progress:
    """A line saying what a cell is waiting for (model client, store, compaction), shown while it
    waits and then cleared; in a terminal, one line on stderr."""

    def __init__(self, shell: Any, text: str):
        self.rich = _has_frontend(shell)
        self.text = text
        self.handle: Any = None

    def __enter__(self) -> _Progress:
        if self.rich:
            self.handle = display(Rich(self.text, f"<div style='font:12px monospace;color:#777'>"
                                                  f"<i>{html.escape(self.text)}</i></div>"), display_id=True)
        else:
            print(f"mfs: {self.text}", file=sys.stderr)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.handle.update(Rich("", ""))


class Rich:
    """Output with a plain-text and an HTML form; each front end picks the one it can show."""

    def __init__(self, text: str, html: str):
        self.text, self.html = text, html

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": self.html}

    def __repr__(self) -> str:
        return self.text


def _has_frontend(shell: Any) -> bool:
    """True inside a kernel whose front end can show rich output (not a plain terminal)."""
    return getattr(shell, "kernel", None) is not None


class _Stream:
    """Streams deltas into the cell: a Markdown display updated in place, or plain prints."""

    def __init__(self, shell: Any, every_s: float = 0.1):
        self.rich = _has_frontend(shell)
        self.parts: list[str] = []
        self.handle: Any = None
        self.every_s = every_s
        self.last = 0.0

    def delta(self, text: str) -> None:
        self.parts.append(text)
        if not self.rich:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._show()

    def reset(self) -> None:
        """The endpoint switched mid-stream: start the reply over."""
        self.parts.clear()
        if not self.rich:
            sys.stdout.write("\n[switching endpoint; reply restarts]\n")
        else:
            self._show()

    def _show(self) -> None:
        body = Markdown("".join(self.parts))
        if self.handle is None:
            self.handle = display(body, display_id=True)
        else:
            self.handle.update(body)

    def finish(self, text: str) -> None:
        if not self.rich:
            if not self.parts:
                sys.stdout.write(text)
            sys.stdout.write("\n")
            return
        self.parts = [text]
        self._show()

