"""What follows the person rather than the conversation: the settings a notebook chose for every
session it talks to (model, endpoint, window, fallback; keys stay in the environment, named by the
endpoint) and the session `%%chat` talks to. Kept in the store under the notebook's name, read
again by the next kernel; a session keeps its own value only when told (`overrides`)."""

from __future__ import annotations

import os
from typing import Any

from ..settings import ENV_NAMES, PERSON_KEYS, from_environment


class NotebookChoices:
    """Mixed into `MfsMagics`: `_person` (the notebook's settings), `_origin` (where each came from)
    and the record in the store; it needs `session`, `config`, `_sessions` and `_get_store`."""

    _person: dict[str, Any]
    _origin: dict[str, str]
    _notebook_read: bool
    _sessions: dict[str, Any]
    _store: Any
    session: Any
    config: Any
    shell: Any

    def _get_store(self) -> Any:
        raise NotImplementedError

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
        """Make a session this notebook's: its settings, except those the session keeps as its own,
        and the tools that read the notebook (offered while `notebook_tools` is on); kept open here."""
        values = {k: v for k, v in self._person.items()
                  if k not in session.overrides and getattr(session.settings, k) != v}
        if values:
            session.configure(**values)
        from .kernel_tools import notebook_tools

        for tool in notebook_tools(self.shell):
            session.register_tool(tool)
        self._sessions[session.name] = session
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
        """Where the value of a setting in `session` comes from, in words. The notebook's settings (model,
        endpoint, window) follow the notebook's choice; the rest are the session's, saved over the environment."""
        if key in session.overrides:
            return "this session's own (%mfs config --session)"
        if key in self._person:
            return self._origin.get(key, "this notebook (%mfs config)")
        if key not in PERSON_KEYS and key in session._saved:
            return "saved with this session"
        env = from_environment()
        if key in env:
            return f"the environment ({ENV_NAMES[key]})"
        if key in session._saved:
            return "saved with this session"
        return "the default"
