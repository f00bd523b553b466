"""Snapshots on object storage: rows of the store's `files` table."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa

from .schemas import FILES_SCHEMA, quote

Guard = Callable[[str], AbstractContextManager[Any]]


class TableFiles:
    """Snapshots of a store on object storage, as rows of its `files` table (path, bytes, mtime). A
    snapshot is content-addressed, so a path's bytes never change: writing one twice is a no-op."""

    def __init__(self, table: Callable[[], Any], lock: AbstractContextManager[Any], reading: Guard, writing: Guard):
        """`table`: opens the `files` table; `lock`: the store's write lock; `reading`/`writing`: its
        guards around a table's read or write (a one-line error for a store that cannot be read)."""
        self._table, self._lock, self._reading, self._writing = table, lock, reading, writing

    def exists(self, rel: str) -> bool:
        with self._reading("files"):
            return bool(self._table().count_rows(f"path = {quote(rel)}"))

    def touch(self, rel: str) -> None:
        with self._lock, self._writing("files"):
            self._table().update(where=f"path = {quote(rel)}", values={"mtime": time.time()})

    def put(self, rel: str, data: bytes) -> None:
        row = pa.Table.from_pylist([{"path": rel, "data": data, "size": len(data), "mtime": time.time()}],
                                   schema=FILES_SCHEMA)
        with self._lock, self._writing("files"):
            self._table().merge_insert("path").when_not_matched_insert_all().execute(row)

    def listing(self) -> list[tuple[str, int, float]]:
        with self._reading("files"):
            table = self._table()
            if not table.count_rows():
                return []
            rows = table.search().select(["path", "size", "mtime"]).limit(None).to_list()
        return sorted((r["path"], r["size"], r["mtime"]) for r in rows)

    def remove(self, rel: str) -> None:
        with self._lock, self._writing("files"):
            self._table().delete(f"path = {quote(rel)}")

