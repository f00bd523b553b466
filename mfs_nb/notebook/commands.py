"""The `%mfs` subcommands: `%mfs NAME args…` calls `_mfs_NAME(args)` (see `MfsMagics.mfs`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from IPython.display import display

from ..errors import InputError
from ..settings import PERSON_KEYS
from .choices import NotebookChoices
from .display import Progress, Rich, has_frontend


class MfsCommands(NotebookChoices):
    """Mixed into `MfsMagics`: each `_mfs_<name>` method is one `%mfs <name>` subcommand; it needs
    the magics' sessions, store and the notebook's choices."""

    store: Any
    session: Any
    mfs: Any  # the %mfs magic itself (its docstring is the help)
    _sessions: dict[str, Any]
    _store: Any
    _read_only: bool
    _notebook_read: bool

    def get_session(self, name: str | None = None) -> Any:
        raise NotImplementedError

    def _mfs_help(self, rest: list[str]) -> None:
        print(self.mfs.__doc__)

    def _mfs_status(self, rest: list[str]) -> None:
        from ..window.usage import SOURCE_LABELS

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
        from ..models.cost import budget_line

        print(budget_line(s.settings.model, s.settings, u.effective, priced="litellm" in sys.modules))
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
        from ..recall.indexer import backlog

        p = s.indexer.progress(load=False)
        meaning = (f"by meaning to uid {p['vectors_upto']} ({p['model']})" + backlog(p) if p["model"] else
                   f"by meaning: unavailable ({p['failed']})" if p["failed"] else
                   "by meaning: starts when the first search loads the embedding model")
        print(f"search index: {p['last_uid']} messages; by words to uid {p['text_upto']}, {meaning}"
              + ("" if s.settings.recall_index else " (indexing as messages arrive is off)"))

    def _mfs_doctor(self, rest: list[str]) -> None:
        """%mfs doctor [--repair]: check the store (tables, content hashes, missing uids)."""
        from ..store.doctor import doctor

        if bad := [w for w in rest if w != "--repair"]:
            raise InputError(f"%mfs doctor takes only --repair, not {bad[0]}; use %mfs doctor or %mfs doctor --repair")
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
        from ..session import valid_session_name

        if len(rest) != 1:
            raise InputError("%mfs new NAME: give exactly one session name")
        if not valid_session_name(rest[0]):
            raise InputError(f"%mfs new: session name {rest[0]!r} is invalid: use letters, digits, '.', '_' or '-'")
        if self._get_store().read_only:
            raise InputError(f"%mfs new: {self._get_store().read_only_line()}")
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
            shown = {f"{key} = {value!r}": self.origin(key, s) for key, value in s.settings.public().items()}
            width = max(map(len, shown))
            for line, where in shown.items():  # every value with where it comes from
                print(f"{line:<{width}}  ({where})")
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
        """%mfs fork NAME [focus …]: a new session starting from a summary of this one; %%chat moves to it.
        %mfs fork NAME --store PATH: this session copied word for word into another (writable) store."""
        if "--store" in rest:
            self._fork_into(rest)
            return
        if not rest:
            raise InputError("%mfs fork NAME [focus]: name the new session")
        parent = self.get_session()
        parent.check_writable()
        with Progress(self.shell, f"summarising {parent.name} for the fork…"):
            child = parent.fork(rest[0], " ".join(rest[1:]))
        self._adopt(child)
        self._switch(child.name)
        p = child.parent or {}
        print(f"forked {parent.name} into {child.name}: uids {p.get('uid_from')}–{p.get('uid_to')} summarised in "
              f"segment #{p.get('segment')}; {child.usage().status_line()}")
        for notice in getattr(child, "fork_notices", []):
            print(notice)
        print(f"%%chat now talks to {child.name}; {parent.name} is unchanged (%mfs use {parent.name} to go back)")

    def _fork_into(self, rest: list[str]) -> None:
        """%mfs fork NAME --store PATH: copy this session (log, segments, ledger, state) into the store at
        PATH under NAME, same uids; the notebook then talks to it there."""
        at = rest.index("--store")
        if at + 1 >= len(rest) or rest[at + 1].startswith("--"):
            raise InputError("%mfs fork NAME --store PATH: name the writable store to copy the session into")
        where, words = rest[at + 1], rest[:at] + rest[at + 2:]
        if len(words) != 1:
            raise InputError("%mfs fork NAME --store PATH: give one session name (the copy is word for word: "
                             "no focus)")
        parent = self.get_session()
        source = parent.store.shown
        with Progress(self.shell, f"copying {parent.name} into {where}…"):
            child = parent.copy_to(where, words[0])
        self._use_store(child.store)
        self._adopt(child)
        self._switch(child.name)
        done = child.copied or {}
        a, b = done.get("uids", [0, 0])
        segments = len(child.compactor.segments)
        print(f"copied {parent.name} into session {child.name} of {child.store.shown}: {done.get('events', 0)} "
              f"messages as uids {a}–{b}, word for word" + (f", {segments} segments" if segments else "")
              + (f", {done['snapshots']} attachments" if done.get("snapshots") else ""))
        print(f"%%chat now talks to {child.name} there; the store at {source} is unchanged "
              f"(%mfs open {source} --read-only reads it again)")

    def _mfs_open(self, rest: list[str]) -> None:
        """%mfs open PATH [--read-only]: this notebook's sessions from another store (a folder or a URI);
        --read-only opens it for reading only (a store this process may not write is opened so anyway)."""
        from ..store import Store

        read_only = "--read-only" in rest
        words = [w for w in rest if w != "--read-only"]
        if bad := [w for w in words if w.startswith("--")]:
            raise InputError(f"%mfs open: unknown option {bad[0]}; the one it takes is --read-only")
        if len(words) != 1:
            raise InputError("%mfs open PATH [--read-only]: name one store (a folder or a URI)")
        where = Path(words[0]).expanduser()
        if "://" not in words[0] and not (where / "events.lance").is_dir():
            said = "nothing is there" if not where.exists() else "it is not an mfs_nb store (no events table)"
            raise InputError(f"%mfs open: there is no store at {where} ({said}); %mfs open reads a store that exists "
                             "(a new one is made by the first %%chat after %config MfsMagics.store or MFS_STORE names it)")
        store = Store(words[0], read_only=read_only)
        names = store.sessions()
        self._use_store(store)
        picked = ""
        if store.read_only and names and self.session not in names:
            recent = store.session_times()
            self.session = max(names, key=lambda n: recent.get(n, ""))
            picked = f"; %%chat reads {self.session} (the most recent; %mfs use NAME for another)"
        listed = ", ".join(names[:12]) + (" …" if len(names) > 12 else "")
        how = ("opened read-only (reading works; %%chat, pin and %compact are refused: %mfs fork NAME --store PATH "
               "goes on in a writable store)") if store.read_only else "opened"
        print(f"store {store.shown} {how}: {len(names)} session{'s' if len(names) != 1 else ''}"
              + (f" ({listed})" if names else "") + (picked or f"; %%chat talks to {self.session}"))

    def _use_store(self, store: Any) -> None:
        """From now on this notebook's sessions come from `store`; the sessions open so far are closed."""
        for session in self._sessions.values():
            try:
                session.close(wait_s=5)
            except Exception:  # a session of a store gone away: closing it is a courtesy
                pass
        self._sessions = {}
        self._store = store
        self._read_only = store.asked_read_only
        self.store = store.uri
        self._notebook_read = True  # this store's record of an earlier choice does not override this one

    def _mfs_optimize(self, rest: list[str]) -> None:
        """%mfs optimize: compact the store's small fragments and remove its old versions."""
        if rest:
            raise InputError("%mfs optimize takes no arguments")
        session = self.get_session()
        session.check_writable()  # before the progress line: a read-only store says so, and only that
        with Progress(self.shell, "optimizing the store…"):
            notices = session.optimize()
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
        from ..layers import snapshots

        if rest not in ([], ["--dry-run"]):
            raise InputError(f"%mfs gc: unexpected {' '.join(rest)!r}; use %mfs gc or %mfs gc --dry-run")
        dry = rest == ["--dry-run"]
        if not dry and self._get_store().read_only:
            raise InputError(f"%mfs gc: {self._get_store().read_only_line()}")
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

    def _mfs_cost(self, rest: list[str]) -> None:
        from ..models.cost import budget_line, describe

        session = self.get_session()
        print(f"session {session.name!r}, priced with litellm's cost map\n" + describe(session.cost()))
        print(budget_line(session.settings.model, session.settings, session.usage().effective))

    def _mfs_ledger(self, rest: list[str]) -> None:
        from ..ui.data import ledger_data
        from ..ui.ledger import LedgerView

        session = self.get_session()
        view = LedgerView(data=ledger_data(session.ledger(), session.history, session.usage().effective))
        if has_frontend(self.shell):
            display(Rich(view.text(), view.html()))
        else:
            from ..ui.html import ledger_summary

            print(ledger_summary(view.data))
            print(view.text())
