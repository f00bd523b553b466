"""One session carried into another store word for word (`Session.copy_to`, `%mfs fork NAME --store PATH`):
its log under the same uids, its segments and protocol rows, its ledger, verdicts, call rows and saved
state, and the snapshots its messages name. The way to go on with a session read from a store that is
read-only here.

Every table is written with `merge_insert` on its key, so a copy that stopped half-way is finished by
running it again; the state row goes last, so a session that has it was copied whole. The recall index
is not copied: the target builds its own when the session is opened there."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import InputError
from .schemas import quote

if TYPE_CHECKING:
    from . import Store

# the per-session tables copied besides the log, in the order written (the state row last: see above)
TABLES = ("compactions", "ledger", "verbatim", "calls", "sessions")


def copy_session(source: Store, name: str, target: Store, new: str, writer: str) -> dict[str, Any]:
    """Copy session `name` of `source` into `target` as `new`; returns {events, uids, rows, snapshots}.
    Refused, before anything is written, where `target` holds another conversation under `new` (or
    one that has gone on past the copy)."""
    from ..layers.snapshots import PATH_RE

    if target.read_only:
        raise InputError(f"cannot copy into {target.shown}: {target.read_only_line()}")
    if target.uri == source.uri and new == name:
        raise InputError(f"session {name!r} is already in {target.shown}; name another store or another session")
    events = source.load_events(name)
    if not events:
        raise InputError(f"session {name!r} in {source.shown} has no messages: there is nothing to copy")
    if new in target.sessions():
        have = {e.uid: e.sha256 for e in target.load_events(new)}
        mine = {e.uid: e.sha256 for e in events}
        if any(mine.get(uid) != sha for uid, sha in have.items()):
            raise InputError(f"session {new!r} exists already in {target.shown} and holds another conversation "
                             "(or has gone on since it was copied); copy under another name")
    rows = [replace(e, session=new).to_row(writer) for e in events]
    with target._writing("events"):
        table = target._events
        for i in range(0, len(rows), 2_000):
            part = pa.Table.from_pylist(rows[i:i + 2_000], schema=table.schema)
            table.merge_insert("key").when_not_matched_insert_all().execute(part)
    copied: dict[str, int] = {"events": len(rows)}
    for t in TABLES:
        part = _rows(source, t, name, new)
        if part is None:
            continue
        key = "session" if t == "sessions" else "key"
        with target._writing(t):
            dest = target._calls(True) if t == "calls" else getattr(target, f"_{t}")
            dest.merge_insert(key).when_not_matched_insert_all().execute(part.cast(dest.schema))
        copied[t] = part.num_rows
    snapshots = 0
    files = target.files
    for rel in sorted({m.group(0) for e in events for m in PATH_RE.finditer(e.content)}):
        data = _snapshot(source, rel)
        if data is not None and not files.exists(rel):
            files.put(rel, data)
            snapshots += 1
    target._wrote_upto.pop(new, None)
    target._events_version = None
    return {"events": len(rows), "uids": [events[0].uid, events[-1].uid], "rows": copied, "snapshots": snapshots}


def _rows(source: Store, table: str, name: str, new: str) -> pa.Table | None:
    """The rows of `table` that belong to `name`, renamed to `new` (keys start with the session's name)."""
    from .connection import table_names

    if table not in table_names(source._db):
        return None
    found = source._db.open_table(table).search().where(f"session = {quote(name)}").limit(None).to_arrow()
    if not found.num_rows:
        return None
    found = found.set_column(found.schema.get_field_index("session"), "session",
                             pa.array([new] * found.num_rows, pa.string()))
    if "key" in found.schema.names:
        keys = [k if not k.startswith(name + "\x1f") else new + k[len(name):] for k in found.column("key").to_pylist()]
        found = found.set_column(found.schema.get_field_index("key"), "key", pa.array(keys, pa.string()))
    return found


def _snapshot(source: Store, rel: str) -> bytes | None:
    """The bytes of a snapshot the source keeps (None where it has lost it: the copy goes on without)."""
    from pathlib import Path

    if source.is_local:
        path = Path(source.uri) / rel
        return path.read_bytes() if path.is_file() else None
    from .connection import table_names

    if "files" not in table_names(source._db):
        return None
    rows = source._db.open_table("files").search().where(f"path = {quote(rel)}").limit(1).to_list()
    return bytes(rows[0]["data"]) if rows else None
