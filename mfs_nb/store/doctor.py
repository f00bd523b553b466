"""`mfs-nb doctor` / `%mfs doctor`: check a store, find what is readable, repair what can be.

Checks every table (reads in full? rows, versions), every event's stored content hash, and every
session's uids against what its segments, verdicts and saved state (its uid high-water mark) refer to. With `repair`, the events that
still read are written as a new version of the events table (LanceDB keeps the old versions), and
each uid that could not be recovered gets a tombstone event saying so — so uids are never reused
and the log stays contiguous. The report names exactly which uids were lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..events import Event, content_hash, now_iso
from . import read_only_error, resolve_uri, shown_uri
from .connection import store_problem
from .salvage import rewrite_events, salvage_rows, table_report

TOMBSTONE = "[uid {uid} could not be recovered from a damaged store (mfs-nb doctor, {when})]"


def _ranges(uids: list[int]) -> str:
    out: list[str] = []
    for uid in sorted(uids):
        if out and int(out[-1].split("–")[-1]) + 1 == uid:
            out[-1] = out[-1].split("–")[0] + f"–{uid}"
        else:
            out.append(str(uid))
    return ", ".join(out)


def _references(uri: str, tables: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The highest uid each session's segments, verdicts and saved state refer to."""
    high: dict[str, int] = {}
    if "compactions" in tables:
        for r in salvage_rows(uri, "compactions")[0]:
            if r["phase"] == "declared":
                seg = json.loads(r["data"]).get("segment") or {}
                if seg.get("uid_to"):
                    high[r["session"]] = max(high.get(r["session"], 0), int(seg["uid_to"]))
    if "verbatim" in tables:
        for r in salvage_rows(uri, "verbatim")[0]:
            high[r["session"]] = max(high.get(r["session"], 0), int(r["uid"]))
    if "sessions" in tables:  # the high-water mark each session saves with its state
        for r in salvage_rows(uri, "sessions")[0]:
            try:
                saved = int((json.loads(r.get("anchor") or "{}") or {}).get("last_uid") or 0)
            except (ValueError, TypeError, AttributeError):
                continue
            if saved:
                high[r["session"]] = max(high.get(r["session"], 0), saved)
    return high


def _check_folder(uri: str) -> None:
    """A local store path doctor can read, or StoreError with one line: a file, a missing folder (never
    created here: doctor only looks) and a folder this user cannot read are not stores."""
    if "://" in uri:
        return
    path = Path(uri)
    if not path.exists():
        raise StoreError(f"no store at {uri}: the folder does not exist; pass the folder that holds the store's "
                         "tables (--store PATH, or MFS_STORE; the default is ./.mfs)")
    if not path.is_dir():
        raise StoreError(f"{uri} is a file, not a store folder; pass the folder that holds the store's tables "
                         "(--store PATH, or MFS_STORE; the default is ./.mfs)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise StoreError(f"the store at {uri} cannot be read by this user (permission denied); run doctor as a user "
                         "who may read it, or make the folder readable")


def doctor(store: str | None = None, repair: bool = False) -> tuple[list[str], bool]:
    """(report lines, healthy). `repair` rewrites the events table from what is readable. A path that is
    not a readable store, or a store that cannot be read or (with `repair`) written, raises StoreError
    with one line."""
    uri = resolve_uri(store)
    _check_folder(uri)
    try:
        return _doctor(uri, repair)
    except StoreError:
        raise
    except Exception as exc:  # lancedb and the OS raise many types; the user needs one line
        if read_only_error(exc) and not repair:  # doctor only reads: a part of the store it may not read
            raise StoreError(f"part of the store at {shown_uri(uri)} cannot be read by this user (permission "
                             "denied); run doctor as a user who may read it, or make the folder readable") from exc
        raise StoreError(store_problem(uri, "", exc).replace(f"; run `mfs-nb doctor --store {shown_uri(uri)}`",
                                                              "")) from exc


def _doctor(uri: str, repair: bool) -> tuple[list[str], bool]:
    tables = table_report(uri)
    if not tables:
        return [f"no tables at {uri}: nothing to check"], True
    lines = [f"store {uri}"]
    for name, info in sorted(tables.items()):
        state = "ok" if info["ok"] else f"UNREADABLE ({info['error']})"
        lines.append(f"  table {name}: {info['rows']} rows, {len(info['versions'])} versions, {state}")
    healthy = all(info["ok"] for info in tables.values())
    rows, bad = salvage_rows(uri, "events") if "events" in tables else ([], 0)
    if "events" not in tables:
        healthy = False
        lines.append("  table events is MISSING")
    if bad:
        lines.append(f"  events: {bad} rows cannot be read; {len(rows)} can")
    changed = [(r["session"], r["uid"]) for r in rows if content_hash(r["content"] or "") != r["sha256"]]
    for session, uid in changed:
        lines.append(f"  session {session}: uid {uid} does not match its stored content hash (changed on disk)")
    healthy = healthy and not changed and not bad
    present: dict[str, set[int]] = {}
    for r in rows:
        present.setdefault(r["session"], set()).add(int(r["uid"]))
    refs = _references(uri, tables)
    lost: dict[str, list[int]] = {}
    for session in sorted(set(present) | set(refs)):
        have = present.get(session, set())
        top = max([*have, refs.get(session, 0)], default=0)
        gone = sorted(set(range(1, top + 1)) - have)
        if gone:
            lost[session] = gone
            healthy = False
            lines.append(f"  session {session}: uids {_ranges(gone)} are missing from the log")
        else:
            lines.append(f"  session {session}: uids 1–{top} present")
    if not repair:
        if not healthy:
            lines.append("run with --repair to rewrite the events table from what is readable "
                         "(older table versions are kept)")
        return lines, healthy
    if healthy:
        lines.append("nothing to repair")
        return lines, True
    keep = [r for r in rows if (r["session"], r["uid"]) not in set(changed)] + \
        [r for r in rows if (r["session"], r["uid"]) in set(changed)]  # changed rows stay; they are reported
    when = now_iso()
    for session, gone in lost.items():
        turns = {int(r["uid"]): int(r["turn"]) for r in rows if r["session"] == session}
        for uid in gone:
            turn = max([t for u, t in turns.items() if u < uid], default=1)
            keep.append(Event(uid=uid, session=session, turn=turn, role="assistant",
                              content=TOMBSTONE.format(uid=uid, when=when), origin="tombstone",
                              created_at=when).to_row("doctor"))
    rewrite_events(uri, keep)
    for session, gone in lost.items():
        lines.append(f"repaired session {session}: uids {_ranges(gone)} could not be recovered; "
                     "each is a tombstone now (never reused)")
    if bad and not lost:
        lines.append(f"repaired: {bad} unreadable rows dropped; no uid the store refers to was lost")
    return lines, False
