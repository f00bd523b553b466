"""Damaged stores: reading what still reads, and writing the salvaged log back (doctor.py decides)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from .connection import lancedb_module, resolve_uri, table_names
from .schemas import EVENTS_SCHEMA, create_table


def layout(table: Any, folder: Path | None) -> dict[str, int]:
    """Versions, fragments and bytes on disk (local stores) of one table."""
    stats = table.stats()
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder is not None else 0
    return {"versions": len(table.list_versions()), "fragments": int(stats["fragment_stats"]["num_fragments"]),
            "bytes": size}



def table_report(uri: str) -> dict[str, dict[str, Any]]:
    """Every table of a store: whether it reads in full, its row count and its versions."""
    lancedb = lancedb_module()

    db = lancedb.connect(resolve_uri(uri))
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(table_names(db)):
        info: dict[str, Any] = {"ok": False, "rows": None, "versions": [], "error": ""}
        try:
            table = db.open_table(name)
            info["versions"] = [int(v["version"]) for v in table.list_versions()]
            info["rows"] = table.count_rows()
            table.to_arrow()
            info["ok"] = True
        except Exception as exc:
            info["error"] = " ".join(str(exc).split())[:200]
        out[name] = info
    return out


def salvage_rows(uri: str, name: str, chunk: int = 64) -> tuple[list[dict[str, Any]], int]:
    """The rows of a table that still read, row groups first, then one by one; and how many did not."""
    lancedb = lancedb_module()

    table = lancedb.connect(resolve_uri(uri)).open_table(name)
    total = table.count_rows()
    good: list[dict[str, Any]] = []
    bad = 0
    stack = [(i, min(i + chunk, total)) for i in range(0, total, chunk)]
    while stack:
        a, b = stack.pop(0)
        try:
            good += table.take_offsets(list(range(a, b))).to_arrow().to_pylist()
        except Exception:
            if b - a == 1:
                bad += 1
            else:
                mid = (a + b) // 2
                stack[:0] = [(a, mid), (mid, b)]
    return good, bad


def rewrite_events(uri: str, rows: list[dict[str, Any]]) -> None:
    """Write the salvaged events as a new version of the events table (older versions stay)."""
    lancedb = lancedb_module()

    db = lancedb.connect(resolve_uri(uri))
    if "events" in table_names(db):
        table = db.open_table("events")
        # the table's own schema, with its metadata: which row of two under a key counts stays the same
        table.add(pa.Table.from_pylist(rows, schema=table.schema), mode="overwrite")
    else:
        create_table(db, "events", EVENTS_SCHEMA, stable_ids=True, data=pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA))
