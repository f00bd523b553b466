"""The small tables: a session's saved state, notebooks, protocol rows, leases, ledger, calls, verdicts."""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa

from ..errors import StoreError
from ..events import now_iso
from .connection import store_problem, table_names
from .core import StoreCore
from .schemas import (
    CALLS_SCHEMA,
    COMPACTIONS_SCHEMA,
    LEASES_SCHEMA,
    LEDGER_SCHEMA,
    NOTEBOOKS_SCHEMA,
    SESSIONS_SCHEMA,
    VERBATIM_SCHEMA,
    quote,
)


class StateTables(StoreCore):
    # -- sessions: settings and anchor (state, not log) -----------------------------------
    def load_meta(self, session: str) -> dict[str, Any]:
        if not self._sessions.count_rows():
            return {}
        rows = self._sessions.search().where(f"session = {quote(session)}").limit(None).to_list()
        if not rows:
            return {}
        row = rows[0]
        return {
            "settings": json.loads(row["settings"] or "{}"),
            "anchor": json.loads(row["anchor"] or "null"),
            "created_at": row["created_at"],
        }

    def session_marks(self) -> dict[str, tuple[int, int]]:
        """Each session with events: its last uid and its number of events (one read of two columns of the
        log), for a watcher that says when a session changed."""
        if not self._events.count_rows():
            return {}
        rows = self._events.search().select(["session", "uid"]).limit(None).to_arrow()
        table = rows.group_by("session").aggregate([("uid", "max"), ("uid", "count")])
        return {n: (int(m), int(c)) for n, m, c in zip(*(table.column(k).to_pylist()
                                                         for k in ("session", "uid_max", "uid_count")))}

    def events_version(self) -> int:
        """The log's table version: it changes with every write, by any process."""
        return int(self._events.version)

    def session_times(self) -> dict[str, str]:
        """Each session with a state row, and when that row was last written (ISO time)."""
        if not self._sessions.count_rows():
            return {}
        table = self._sessions.to_arrow().select(["session", "updated_at"]).to_pylist()
        return {r["session"]: r["updated_at"] or "" for r in table}

    def save_meta(self, session: str, *, settings: dict[str, Any], anchor: Any) -> None:
        """Write the session's settings and anchor (secrets must already be removed)."""
        created = self._created.get(session)
        if created is None:  # read once per session: a turn's save does not read the table
            created = self._created[session] = self.load_meta(session).get("created_at") or now_iso()
        row = {
            "session": session,
            "settings": json.dumps(settings, sort_keys=True),
            "anchor": json.dumps(anchor, sort_keys=True),
            "created_at": created,
            "updated_at": now_iso(),
        }
        with self._lock, self._writing("sessions"):
            (
                self._sessions.merge_insert("session")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist([row], schema=SESSIONS_SCHEMA))
            )
            self._fold(self._sessions, "sessions")

    # -- notebooks: what follows the person across sessions and kernel restarts ------------
    def load_notebook(self, key: str) -> dict[str, Any]:
        """A notebook's record: the session `%%chat` talks to and the settings every session of that
        notebook uses (model, endpoint), as `save_notebook` wrote them; {} when there is none."""
        try:
            table = self._db.open_table("notebooks")
        except (FileNotFoundError, ValueError):
            return {}
        rows = table.search().where(f"notebook = {quote(key)}").limit(None).to_list()
        return json.loads(rows[0]["data"] or "{}") if rows else {}

    def save_notebook(self, key: str, data: dict[str, Any]) -> None:
        """Replace a notebook's record (secrets must already be removed: it holds names, not keys)."""
        row = {"notebook": key, "data": json.dumps(data, sort_keys=True), "updated_at": now_iso()}
        with self._lock, self._writing("notebooks"):
            table = self._table("notebooks", NOTEBOOKS_SCHEMA)
            table.merge_insert("notebook").when_matched_update_all().when_not_matched_insert_all().execute(
                pa.Table.from_pylist([row], schema=NOTEBOOKS_SCHEMA))
            self._fold(table, "notebooks")

    # -- compactions: the protocol (docs/architecture.md, "The compaction protocol"), append only --
    def append_compaction(self, session: str, seq: int, phase: str, data: dict[str, Any]) -> None:
        """One protocol step (started | summary_completed | declared | finished | aborted)."""
        row = {"key": f"{session}\x1f{seq:08d}\x1f{phase}", "session": session, "seq": seq, "phase": phase,
               "time": now_iso(), "data": json.dumps(data, sort_keys=True, ensure_ascii=False)}
        with self._lock, self._writing("compactions"):
            (
                self._compactions.merge_insert("key")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist([row], schema=COMPACTIONS_SCHEMA))
            )
            self._fold(self._compactions, "compactions")

    def load_compactions(self, session: str) -> list[dict[str, Any]]:
        if not self._compactions.count_rows():
            return []
        rows = self._compactions.search().where(f"session = {quote(session)}").limit(None).to_list()
        order = {"started": 0, "summary_completed": 1, "declared": 2, "finished": 3, "aborted": 3}
        rows.sort(key=lambda r: (r["seq"], order.get(r["phase"], 9)))
        return [{"seq": r["seq"], "phase": r["phase"], "time": r["time"], **json.loads(r["data"])} for r in rows]

    # -- the compaction lease (compaction/lease.py) ----------------------------------------------------
    def append_lease(self, session: str, claim: str, kind: str, owner: str, expires: float, n: int = 0) -> None:
        row = {"key": f"{session}\x1f{claim}\x1f{kind}\x1f{n}", "session": session, "claim": claim, "kind": kind,
               "owner": owner, "expires": float(expires), "time": now_iso()}
        with self._lock, self._writing("leases"):
            try:
                (
                    self._leases.merge_insert("key")
                    .when_not_matched_insert_all()
                    .execute(pa.Table.from_pylist([row], schema=LEASES_SCHEMA))
                )
            except Exception as exc:
                raise StoreError(store_problem(self.uri, "leases", exc)) from exc
            self._fold(self._leases, "leases")

    def load_leases(self, session: str) -> list[dict[str, Any]]:
        """The rows that can still matter: those whose expiry has not passed (a release row carries
        the longest lease lifetime, so it outlives its claim). A session tries the lease at every turn
        past the warn line, and reading all of its rows made a turn slower as the session grew."""
        if not self._leases.count_rows():
            return []
        where = f"session = {quote(session)} AND expires > {time.time() - 1.0!r}"
        return self._leases.search().where(where).limit(None).to_list()

    # -- ledger ---------------------------------------------------------------------------
    def append_ledger(self, session: str, seq: int, kind: str, data: dict[str, Any], writer: str = "") -> dict[str, Any]:
        """One ledger row; the key carries the writer, so two kernels never overwrite each other's rows."""
        row = {
            "key": f"{session}\x1f{seq:012d}\x1f{writer}",
            "session": session,
            "seq": seq,
            "time": now_iso(),
            "kind": kind,
            "data": json.dumps(data, sort_keys=True, ensure_ascii=False),
        }
        with self._lock, self._writing("ledger"):
            (
                self._ledger.merge_insert("key")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist([row], schema=LEDGER_SCHEMA))
            )
            self._fold(self._ledger, "ledger")
        return {"seq": seq, "time": row["time"], "kind": kind, **data}

    def load_ledger(self, session: str) -> list[dict[str, Any]]:
        if not self._ledger.count_rows():
            return []
        rows = self._ledger.search().where(f"session = {quote(session)}").limit(None).to_list()
        rows.sort(key=lambda r: (r["seq"], r["time"]))  # one writer's order is its seq; kernels interleave by time
        return [{"seq": r["seq"], "time": r["time"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]


    # -- the per-call history (the ledger chart): small rows appended in batches ---------------
    def _calls(self, create: bool) -> Any:
        """The calls table (None when it does not exist and `create` is false); a writer holds `_lock`."""
        if self._calls_table is None:
            if not create and "calls" not in table_names(self._db):
                return None
            self._calls_table = self._table("calls", CALLS_SCHEMA)
        return self._calls_table

    def append_calls(self, session: str, rows: list[dict[str, Any]], writer: str,
                     timeout: float | None = None) -> bool:
        """Insert history rows (`call`, `turn`, `tokens`, `tier`, `acted`) whose keys are new. With
        `timeout`, gives up (False) when another thread holds the store that long."""
        if not rows:
            return True
        table = [{"key": f"{session}\x1f{int(r['call']):012d}\x1f{writer}", "session": session, "call": int(r["call"]),
                  "data": json.dumps(r, sort_keys=True)} for r in rows]
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            with self._writing("calls"):
                (
                    self._calls(True).merge_insert("key")
                    .when_not_matched_insert_all()
                    .execute(pa.Table.from_pylist(table, schema=CALLS_SCHEMA))
                )
        finally:
            self._lock.release()
        return True

    def load_calls(self, session: str, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` history rows of a session, oldest first."""
        table = self._calls(False)
        if table is None or not table.count_rows():
            return []
        rows = table.search().where(f"session = {quote(session)}").select(["call", "data"]).limit(None).to_list()
        out = [json.loads(r["data"]) for r in rows]
        out.sort(key=lambda r: (r.get("at", ""), r["call"]))  # kernels number their own calls: by time
        return out[-limit:]

    # -- verbatim track: one classification per user message, written once ------------------
    def save_verdicts(self, session: str, rows: list[dict[str, Any]]) -> None:
        """Insert classifications whose (session, uid) is new; the first one written stays, so a
        restart or another kernel renders the same track."""
        if not rows:
            return
        table = [{"key": f"{session}\x1f{int(r['uid']):012d}", "session": session, "uid": int(r["uid"]),
                  "disposition": r["disposition"], "source": r["source"],
                  "data": json.dumps(r["data"], sort_keys=True, ensure_ascii=False), "model": r.get("model") or "",
                  "created_at": now_iso()} for r in rows]
        with self._lock, self._writing("verbatim"):
            (
                self._verbatim.merge_insert("key")
                .when_not_matched_insert_all()
                .execute(pa.Table.from_pylist(table, schema=VERBATIM_SCHEMA))
            )
            self._fold(self._verbatim, "verbatim")

    def load_verdicts(self, session: str) -> dict[int, dict[str, Any]]:
        if not self._verbatim.count_rows():
            return {}
        rows = self._verbatim.search().where(f"session = {quote(session)}").limit(None).to_list()
        out: dict[int, dict[str, Any]] = {}
        for r in sorted(rows, key=lambda r: r["created_at"]):
            out.setdefault(int(r["uid"]), {**json.loads(r["data"]), "model": r["model"]})
        return out

    def texts_naming(self, needle: str) -> list[str]:
        """Event contents and verbatim rows (of every session) that contain `needle` (`%` and `_` act
        as LIKE wildcards, so the answer may hold more; callers filter it exactly)."""
        like = needle.replace("'", "''")
        out: list[str] = []
        for table, column in ((self._events, "content"), (self._verbatim, "data")):
            if table.count_rows():
                rows = table.search().where(f"{column} LIKE '%{like}%'").select([column]).limit(None).to_list()
                out += [r[column] for r in rows]
        return out

