"""Snapshots on object storage: rows of the store's `files` table."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from .core import StoreCore
from .schemas import FILES_SCHEMA, _quote


class TableFiles:
    """Snapshots of a store on object storage, as rows of its `files` table (path, bytes, mtime). A
    snapshot is content-addressed, so a path's bytes never change: writing one twice is a no-op."""

    def __init__(self, store: StoreCore):
        self.store = store

    def _table(self) -> Any:
        return self.store._table("files", FILES_SCHEMA)

    def exists(self, rel: str) -> bool:
        with self.store._reading("files"):
            return bool(self._table().count_rows(f"path = {_quote(rel)}"))

    def touch(self, rel: str) -> None:
        with self.store._lock, self.store._writing("files"):
            self._table().update(where=f"path = {_quote(rel)}", values={"mtime": time.time()})

    def put(self, rel: str, data: bytes) -> None:
        row = pa.Table.from_pylist([{"path": rel, "data": data, "size": len(data), "mtime": time.time()}],
                                   schema=FILES_SCHEMA)
        with self.store._lock, self.store._writing("files"):
            self._table().merge_insert("path").when_not_matched_insert_all().execute(row)

    def listing(self) -> list[tuple[str, int, float]]:
        with self.store._reading("files"):
            table = self._table()
            if not table.count_rows():
                return []
            rows = table.search().select(["path", "size", "mtime"]).limit(None).to_list()
        return sorted((r["path"], r["size"], r["mtime"]) for r in rows)

    def remove(self, rel: str) -> None:
        with self.store._lock, self.store._writing("files"):
            self._table().delete(f"path = {_quote(rel)}")

