"""What the session offers of its memory: recall by uid, search, export, the knowledge slot
(`pin`/`unpin` and the model's remember/forget), table maintenance, and the fork."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from .. import lang
from ..errors import InputError
from ..events import Event, now_iso
from ..recall.dates import uid_bounds
from ..recall.ranking import METHODS as SEARCH_METHODS
from ..recall.ranking import PAGE, Results
from ..recall.tools import format_events, format_hits, memory_result_chars, parse_range
from .intake import Intake
from .parts import QUIET_KEEP_S


class Memory(Intake):
    """Reading the history back, keeping knowledge, maintaining the store, forking."""

    def recall(self, uid_from: int | str, uid_to: int | str | None = None) -> list[Event]:
        """The original events with uids in [uid_from, uid_to], verbatim, from the log."""
        a, b = parse_range(uid_from, uid_to)
        last = self.last_uid
        if not self._events:
            raise InputError(f"session {self.name!r} has no events yet")
        if a > last or b < 1:
            raise InputError(f"no events in {a}-{b}; session {self.name!r} has uids 1-{last}")
        a, b = max(a, 1), min(b, last)
        if b - a + 1 > self.settings.recall_max_events:
            raise InputError(
                f"range {a}-{b} has {b - a + 1} events, more than {self.settings.recall_max_events} at once; "
                f"ask for a smaller range (e.g. {a}-{a + self.settings.recall_max_events - 1})"
            )
        return [e for e in self._events if a <= e.uid <= b]

    def refresh(self) -> None:
        """Take the events other kernels (or processes) committed to this session since it was read."""
        with self._lock:
            self._catch_up()

    def export(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Write the whole session to a .md or .ipynb file readable without mfs_nb: every message
        with its uid, each segment where it was declared, the ledger. Refuses to overwrite unless
        asked; a bad path raises InputError with one line and writes nothing."""
        from ..commands import export

        target = export.check_path(path, overwrite)
        with self._lock:
            self._catch_up()
            events = list(self._events)
            declared = [r for r in self.store.load_compactions(self.name) if r["phase"] == "declared"]
            ledger = self.ledger()
        first = events[0].created_at if events else ""
        header = (f"# mfs_nb session `{self.name}`\n\n"
                  f"Exported {now_iso()} from the store at `{self.store.shown}` · model `{self.settings.model}` · "
                  f"window {self.window:,} tokens · {len(events)} events"
                  + (f" (uids 1–{events[-1].uid}, from {first})" if events else "")
                  + f" · {_amount(len(declared), 'summary', 'summaries')} · "
                    f"{_amount(len(ledger), 'memory-layer action', 'memory-layer actions')}.\n\n"
                  "Every message is here word for word under its uid (what `recall_history` returns); each "
                  "segment appears where it was declared, with the text the model saw instead of the "
                  "messages it covers; the ledger of every memory-layer action is at the end.")
        parts = export.blocks(self.name, events, declared, ledger, header)
        text = export.notebook(parts) if target.suffix.lower() == ".ipynb" else export.markdown(parts)
        return export.write(target, text)

    def _recall_tool(self, uid_from: Any, uid_to: Any = None) -> str:
        events = self.recall(uid_from, uid_to)
        return format_events(events, memory_result_chars(self.profile().effective), self.retried())

    def search(self, query: Any, k: Any = 10, *, role: str | Sequence[str] | None = None,
               uid_from: int | None = None, uid_to: int | None = None, neighbours: int = 0,
               methods: Sequence[str] = SEARCH_METHODS, shown: Collection[int] = ()) -> Results:
        """Hybrid search (full text + vectors, their candidates re-ranked by latent terms, all fused
        by reciprocal rank; over both speakers, a turn that asks keeps a share of its score) over this
        session's log and segments. Hits carry uid, role, turn, score and a snippet; read them with
        `recall`. Events in `shown` are left out of the hits (the model's tool passes what its payload
        shows word for word: `SendView.shown_uids`)."""
        return self.indexer.search(query, k, role=role, uid_from=uid_from, uid_to=uid_to, neighbours=neighbours,
                                   methods=methods, shown=shown)

    def _search_tool(self, query: Any = "", k: Any = PAGE, role: Any = None, uid_from: Any = None,
                     uid_to: Any = None, date_from: Any = None, date_to: Any = None) -> str:
        lo, hi = (parse_range(uid_from, uid_to) if uid_from is not None else (None, None))
        if uid_from is None and uid_to is not None:
            hi = parse_range(uid_to)[0]
        lo, hi = uid_bounds(lambda: self._events, lo, hi, date_from or None, date_to or None)
        if lo is not None and hi is not None and lo > hi:
            return "no messages were written in that date range; try wider dates or none"
        shown = self._shown if self._shown is not None else self.send_view().shown_uids()
        found = self.search(query, k, role=role or None, uid_from=lo, uid_to=hi, shown=shown)
        return format_hits(found, memory_result_chars(self.profile().effective))

    # -- table maintenance ---------------------------------------------------------------------
    def optimize(self, keep_s: float = 86_400.0, trigger: str = "manual",
                 stop: Callable[[], bool] | None = None) -> list[str]:
        """Compact the store's small fragments and remove versions older than `keep_s` seconds
        (`%mfs optimize`, and `quiet.Quiet` after `quiet_maintenance_s` without a turn, which passes
        `stop`). Never while a kernel holds this session's compaction lock (it is taken for the
        duration); its cost and effect are a `maintenance` ledger row."""
        self.check_writable()
        report = self._maintain(keep_s, trigger, stop)
        if "busy" in report:
            return [f"{report['busy']}; the store was not optimized; try again in a moment"]
        v, f, b = report["versions"], report["fragments"], report["bytes"]
        line = (f"store optimized in {report['seconds']:.1f} s: versions {v[0]:,} → {v[1]:,}, fragments {f[0]:,} → "
                f"{f[1]:,}" + (f", on disk {b[0] / 1e6:.1f} → {b[1] / 1e6:.1f} MB" if b[0] else ""))
        return [line] + [f"table {name} was left as it was: {why}" for name, why in report["errors"].items()]

    def _maintain(self, keep_s: float, trigger: str, stop: Callable[[], bool] | None) -> dict[str, Any]:
        """`Store.maintain` under the compaction lock, with its ledger row; `{"busy": why}` when
        another kernel holds the lock."""
        with self._lock, self.compactor.exclusive(idle=True) as busy:
            if busy:
                self._log("skip", reason="locked", trigger="maintenance", detail=busy)
                return {"busy": busy}
            report = self.store.maintain(keep_s, stop=stop)
        self._log("maintenance", trigger=trigger, keep_s=keep_s, seconds=report["seconds"],
                  versions=report["versions"], fragments=report["fragments"], bytes=report["bytes"],
                  errors=report["errors"], stopped=report["stopped"])
        return report

    def _quiet_maintenance(self, stop: Callable[[], bool]) -> float | None:
        """What `quiet.Quiet` runs: the fold of every table, keeping `QUIET_KEEP_S` of versions for
        readers in other kernels; nothing when a turn is already waiting.

        A fold that rewrote a table leaves the data it replaced on disk, in versions younger than
        `QUIET_KEEP_S`, and a session left alone has no later fold to remove them (they were half the
        recall index of a store at rest: `mfs-nb bench chats`). So when this fold changed the layout
        and left a table with more than its latest version, it asks to run once more when those
        versions are old enough. That run can rewrite again (in a 5,000-chat run the first fold left the
        vectors in two fragments, 14,077 and 946 rows, that the second merged, leaving the 12 MB it
        replaced: the recall index twice over at rest), so it asks the same way, up to `quiet.RERUNS`
        times; one that rewrites nothing asks for nothing. The ledger and the leases do not count:
        every run writes them itself (its row, the compaction lock).
        Nor does it ask while the recall index is still catching up: the index's end starts the clock
        again, and folding its tables every half minute meanwhile only competes with it."""
        if stop() or self.store.read_only:
            return None
        report = self._maintain(QUIET_KEEP_S, "quiet", stop)
        if not self.indexer.wait(0):
            return None
        rewrote = [t["after"] for name, t in report.get("tables", {}).items()
                   if name not in ("ledger", "leases") and t["after"]["fragments"] < t["before"]["fragments"]]
        left = any(after["versions"] > 1 for after in rewrote)
        return QUIET_KEEP_S + 1.0 if left and not report.get("stopped") else None

    # -- the knowledge slot (knowledge.py) ---------------------------------------------------
    def knowledge_budget(self) -> int:
        return self.plan().knowledge

    def pin(self, key: str | dict[str, Any], value: Any = None, *, by: str = "user") -> list[str]:
        """Keep `key = value` (or every pair of a dict) in the knowledge slot, word for word, never
        compacted. Setting a key again replaces its value in place. When the slot would pass its budget
        the entries written longest ago leave; the notices say which. One ledger row per call."""
        items = dict(key) if isinstance(key, dict) else {key: value}
        self.check_writable()
        with self._lock:
            if not self.settings.knowledge_share:
                raise InputError("the knowledge slot is off (knowledge_share=0); turn it on with "
                                 "%mfs config knowledge_share=0.05")
            row = self.knowledge.plan_set(items, by, self.knowledge_budget())
            return self._write_knowledge(row, by)

    def unpin(self, *keys: str, by: str = "user") -> list[str]:
        """Remove keys from the knowledge slot (one ledger row)."""
        self.check_writable()
        with self._lock:
            return self._write_knowledge(self.knowledge.plan_remove(keys), by)

    def _write_knowledge(self, row: dict[str, Any], by: str) -> list[str]:
        """Ledger first (it is the slot's persistence), then the slot in memory. The row carries
        the tokens the next call reads again: the cached prefix ends where the slot starts."""
        view = self.send_view()
        counts = self.token_counts(view)
        changed = bool(row.get("changed") or row.get("removed") or row.get("evicted"))
        miss = sum(counts[1:]) if changed else 0
        row = {**row, "language": lang.translated(self.language())}
        self._log("knowledge", by=by, cache_miss_tokens=miss, **row)
        self.knowledge.apply(row)
        notices = []
        language = self.language()

        def keys(names: list[str]) -> str:
            return ", ".join(names[:10]) + (f" (+{len(names) - 10})" if len(names) > 10 else "")

        names = [x["key"] for x in row.get("set") or ()]
        if names:
            notices.append(lang.text("pinned" if by == "user" else "remembered", language, keys=keys(names),
                                     n=row["entries"], tokens=f"{row['tokens']:,}", budget=f"{self.knowledge_budget():,}"))
        if row.get("removed"):
            notices.append(lang.text("removed", language, keys=keys(row["removed"]), n=row["entries"]))
        if row.get("evicted"):
            notices.append(lang.text("slot_full", language, keys=keys(row["evicted"])))
        return notices

    def _remember_tool(self, key: Any = None, value: Any = None) -> str:
        return "; ".join(self.pin(key, value, by="model"))

    def _forget_tool(self, key: Any = None) -> str:
        return "; ".join(self.unpin(key, by="model"))


def _amount(n: int, one: str, many: str) -> str:
    """`0` → 'no summaries', `1` → '1 summary', `3` → '3 summaries'."""
    return f"no {many}" if n == 0 else f"1 {one}" if n == 1 else f"{n:,} {many}"
