"""The orchestrator (docs/architecture.md, "One turn"): one `Session` wires a turn through log, projection and model.

Everything the magics, the CLI and the benchmarks do goes through this class. The memory
logic stays in pure modules (`view`, `tokens`, `usage`); this file owns the order of steps,
persistence of each event the moment it exists, and the tool loop.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import random
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from . import clearing, lang, snapshots
from .clearing import Clearing
from .compaction import Compactor
from .errors import ConfigError, InputError, MfsError, PromptTooLong, StoreError
from .events import Event, clean_text, now_iso, replies_before
from .host import Host
from .index import Indexer
from .knowledge import FORGET_DESCRIPTION, FORGET_SCHEMA, REMEMBER_DESCRIPTION, REMEMBER_SCHEMA, KnowledgeSlot
from .llm import LLM, Completion, default_endpoints, is_offline, missing_key, model_window, redact
from .meter import Meter
from .origin import (
    DOCUMENT,
    OWN,
    QUOTE,
    QUOTE_NOTE,
    RECENT,
    Verdict,
    best_overlap,
    first_line,
    looks_like_document,
    split_quote,
)
from .prompt_cache import fingerprint, hints_for
from .quiet import Quiet
from .search import METHODS as SEARCH_METHODS
from .search import Results
from .segments import Segment
from .settings import Settings, from_environment, warm_up_enabled
from .snapshots import read_document
from .store import Store, UidConflict
from .tokens import estimate_tokens, message_tokens
from .tools import (
    RECALL_DESCRIPTION,
    RECALL_SCHEMA,
    SEARCH_DESCRIPTION,
    SEARCH_SCHEMA,
    Tool,
    call_tool,
    format_events,
    format_hits,
    memory_result_chars,
    parse_range,
)
from .track import VerbatimTrack
from .usage import TIERS, ContextProfile, Usage, human, tier_label
from .view import RawCache, SendView, drop_oldest_rounds, project
from .workset import FactTrack, fact_track

DEFAULT_WINDOW = 128_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def valid_session_name(name: Any) -> bool:
    """1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""
    return isinstance(name, str) and bool(_NAME.match(name))


# A single message may take at most this share of the effective window; more cannot be sent.
MAX_MESSAGE_SHARE = 0.5
# Another kernel appending to the same session makes our uid stale; we reload and retry.
_WRITE_ATTEMPTS = 20
PTL_TRIES = 3
HISTORY = 2_000  # calls kept for the ledger plot
CALLS_BATCH = 20  # history rows written together; the rest at the interpreter's exit (a crash loses at most these)
KNOWLEDGE_TOOLS = ("remember", "forget")
NOTEBOOK_TOOLS = ("inspect_variable", "cell_output")  # registered by the notebook (notebook/tools.py)
QUIET_KEEP_S = 30.0  # versions the quiet-moment fold keeps, for a read under way in another kernel


class ChatModel(Protocol):
    """What a Session needs from a model client (the real one is `llm.LLM`; tests pass fakes)."""

    def complete(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                 stream: bool = True, on_delta: Callable[[str], None] | None = None,
                 on_reset: Callable[[], None] | None = None) -> Completion: ...


@dataclass
class Reply:
    """The answer to one `chat` call."""

    text: str
    usage: Usage
    provider_usage: dict[str, int] | None
    notices: list[str] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)
    endpoint: str = "primary"

    def _repr_markdown_(self) -> str:
        return f"{self.text}\n\n`{self.usage.status_line()}`"


@dataclass
class CallPlan:
    """What the memory layer decided before one model call: the payload and its pressure."""

    view: SendView
    usage: Usage
    notices: list[str]


def _profile(window: int, settings: Settings) -> ContextProfile:
    return ContextProfile(window, warn=settings.warn_at, compress=(settings.warn_at + settings.hard_at) / 2,
                          hard=settings.hard_at)


def _window_for(settings: Settings) -> int:
    if settings.window_tokens:
        return settings.window_tokens
    return (None if is_offline(settings.model) else model_window(settings.model)) or DEFAULT_WINDOW


def system_prompt(extra: str = "") -> str:
    base = resources.files("mfs_nb").joinpath("prompts/system.md").read_text(encoding="utf-8").strip()
    return base + ("\n\n" + extra.strip() if extra.strip() else "")


@lru_cache(maxsize=8)
def _text_tokens(text: str) -> int:
    """`estimate_tokens`, remembered: the tool schemas are measured on every call and rarely change."""
    return estimate_tokens(text)


class Session:
    """A named conversation persisted in a store; re-opening the name resumes it exactly."""

    def __init__(self, name: str = "default", store: str | Store | None = None, model: str | None = None,
                 window_tokens: int | None = None, *, llm: ChatModel | None = None, **settings: Any):
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"session name {name!r} is invalid: use 1-64 letters, digits, '.', '_' or '-'")
        self.name = name
        self.store = store if isinstance(store, Store) else Store(store)
        meta = self.store.load_meta(name)
        explicit = {k: v for k, v in {"model": model, "window_tokens": window_tokens, **settings}.items()
                    if v is not None}
        saved = dict(meta.get("settings") or {})
        self.settings = Settings().with_values(**from_environment()).with_values(**saved).with_values(**explicit)
        self._saved = {**saved, **{k: getattr(self.settings, k) for k in explicit}}
        self._writer = uuid.uuid4().hex
        self._lock = threading.RLock()
        self._ledger_lock = threading.Lock()
        self._events: list[Event] = self.store.load_events(name)
        self._meter = Meter.from_json(meta.get("anchor"))
        # the per-call history (the ledger chart) lives in its own table, appended in batches; a store
        # written before that kept it in the saved state
        self.history: list[dict[str, Any]] = self.store.load_calls(name, HISTORY)
        legacy = list((meta.get("anchor") or {}).get("history") or [])
        if legacy and not self.history:  # moved to the calls table before the state row is rewritten without it
            self.store.append_calls(name, legacy, "legacy")
            self.history = legacy[-HISTORY:]
        self._calls_pending: list[dict[str, Any]] = []
        _LIVE.add(self)  # what is left of the call rows is written when the interpreter exits
        _register_exit_flush()
        self._saved_state: str | None = None
        self._breaker: dict[str, Any] | None = (meta.get("anchor") or {}).get("breaker")
        # the highest uid this session ever saved state after: a log that ends below it lost rows
        self._saved_last_uid = int((meta.get("anchor") or {}).get("last_uid") or 0)
        # a fork's parent: {"session", "uid_from", "uid_to", "segment", "at"} (None for a session of its own)
        self.parent: dict[str, Any] | None = (meta.get("anchor") or {}).get("parent")
        # settings this session keeps whatever the notebook says (`configure(..., own=True)`); the rest
        # follow the notebook's choice (model, endpoint), applied by the notebook boundary
        self.overrides: set[str] = set((meta.get("anchor") or {}).get("overrides") or [])
        self.fork_notices: list[str] = []  # what making this session as a fork had to say
        self._language: tuple[int, str | None] | None = None
        ledger = self.store.load_ledger(name)
        self._ledger_seq = len(ledger)
        last_clearing = next((r for r in reversed(ledger) if r["kind"] == "clearing"), None)
        self._token_cache: dict[tuple[int, str], int] = {}
        self._last_recorded: Event | None = None  # the last event this kernel saved
        self._last_payload: list[dict[str, Any]] | None = None
        self._last_prefix_ratio: float | None = None
        self._last_provider_usage: dict[str, int] | None = None
        self._last_tier = "ok"
        self.last_plan: CallPlan | None = None
        self._injected_llm = llm
        self._llm: ChatModel | None = llm
        self._summarizer: ChatModel | None = None
        self._window: int | None = None
        # prompt caching (prompt_cache.py): one key per session, and the last call's anchor
        self._cache_key = "mfs-" + hashlib.sha256(f"{self.store.uri}\x1f{name}".encode()).hexdigest()[:24]
        self._cache_anchor: tuple[int, str] | None = None
        self.tools: dict[str, Tool] = {}
        self.register_tool(Tool("recall_history", RECALL_DESCRIPTION, RECALL_SCHEMA, self._recall_tool))
        self.register_tool(Tool("recall_search", SEARCH_DESCRIPTION, SEARCH_SCHEMA, self._search_tool))
        self.register_tool(Tool("remember", REMEMBER_DESCRIPTION, REMEMBER_SCHEMA, self._remember_tool))
        self.register_tool(Tool("forget", FORGET_DESCRIPTION, FORGET_SCHEMA, self._forget_tool))
        # by time, not by seq: each kernel numbers its own rows, and the latest write of a key wins
        self.knowledge = KnowledgeSlot(sorted((r for r in ledger if r["kind"] == "knowledge"),
                                              key=lambda r: r["time"]))
        if self.settings.window_tokens:  # validated before anything is saved
            self._check_overhead(_profile(self.settings.window_tokens, self.settings), self.settings)
        if explicit or not meta:
            self._save_meta()
        # S2 boundaries are declared by clearing rows in the ledger; the newest one is in force.
        self._clear_before = int(last_clearing["clear_before"]) if last_clearing else 0
        self._prune_before = int(last_clearing["prune_before"]) if last_clearing else 0
        host = self._host()
        self.verbatim = VerbatimTrack(host)
        self.compactor = Compactor(host)
        self._check_log_intact()
        self.indexer = Indexer(host, enabled=self.settings.recall_index)
        if self._events:
            self.indexer.kick()  # a restart resumes indexing where it stopped
        self._quiet = Quiet(self._quiet_maintenance, lambda: self.settings.quiet_maintenance_s, name)
        self._raw_cache = RawCache()
        self._fact_cache: tuple[Any, FactTrack | None] | None = None
        if warm_up_enabled() and self._injected_llm is None:  # the embedding gate off the chat turns
            from .track import warm_gate_in_background

            warm_gate_in_background(self.settings.embedding_model)

    def _check_log_intact(self) -> None:
        """Segments, verdicts or the saved state naming uids past the end of the log mean the events
        table lost rows (removed, damaged, rolled back — even before any compaction): stop with one
        line instead of reusing those uids."""
        high = max([self.compactor.covered_to, self._saved_last_uid, *self.verbatim.verdicts], default=0)
        if high > self.last_uid:  # another kernel may have appended since we read the log
            self._catch_up()
        if high > self.last_uid:
            raise StoreError(
                f"table events of session {self.name!r} ends at uid {self.last_uid}, but the store refers to uids up to "
                f"{high}: rows were lost or rolled back. Nothing was changed; run `mfs-nb doctor --store "
                f"{self.store.shown}` (uids are never reused)")

    def _host(self) -> Host:
        """What the compactor, the verbatim track and the recall index may use of this session."""
        return Host(
            self.name, self.store, self._writer, lambda: self.settings, lambda: self._events, self._log,
            catch_up=self._catch_up, usage=lambda: self.usage(), view=lambda: self.send_view(),
            system_prompt=self._system, summarizer=lambda: self.summarizer,
            before_cover=lambda upto: self.verbatim.classify_pending(upto),
            after_index=self._indexed,
            load_breaker=lambda: self._breaker, save_breaker=self._save_breaker,
            segments=lambda: self.compactor.in_force(),
            embedder=lambda load: self.verbatim.vector_layer() if load else self.verbatim.loaded_layer(),
            embedder_off=lambda: self.verbatim.off_reason, busy=self._busy,
            miss_weight=self.miss_weight)

    def _indexed(self, upto: int) -> None:
        """The recall index wrote vectors up to `upto` (in its thread): verdicts, and a quiet fold later."""
        self.verbatim.indexed(upto)
        quiet = getattr(self, "_quiet", None)  # a restart's first catch-up may come before it exists
        if quiet is not None:
            quiet.turn_ended()

    def _catch_up(self) -> None:
        """Take the events other kernels appended since this one last read the log."""
        newer = self.store.load_events(self.name, uid_from=self.last_uid + 1)
        if newer:
            self._events = self._events + [e for e in newer if e.uid > self.last_uid]

    def _busy(self) -> bool:
        """Whether a turn (or another call holding the session's lock) is running now."""
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    def _save_breaker(self, state: dict[str, Any]) -> None:
        self._breaker = state
        self._save_meta(force=True)

    # -- configuration ---------------------------------------------------------------------
    def configure(self, *, own: bool = False, **values: Any) -> Settings:
        """Validate and apply settings; on any error nothing changes. Saved with the session. `own`: this
        session keeps these values whatever the notebook later sets for every session (`overrides`)."""
        with self._lock:
            new = self.settings.with_values(**values)
            window = _window_for(new)
            self._check_overhead(_profile(window, new), new)
            self.settings, self._window = new, window
            self._saved.update({k: getattr(new, k) for k in values})
            if own:
                self.overrides.update(values)
            if self._injected_llm is None:
                self._llm = self._summarizer = None  # rebuilt with the new endpoints on the next call
            self._save_meta(force=True)  # another kernel may have written the row since
            return new

    def register_tool(self, tool: Tool) -> None:
        self.tools[tool.name] = tool

    @property
    def llm(self) -> ChatModel:
        if self._llm is None:
            self._llm = self._new_llm("chat")
        return self._llm

    @property
    def summarizer(self) -> ChatModel:
        """The summarizer's client: the same endpoints with health of its own, so its failures
        never move the chat to the fallback (an injected model serves both)."""
        if self._injected_llm is not None:
            return self._injected_llm
        if self._summarizer is None:
            self._summarizer = self._new_llm("summarizer")
        return self._summarizer

    def _new_llm(self, use: str) -> LLM:
        s = self.settings
        primary, fallback = default_endpoints(s.model, s.api_base, s.fallback_model, s.fallback_base_url)
        return LLM(primary, fallback, timeout_s=s.timeout_s, use=use,
                   on_switch=lambda kind, data: self._log(kind, **data))

    @property
    def window(self) -> int:
        """The model's window: configured, else litellm's model map, else 128k."""
        if self._window is None:
            self._window = _window_for(self.settings)
        return self._window

    def profile(self) -> ContextProfile:
        """Window and tier thresholds of this session."""
        return _profile(self.window, self.settings)

    def _check_overhead(self, profile: ContextProfile, settings: Settings) -> None:
        overhead = message_tokens({"role": "system", "content": system_prompt(settings.system_prompt)})
        overhead += self._tool_schema_tokens(settings)
        if overhead > profile.effective * MAX_MESSAGE_SHARE:
            raise ConfigError(
                f"window of {profile.window_tokens:,} tokens is too small: the system prompt and tool schemas "
                f"alone take {overhead:,} of {profile.effective:,} usable tokens"
            )

    def _system(self) -> str:
        return system_prompt(self.settings.system_prompt)

    def _offered(self, settings: Settings | None = None) -> dict[str, Tool]:
        """The tools the model is offered: none with `tools` off, the knowledge slot's only with a slot,
        the notebook's only with `notebook_tools` on; read at each call, so a change applies to the next."""
        settings = settings or self.settings
        if not settings.tools:
            return {}
        off = (KNOWLEDGE_TOOLS if not settings.knowledge_share else ()) + \
            (NOTEBOOK_TOOLS if not settings.notebook_tools else ())
        return {name: t for name, t in self.tools.items() if name not in off}

    def _tool_schemas(self, settings: Settings | None = None) -> list[dict[str, Any]]:
        return [t.schema() for t in self._offered(settings).values()]

    def _tool_schema_tokens(self, settings: Settings | None = None) -> int:
        schemas = self._tool_schemas(settings)
        return _text_tokens(json.dumps(schemas)) if schemas else 0

    # -- the log ---------------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """A copy of every event of this session, in uid order."""
        return list(self._events)

    @property
    def last_uid(self) -> int:
        return self._events[-1].uid if self._events else 0

    @property
    def turn(self) -> int:
        return self._events[-1].turn if self._events else 0

    def record(self, role: str, content: str, *, origin: str = "", tool_calls: list[dict[str, Any]] | None = None,
               tool_call_id: str = "", name: str = "", new_turn: bool = False) -> Event:
        """Append one event to the log and persist it before returning. Never rewrites anything."""
        with self._lock:
            # a tool-only round (the model answering tool results) registers a turn start too,
            # so the cold range can be cut there without separating a call from its result
            if role == "assistant" and self._events and self._events[-1].role == "tool":
                new_turn = True
            for attempt in range(_WRITE_ATTEMPTS):
                turn = self.turn + 1 if new_turn or not self._events else self.turn
                event = Event(
                    uid=self.last_uid + 1, session=self.name, turn=turn, role=role, content=clean_text(content),
                    origin=origin or role, tool_calls=tuple(tool_calls or ()), tool_call_id=tool_call_id,
                    name=name, turn_start=new_turn or not self._events, created_at=now_iso(),
                )
                begun = time.monotonic()
                try:
                    self.store.append_events([event], self._writer)
                except UidConflict:
                    if attempt == _WRITE_ATTEMPTS - 1:
                        raise
                    # another kernel appended: take its events and the next uid, after a random pause that
                    # grows with the tries and with what a write costs here (ms locally, far more on S3)
                    took = time.monotonic() - begun
                    time.sleep(random.uniform(0, max(0.02, took) * min(attempt + 1, 8)))
                    self._catch_up()
                    continue
                self._events.append(event)
                self._last_recorded = event
                if getattr(self, "indexer", None) is not None:
                    self.indexer.kick()  # the turn never waits for the index
                return event
            raise AssertionError("unreachable")

    def record_cells(self, records: Sequence[Any]) -> Event | None:
        """The notebook cells run since the last chat (`cells.CellRecord`s) as one event: a tool result
        of the notebook, which S2 clears and S3 compacts like any other (failed cells go to the fact
        track). Nothing is written when `cell_log` is off or there are no records."""
        from .cells import NAME, event_text

        if not records or not self.settings.cell_log:
            return None
        return self.record("tool", event_text(list(records)), name=NAME)

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

    def export(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Write the whole session to a .md or .ipynb file readable without mfs_nb: every message
        with its uid, each segment where it was declared, the ledger. Refuses to overwrite unless
        asked; a bad path raises InputError with one line and writes nothing."""
        from . import export

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
                  + f" · {len(declared)} declarations · {len(ledger)} ledger rows.\n\n"
                  "Every message is here word for word under its uid (what `recall_history` returns); each "
                  "segment appears where it was declared, with the text the model saw instead of the "
                  "messages it covers; the ledger of every memory-layer action is at the end.")
        parts = export.blocks(self.name, events, declared, ledger, header)
        text = export.notebook(parts) if target.suffix.lower() == ".ipynb" else export.markdown(parts)
        return export.write(target, text)

    def _recall_tool(self, uid_from: Any, uid_to: Any = None) -> str:
        events = self.recall(uid_from, uid_to)
        return format_events(events, memory_result_chars(self.profile().effective))

    def search(self, query: Any, k: Any = 10, *, role: str | Sequence[str] | None = None,
               uid_from: int | None = None, uid_to: int | None = None, neighbours: int = 0,
               methods: Sequence[str] = SEARCH_METHODS) -> Results:
        """Hybrid search (full text + vectors, their candidates re-ranked by latent terms, all fused
        by reciprocal rank) over this session's log and segments. Hits carry uid, role, turn, score
        and a snippet; read them with `recall`."""
        return self.indexer.search(query, k, role=role, uid_from=uid_from, uid_to=uid_to, neighbours=neighbours,
                                   methods=methods)

    def _search_tool(self, query: Any = "", k: Any = 8, role: Any = None, uid_from: Any = None,
                     uid_to: Any = None) -> str:
        lo, hi = (parse_range(uid_from, uid_to) if uid_from is not None else (None, None))
        if uid_from is None and uid_to is not None:
            hi = parse_range(uid_to)[0]
        found = self.search(query, k, role=role or None, uid_from=lo, uid_to=hi)
        return format_hits(found, memory_result_chars(self.profile().effective))

    # -- table maintenance ---------------------------------------------------------------------
    def optimize(self, keep_s: float = 86_400.0, trigger: str = "manual",
                 stop: Callable[[], bool] | None = None) -> list[str]:
        """Compact the store's small fragments and remove versions older than `keep_s` seconds
        (`%mfs optimize`, and `quiet.Quiet` after `quiet_maintenance_s` without a turn, which passes
        `stop`). Never while a kernel holds this session's compaction lock (it is taken for the
        duration); its cost and effect are a `maintenance` ledger row."""
        with self._lock, self.compactor.exclusive(idle=True) as busy:
            if busy:
                self._log("skip", reason="locked", trigger="maintenance", detail=busy)
                return [f"{busy}; the store was not optimized; try again in a moment"]
            report = self.store.maintain(keep_s, stop=stop)
        self._log("maintenance", trigger=trigger, keep_s=keep_s, seconds=report["seconds"],
                  versions=report["versions"], fragments=report["fragments"], bytes=report["bytes"],
                  errors=report["errors"], stopped=report["stopped"])
        v, f, b = report["versions"], report["fragments"], report["bytes"]
        line = (f"store optimized in {report['seconds']:.1f} s: versions {v[0]:,} → {v[1]:,}, fragments {f[0]:,} → "
                f"{f[1]:,}" + (f", on disk {b[0] / 1e6:.1f} → {b[1] / 1e6:.1f} MB" if b[0] else ""))
        return [line] + [f"table {name} was left as it was: {why}" for name, why in report["errors"].items()]

    def _quiet_maintenance(self, stop: Callable[[], bool]) -> None:
        """What `quiet.Quiet` runs: the fold of every table, keeping `QUIET_KEEP_S` of versions for
        readers in other kernels; nothing when a turn is already waiting."""
        if not stop():
            self.optimize(QUIET_KEEP_S, trigger="quiet", stop=stop)

    # -- fork --------------------------------------------------------------------------------
    def fork(self, name: str, focus: str = "") -> Session:
        """A new session `name` whose history starts with one segment summarising this one (with
        `focus` for the summary), plus this one's knowledge slot and the classifications of its
        user messages (quoted, documents, own words); the user-verbatim and fact tracks follow from
        the inherited events as in any compacted session. The inherited events are copied under
        their uids, so `recall_history` in the fork returns this session's originals word for word;
        the fork records its parent and the covered range. This session is untouched.

        The parent is recorded first; a fork interrupted before its segment (a failure, the user
        stopping the cell) is finished by the next `fork` to the same name from the same parent."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise InputError(f"cannot fork to {name!r}: a session name is 1-64 letters, digits, '.', '_' or '-'")
        with self._lock:
            self._catch_up()
            if not self._events:
                raise InputError(f"session {self.name!r} is empty: there is nothing to fork yet")
            if name == self.name:
                raise InputError(f"session {name!r} exists already; fork to a new name (%mfs sessions lists them)")
            events = list(self._events)
            resuming = False
            if name in self.store.sessions():
                old = self.store.load_meta(name).get("anchor") or {}
                parent = old.get("parent") or {}
                resuming = parent.get("session") == self.name and parent.get("segment") is None
                if not resuming:
                    raise InputError(f"session {name!r} exists already; fork to a new name (%mfs sessions lists them)")
                events = [e for e in events if e.uid <= int(parent["uid_to"])]
            child = Session(name, store=self.store, llm=self._injected_llm, **self._saved)
            if child.events and not resuming or child.segments:  # another kernel made it meanwhile
                raise InputError(f"session {name!r} exists already; fork to a new name")
            child.parent = {"session": self.name, "uid_from": events[0].uid, "uid_to": events[-1].uid,
                            "segment": None, "at": now_iso(), "focus": focus}
            child._save_meta()
            if not child.events:
                child.store.append_events([replace(e, session=name) for e in events], child._writer)
                child._events = child.store.load_events(name)
            self._copy_verdicts(child, events[-1].uid)
            if self.knowledge.entries and not child.knowledge.entries:
                row = {"set": [{"key": e.key, "value": e.value, "by": e.by} for e in self.knowledge.entries.values()],
                       "evicted": [], "changed": list(self.knowledge.entries), "tokens": self.knowledge.tokens(),
                       "budget": child.knowledge_budget(), "entries": len(self.knowledge.entries),
                       "language": self.knowledge.language}
                child._log("knowledge", by="fork", cache_miss_tokens=0, **row)
                child.knowledge.apply(row)
            # what this session's segments say stands for the history the summarizer cannot read at once
            earlier = "\n\n".join(x.render() for x in self.compactor.segments)
            segment, notices = child.compactor.cover(child._events, "fork", focus, earlier=earlier)
            if segment is None:
                raise MfsError(f"the fork {name!r} has its history but not its summary ({'; '.join(notices)}); "
                               f"run the same fork again to finish it")
            child.parent = {**child.parent, "segment": segment.id}
            child._log("forked", **child.parent)
            child._save_meta()
            self._log("fork", child=name, uid_to=events[-1].uid)
            child.fork_notices = notices
            return child

    def _copy_verdicts(self, child: Session, upto: int) -> None:
        """The fork inherits how this session classified each user message (a pasted AI reply stays
        quoted); the ones not classified yet the fork classifies itself, as this session would."""
        from .track import _row

        models = {uid: d.get("model", "") for uid, d in self.store.load_verdicts(self.name).items()}
        verdicts = dict(self.verbatim.verdicts)  # the index thread may add to it meanwhile
        said = {e.uid: e.content for e in self._events if e.uid in verdicts}
        rows = [_row(uid, v, models.get(uid, ""), said.get(uid)) for uid, v in verdicts.items() if uid <= upto]
        if rows:
            child.store.save_verdicts(child.name, rows)
            for uid, v in verdicts.items():
                if uid <= upto:
                    child.verbatim.verdicts.setdefault(uid, v)

    # -- the knowledge slot (knowledge.py) ---------------------------------------------------
    def knowledge_budget(self) -> int:
        return int(self.settings.knowledge_share * self.profile().effective)

    def pin(self, key: str | dict[str, Any], value: Any = None, *, by: str = "user") -> list[str]:
        """Keep `key = value` (or every pair of a dict) in the knowledge slot, word for word, never
        compacted. Setting a key again replaces its value in place. When the slot would pass its budget
        the entries written longest ago leave; the notices say which. One ledger row per call."""
        items = dict(key) if isinstance(key, dict) else {key: value}
        with self._lock:
            if not self.settings.knowledge_share:
                raise InputError("the knowledge slot is off (knowledge_share=0); turn it on with "
                                 "%mfs config knowledge_share=0.05")
            row = self.knowledge.plan_set(items, by, self.knowledge_budget())
            return self._write_knowledge(row, by)

    def unpin(self, *keys: str, by: str = "user") -> list[str]:
        """Remove keys from the knowledge slot (one ledger row)."""
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

    # -- projection and pressure -----------------------------------------------------------
    def _count(self, message: dict[str, Any], uid: int | None, form: str = "full") -> int:
        """Estimated tokens of one payload message; (uid, form) identifies its bytes, so it is cached."""
        if uid is None and form == "full":
            return message_tokens(message)
        key = (uid if uid is not None else -1, form)  # segments and notes are keyed by their form
        cached = self._token_cache.get(key)
        if cached is None:
            cached = self._token_cache[key] = message_tokens(message)
        return cached

    def send_view(self, clearing: Clearing | None = None) -> SendView:
        """The exact payload the next model call would receive, and its layers."""
        state = clearing or self.clearing_state()
        # only the view in force uses the cache; trial views (S2 options) are projected in full
        cache = self._raw_cache if clearing is None else None
        track = self.track()
        return project(self._events, self._system(), self._count, state, self.compactor.segments,
                       self.compactor.evicted, cache, track, self.fact_track(track, state),
                       self.knowledge.text() if self.settings.knowledge_share else None)

    def fact_track(self, track: Any = None, clearing: Clearing | None = None) -> FactTrack | None:
        """The working set and fact lines of history the payload no longer shows as it was: text
        lines of the compacted range, tool lines (files touched, commands run, errors seen) of the
        compacted range and of the range whose tool results and arguments S2 cleared; less what a
        segment in the payload or the user-verbatim track shows; within `fact_share`. Changes only
        at compaction and clearing events (both already change the payload's structure)."""
        upto = self.compactor.covered_to
        state = clearing or self.clearing_state()
        tool_upto = max(upto, max(state.clear_before, state.prune_before) - 1)
        budget = int(self.settings.fact_share * self.profile().effective)
        segments = self.compactor.segments
        kept = tuple(track.kept) if track is not None else ()
        key = (upto, tool_upto, tuple(x.id for x in segments), budget, kept)
        if self._fact_cache is not None and self._fact_cache[0] == key:
            return self._fact_cache[1]
        built = None
        if (upto or tool_upto > 0) and budget:
            built = fact_track(self._events, upto, tool_upto, kept, budget, "\n".join(x.render() for x in segments))
        self._fact_cache = (key, built)
        return built

    def track(self) -> Any:
        """The user-verbatim track in force: user messages the segments cover, within its budget."""
        budget = int(self.settings.verbatim_share * self.profile().effective)
        return self.verbatim.build(self.compactor.covered_to, budget)

    def clearing_state(self) -> Clearing:
        """Where S2 acts in the send view now: trim size from the window, boundaries from the ledger."""
        if not self.settings.tool_clearing:
            return Clearing()
        return Clearing(clearing.trim_chars(self.profile().effective), self._clear_before, self._prune_before)

    def token_counts(self, view: SendView) -> list[int]:
        """Estimated tokens of each message of a payload (cached per uid and form)."""
        if view.counts is None:
            forms = view.forms or ["full"] * len(view.messages)
            view.counts = [self._count(m, u, f) for m, u, f in zip(view.messages, view.uids, forms)]
        return view.counts

    def usage(self, view: SendView | None = None) -> Usage:
        """Context pressure: the number the meter shows and the tiers act on."""
        view = view or self.send_view()
        profile = self.profile()
        tokens, source = self._meter.pressure(view, self.token_counts(view), self._tool_schema_tokens())
        cache = written = None
        last = self._last_provider_usage
        if last and (last.get("cached_tokens") or last.get("cache_write_tokens")):
            prompt = last["prompt_tokens"] or 1
            cache = last.get("cached_tokens", 0) / prompt
            written = last.get("cache_write_tokens", 0) / prompt or None
        return Usage(tokens, profile.window_tokens, profile.effective, profile.tier(tokens), source, self.name,
                     cache, self._last_prefix_ratio, cache_write_ratio=written)

    @property
    def calibration(self) -> float:
        """The calibration factor k applied to token estimates (1.0 until a provider reports usage)."""
        return self._meter.k

    def observe_usage(self, view: SendView, usage: dict[str, int] | None, model: str = "") -> list[str]:
        """Anchor on a provider's usage for the payload `view`; returns notices (calibration)."""
        if not usage:
            return []
        note = self._meter.observe(view, self.token_counts(view), usage, self._tool_schema_tokens())
        self._last_provider_usage = usage  # saved with the session at the end of the turn
        if self.history:  # this call's row: what the provider read from its cache and wrote to it
            self.history[-1].update(prompt_tokens=usage.get("prompt_tokens", 0),
                                    cache_read=usage.get("cached_tokens", 0),
                                    cache_write=usage.get("cache_write_tokens", 0),
                                    completion_tokens=usage.get("completion_tokens", 0), model=model)
        if note:
            self._log("calibration", k=round(self._meter.k, 4), note=note)
            return [note]
        return []

    def prepare_call(self) -> CallPlan:
        """What the memory layer does before a model call: project, measure, act on the tier.

        The tier comes from the same `Usage` the status line shows (docs/architecture.md, "Token
        accounting and the compaction tiers")."""
        view = self.send_view()
        usage = self.usage(view)
        notices: list[str] = list(self.compactor.recovered) + self.verbatim.notices
        self.compactor.recovered.clear()
        self.verbatim.notices.clear()
        cleared: list[str] = []
        if self.settings.tool_clearing and TIERS.index(usage.tier) >= TIERS.index("warn"):
            tier = usage.tier
            view, usage, cleared = self._clear_tool_results(view, usage)
            notices += cleared
        if self.settings.auto_compaction:
            sync = not self.settings.background_compaction
            acted = self.compactor.on_tier(usage.tier, synchronous_background=sync, effective=usage.effective)
            if cleared and not acted:
                # the clearing has already paid the cache miss from the history layers on, where a new
                # segment would go: a compaction ready now costs nothing more (one reset, not two)
                acted = self.compactor.piggyback(tier, sync, usage.effective)
            if acted:
                notices += acted
                view = self.send_view()
                usage = self.usage(view)
                compacted = self.compactor.last_compaction_call == self.compactor.calls  # not a skip notice
                if compacted and self.settings.tool_clearing and not cleared:  # clear what the miss paid for
                    view, usage, cleared = self._clear_tool_results(view, usage, min_gain=0.0)
                    notices += cleared
        notices += self._act_on_tier(usage)
        entry = {"call": (self.history[-1]["call"] + 1) if self.history else 1, "turn": self.turn,
                 "tokens": usage.tokens, "tier": usage.tier, "acted": bool(notices), "at": now_iso()}
        self.history.append(entry)
        if len(self.history) > 2 * HISTORY:
            del self.history[:-HISTORY]  # memory does not grow with the number of calls
        if len(self._calls_pending) >= CALLS_BATCH:
            self._flush_calls()  # before this call's row, which the provider's usage completes after the reply
        self._calls_pending.append(entry)
        self._last_prefix_ratio = self._prefix_ratio(view)
        self._last_payload = view.messages
        self.last_plan = CallPlan(view, usage, notices)
        return self.last_plan

    def _clear_tool_results(self, view: SendView, usage: Usage,
                            min_gain: float = clearing.MIN_GAIN) -> tuple[SendView, Usage, list[str]]:
        """S2 at the warn line: clear old tool results (and, if still needed, long old arguments)
        in one go, only forward, and only when it frees enough to be worth a cache miss (`min_gain`
        of the usable window; any gain right after a compaction, which has paid the miss already)."""
        starts = clearing.rounds(self._events)
        if not starts:
            return view, usage, []
        current = self.clearing_state()
        keep = [starts[-n] for n in (clearing.KEEP_ROUNDS, 1) if len(starts) >= n]
        options = [(keep[0], current.prune_before), (keep[0], keep[0])] + ([(keep[1], keep[1])] if len(keep) > 1 else [])
        target = (self.profile().warn - clearing.HEADROOM) * usage.effective
        best: tuple[Clearing, SendView, Usage] | None = None
        for clear_before, prune_before in options:
            option = replace(current, clear_before=max(current.clear_before, clear_before),
                             prune_before=max(current.prune_before, prune_before))
            if option == current:
                continue
            new_view = self.send_view(option)
            best = (option, new_view, self.usage(new_view))
            if best[2].tokens < target:
                break
        if best is None or (gain := usage.tokens - best[2].tokens) <= 0 or gain < min_gain * usage.effective:
            return view, usage, []
        option, new_view, new_usage = best
        self._clear_before, self._prune_before = option.clear_before, option.prune_before
        before, after = view.clearing, new_view.clearing
        cleared = after.cleared - before.cleared
        chars = after.chars_saved - before.chars_saved
        self._log("clearing", tier=usage.tier, tokens_before=usage.tokens, tokens_after=new_usage.tokens,
                  cleared=cleared, trimmed=after.trimmed, pruned=after.pruned - before.pruned, chars_saved=chars,
                  tokens_saved=usage.tokens - new_usage.tokens, clear_before=option.clear_before,
                  prune_before=option.prune_before)
        text = f"cleared {cleared} old tool result{'s' if cleared != 1 else ''} (−{human(chars)} chars)"
        if after.pruned > before.pruned:
            text += f" and stubbed the long arguments of {after.pruned - before.pruned} old tool calls"
        return new_view, new_usage, [text]

    def compact(self, focus: str = "") -> list[str]:
        """Compact now (`%compact [focus]`): the same path as the automatic one. Returns notices;
        "nothing to compact" when there is nothing."""
        with self._lock:
            return self.compactor.compact(self.usage().tier, "manual", focus, manual=True)

    def undo_compaction(self) -> list[str]:
        """Retract the newest segment (`%compact --undo`), append-only; notices say what happened."""
        with self._lock:
            return self.compactor.undo()

    def compact_preview(self, focus: str = "") -> dict[str, Any]:
        """What `compact(focus)` would do now, committing nothing (`%compact --preview`): the range,
        the segment text, payload tokens before and after, and the tokens the next call would read
        again because the cached prefix ends where the segment goes. The summary is really made
        (one LLM call, in the ledger as a `preview` row); nothing is declared."""
        from .segments import build

        with self._lock:
            now = self.send_view()
            before = self.usage(now)
            events, why = self.compactor.choose(before.effective, small_ok=True)
            if not events:
                return {"nothing": (why or "nothing raw").replace("_", " ")}
            prose, info = self.compactor.summarize(events, before.effective, focus)
            segment = build(self.compactor.seq + 1, events, prose, before.effective)
            # the trial segment is in force for one projection; what other threads read of the
            # session (Host.segments: the indexer, search) leaves it out
            with self.compactor.trying(segment):
                then = self.send_view()
            shared = shared_prefix_tokens(now.messages, then.messages, self.token_counts(now).__getitem__)
            out = {"uid_from": segment.uid_from, "uid_to": segment.uid_to, "messages": len(events),
                   "tokens_before": before.tokens, "tokens_after": self.usage(then).tokens,
                   "cache_miss_tokens": max(before.tokens - shared, 0), "segment_tokens": segment.tokens,
                   "degraded": segment.degraded, "llm_tokens": info.get("llm_tokens", 0),
                   "error": info.get("error"), "focus": focus}
            out["would_commit"] = out["tokens_after"] < out["tokens_before"]  # as compact() decides
            self._log("preview", **out)
            return out | {"segment_text": segment.render()}

    @property
    def segments(self) -> list[Segment]:
        """Committed segments still in the payload, oldest first."""
        return list(self.compactor.segments)

    def coverage(self) -> dict[str, int]:
        """Every uid is raw in the payload, inside a segment, or in an evicted (recorded) range."""
        view = self.send_view()
        raw = view.raw_uids()
        spans = [(x.uid_from, x.uid_to) for x in self.compactor.segments] + list(self.compactor.evicted)
        in_segments = sum(1 for e in self._events if e.uid not in raw and any(a <= e.uid <= b for a, b in spans))
        total = len(self._events)
        return {"uids_total": total, "raw": len(raw), "in_segments": in_segments,
                "lost": total - len(raw) - in_segments}

    def _act_on_tier(self, usage: Usage) -> list[str]:
        """Says where the context stands, once per tier change (the ledger keeps a row)."""
        previous, self._last_tier = self._last_tier, usage.tier
        if usage.tier == previous or usage.tier == "ok" or TIERS.index(usage.tier) < TIERS.index(previous):
            return []
        language = self.language()
        text = lang.text("tier", language, share=usage.percent, tier=tier_label(usage.tier, language,
                                                                             usage.tokens >= usage.effective))
        if usage.tier == "hard" and not self.settings.auto_compaction:
            text += "; automatic compaction is off: run %compact, or start a fresh session with %mfs new NAME"
        self._log("tier", tier=usage.tier, tokens=usage.tokens, effective=usage.effective)
        return [text]

    def _prefix_ratio(self, view: SendView) -> float | None:
        if self._last_payload is None:
            return None
        counts = self.token_counts(view)
        shared = shared_prefix_tokens(self._last_payload, view.messages, counts.__getitem__)
        return shared / max(view.tokens, 1)

    # -- a turn ----------------------------------------------------------------------------
    def chat(self, text: str | bytes = "", *, quote: bool = False, docs: Sequence[str | os.PathLike[str]] = (),
             own: bool = False, on_delta: Callable[[str], None] | None = None,
             on_reset: Callable[[], None] | None = None, stream: bool = True, origin: str = "user") -> Reply:
        """Send one user message, run the tool loop, return the reply. Each event is saved at once.

        Explicit channels for the user-verbatim track: `quote` (the text is pasted AI output; what
        follows a `---` line is the user's own note), `docs` (files attached as content-addressed
        snapshots), `own` (own words, whatever their length). A long paste that looks like a
        document becomes a snapshot on its own, and the reply says so."""
        notices: list[str] = []
        attached = [read_document(p) for p in docs]  # every file is checked before anything is written
        if attached and (text is None or (isinstance(text, str) and not text.strip())):
            text = ""
        else:
            text = self._check_message(text)
        self._quiet.turn_started()
        try:
            return self._chat_locked(text, quote, attached, own, notices, origin, stream, on_delta, on_reset)
        finally:
            self._quiet.turn_ended()

    def _chat_locked(self, text: str, quote: bool, attached: list[tuple[str, str]], own: bool, notices: list[str],
                     origin: str, stream: bool, on_delta: Callable[[str], None] | None,
                     on_reset: Callable[[], None] | None) -> Reply:
        with self._lock:
            missing = missing_key(self.settings.model, self.settings.api_base) if self._injected_llm is None else None
            if missing:
                raise ConfigError(
                    f"{self.settings.model} needs {missing} in the environment (keys are never saved); "
                    "set it and re-run, or use `%mfs config model=mfs-offline/default`"
                )
            before = self._last_recorded
            try:
                return self._turn(text, quote, attached, own, notices, origin, stream, on_delta, on_reset)
            except StoreError as exc:  # the store went away mid-turn: say what is known to be kept
                raise type(exc)(f"{exc}; {self._kept_since(before)}") from exc

    def _turn(self, text: str, quote: bool, attached: list[tuple[str, str]], own: bool, notices: list[str],
              origin: str, stream: bool, on_delta: Callable[[str], None] | None,
              on_reset: Callable[[], None] | None) -> Reply:
        """The body of `chat`, under its lock: the user's message, the tool loop, the state row."""
        user = self.record_user(text, quote=quote, attached=attached, own=own, notices=notices, origin=origin)
        uids = [user.uid]
        schemas = self._tool_schemas()
        completion: Completion | None = None
        for round_no in range(self.settings.max_tool_rounds + 1):
            plan = self.prepare_call()
            notices.extend(plan.notices)
            last_round = round_no == self.settings.max_tool_rounds
            try:
                completion, sent = self._call_with_ptl_retry(plan, None if last_round else (schemas or None),
                                                             stream, on_delta, on_reset, notices)
            except MfsError as exc:
                self._log("failure", tier=plan.usage.tier, error=redact(str(exc)), uid=user.uid)
                raise
            notices.extend(self.observe_usage(sent, completion.usage, completion.model))
            assistant = self.record("assistant", completion.text, tool_calls=completion.tool_calls or None)
            uids.append(assistant.uid)
            if not completion.tool_calls:
                break
            for call in completion.tool_calls:
                fn = call.get("function") or {}
                try:
                    result = call_tool(self._offered(), fn.get("name", ""), fn.get("arguments", ""))
                except Exception as exc:  # pairing never breaks: every call gets a result event
                    result = f"error: the tool call could not be executed ({type(exc).__name__})"
                event = self.record("tool", result, tool_call_id=call["id"], name=fn.get("name", ""))
                uids.append(event.uid)
        assert completion is not None
        try:
            self._save_meta()  # once per turn: the anchor and the uid high-water mark
        except StoreError as exc:  # the turn itself is saved; the state row is written again next turn
            notices.append(f"the session's state row was not saved ({exc}); this turn's events are, and "
                           "the state is written again with the next turn")
        now = self.send_view()
        after = self.usage(now)
        ahead = self.compaction_ahead(after, now)
        if ahead:
            notices.append(ahead)
        # the status line shows the context now and, when it differs, the share the last request was
        # sent at: the number the tier notice and the note to the model gave
        after = replace(after, sent_tokens=plan.usage.tokens)
        return Reply(completion.text, after, completion.usage, notices, uids, completion.endpoint)

    def _kept_since(self, before: Event | None) -> str:
        """What a turn that failed on the store had saved: nothing, the user's message, or more."""
        last = self._last_recorded
        if last is before or last is None:
            return ("nothing of this turn is confirmed saved (your message is still in the cell): re-run it when the "
                    "store is reachable")
        if last.role == "user":
            return f"your message was saved as uid {last.uid}, the reply was not: re-run the cell to ask again"
        return (f"your message and part of the reply were saved (up to uid {last.uid}), the rest was not: re-run "
                "the cell to ask again")

    def budget_note(self, usage: Usage) -> str:
        """The model's own view of its budget (`show_budget`): one line at the tail of the request."""
        return lang.text("budget_note", self.language(), share=usage.percent,
                         line=f"{self.profile().compress:.0%}")

    def language(self) -> str | None:
        """The conversation's language as the user's recent messages show it (lang.py)."""
        last = self.last_uid
        if self._language is None or self._language[0] != last:
            recent = [e for e in self._events[-400:] if e.role == "user"][-40:]
            self._language = (last, lang.conversation_language(recent))
        return self._language[1]

    def sent_messages(self, view: SendView, usage: Usage) -> list[dict[str, Any]]:
        """What goes to the provider for `view`: its messages, and with `show_budget` the budget note
        appended to the last one only. The note is never in the log and never in an earlier message,
        so the prefix the provider cached on the previous call is untouched by it."""
        if not self.settings.show_budget or not view.messages:
            return view.messages
        last = view.messages[-1]
        if not isinstance(last.get("content"), str) or last.get("role") not in ("user", "tool"):
            return view.messages
        note = self.budget_note(usage)
        return [*view.messages[:-1], {**last, "content": (last["content"] + "\n\n" + note) if last["content"]
                                      else note}]

    def compaction_ahead(self, usage: Usage, view: SendView | None = None) -> str | None:
        """A warning ahead of an automatic compaction: when the next call would pass the compaction line
        if the context grew as much as in this call, the uids it would compact (the background
        result's, when one is ready or under way, else the range the compactor would choose now).
        The commit waits for the background summary, so it may come a few replies later."""
        if not self.settings.auto_compaction or usage.tier in ("compress", "hard") or len(self.history) < 1:
            return None
        # the growth from one call to the next (the last user message and reply); with one call
        # only, what this call's reply added
        growth = (int(self.history[-1]["tokens"]) - int(self.history[-2]["tokens"]) if len(self.history) > 1
                  else usage.tokens - int(self.history[-1]["tokens"]))
        growth = max(growth, usage.tokens - int(self.history[-1]["tokens"]), 0)
        line = self.profile().compress * usage.effective
        if usage.tokens + growth < line:
            return None
        pending = self.compactor.pending
        events = pending.events if pending is not None else self.compactor.choose(usage.effective)[0]
        if not events:
            return None
        return lang.text("ahead", self.language(), share=usage.percent,
                         line=f"{self.profile().compress:.0%}", a=events[0].uid, b=events[-1].uid) + self._miss_cost(view)

    def _miss_cost(self, view: SendView | None = None) -> str:
        """What the coming compaction's cache miss costs: the payload after the summaries (the fact and
        verbatim tracks, the raw tail) is sent again past the cache — in tokens, and in dollars at the
        chat model's cache-write and cache-read rates where they are known."""
        miss = sum(x.tokens for x in (view or self.send_view()).layers if x.kind in ("facts", "verbatim", "raw"))
        weight = self.miss_weight()
        if weight is None or miss <= 0:
            return lang.text("ahead_miss", self.language(), tokens=f"{miss:,}")
        from .cost import price

        rates = price(self.settings.model) or {"write": 0.0, "read": 0.0}
        dollars = miss * max(rates["write"] - rates["read"], 0.0)
        return lang.text("ahead_miss_priced", self.language(), tokens=f"{miss:,}", dollars=f"${dollars:.4f}",
                         model=self.settings.model)

    def _call_with_ptl_retry(self, plan: CallPlan, tools: list[dict[str, Any]] | None, stream: bool,
                             on_delta: Callable[[str], None] | None, on_reset: Callable[[], None] | None,
                             notices: list[str]) -> tuple[Completion, SendView]:
        """Prompt-too-long: drop the oldest rounds of this request only (the log keeps them) until the
        gap the provider named is covered, else 20 % of the rounds; at most 3 tries."""
        view = plan.view
        for attempt in range(PTL_TRIES + 1):
            try:
                return self._complete(view, self.sent_messages(view, plan.usage), tools, stream, on_delta,
                                      on_reset, notices), view
            except PromptTooLong as exc:
                if attempt == PTL_TRIES:
                    raise PromptTooLong(f"the request is still too long after {PTL_TRIES} retries ({exc}); "
                                        "run %compact or start a fresh session with %mfs new NAME") from None
                starts = {e.uid for e in self._events if e.turn_start}
                smaller = drop_oldest_rounds(view, self.token_counts(view), starts, exc.gap_tokens)
                if smaller is None:
                    raise
                dropped = smaller.layers[1] if len(smaller.layers) > 1 else None
                self._log("ptl_retry", attempt=attempt + 1, gap_tokens=exc.gap_tokens,
                          dropped_from=dropped.uid_from if dropped else None, dropped_to=dropped.uid_to if dropped else None)
                notices.append(f"the provider said the request was too long; retried without the oldest rounds "
                               f"(uids {dropped.uid_from}–{dropped.uid_to}, still recallable)" if dropped else
                               "the provider said the request was too long; retried with fewer rounds")
                view = smaller
        raise AssertionError("unreachable")

    def _complete(self, view: SendView, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  stream: bool, on_delta: Callable[[str], None] | None, on_reset: Callable[[], None] | None,
                  notices: list[str]) -> Completion:
        """One request. The litellm client is also told where the payload's stable points are, and
        applies each endpoint's cache rules to them (`prompt_cache`); an injected model gets the bare call."""
        if not (self.settings.prompt_cache and isinstance(self.llm, LLM)):
            return self.llm.complete(messages, tools=tools, stream=stream, on_delta=on_delta, on_reset=on_reset)
        last = view.messages[-1].get("content") if view.messages else None
        note = messages[-1]["content"][len(last):] if messages is not view.messages and isinstance(last, str) else ""
        hints = hints_for(view.layers, len(messages), note, self._cache_key, self._cache_anchor, view.messages)
        try:
            completion = self.llm.complete(messages, tools=tools, stream=stream, on_delta=on_delta,
                                           on_reset=on_reset, cache=hints)
        finally:
            notices.extend(self.llm.take_notes())
        if hints.anchor is not None:  # the next call may mark this anchor again if all before it is unchanged
            self._cache_anchor = (hints.anchor, fingerprint(view.messages, hints.anchor))
        return completion

    def record_user(self, text: str, *, quote: bool = False, attached: Sequence[tuple[str, str]] = (),
                    own: bool = False, notices: list[str] | None = None, origin: str = "user") -> Event:
        """Record one user message through its channel: attachments become snapshots and, with
        `--quote`, `--own` or a pasted document, the verbatim track gets its explicit verdict."""
        notices = notices if notices is not None else []
        content, verdict = self._channel(text, quote, list(attached), own, notices)
        if attached:
            self._check_size(content, "the message with its attachments")
        user = self.record("user", content, origin=origin, new_turn=True)
        if verdict is not None:
            self.verbatim.add(user.uid, verdict, message=user.content)
        return user

    def _channel(self, text: str, quote: bool, attached: list[tuple[str, str]], own: bool,
                 notices: list[str]) -> tuple[str, Verdict | None]:
        """The content to record and the explicit verdict of the user's chosen channel (if any).
        Checks come first: nothing is written when the channel cannot be used."""
        if quote and own:
            raise InputError("a message is either --quote or --own, not both")
        if quote and not split_quote(text)[0]:
            raise InputError("--quote: nothing to quote above the --- line; paste the AI output first")
        files = self.store.files
        if attached:
            budget = int(self.profile().effective * MAX_MESSAGE_SHARE) - estimate_tokens(text) - 200
            blocks, snaps = [], []
            for name, body in attached:
                snap = snapshots.write(files, body, name)
                snaps.append(snap.to_json())
                inline = body
                size = estimate_tokens(body)
                if size > budget:
                    inline = body[:max(0, int(len(body) * budget / size * 0.95))]
                    inline += (f"\n[truncated: {len(inline):,} of {len(body):,} chars are inline; the snapshot "
                               f"{snap.path} holds all of it]")
                    notices.append(f"{name} is larger than the window allows; the model sees its first "
                                   f"{len(inline):,} chars, the snapshot keeps all {len(body):,}")
                budget -= estimate_tokens(inline)
                blocks.append(f"[attached document {snap.path} ({snap.chars:,} chars)]\n{inline}\n[end of {snap.path}]")
            content = "\n\n".join(([text] if text.strip() else []) + blocks)
            return content, Verdict(DOCUMENT, "explicit", text, None, 0.0, len(content), first_line(text or blocks[0]),
                                    tuple(snaps))
        if own:
            return text, Verdict(OWN, "explicit", text, None, 0.0, len(text), first_line(text))
        recent = replies_before(self._events, self.last_uid + 1, RECENT)
        if quote:
            pasted, note = split_quote(text)
            source = best_overlap(pasted, recent)
            kind = QUOTE_NOTE if note else QUOTE
            return text, Verdict(kind, "explicit", text if note else "", source, 0.0, len(text), first_line(pasted))
        if looks_like_document(text) and best_overlap(text, recent) is None:
            snap = snapshots.write(files, text, "paste")
            notices.append(f"your {len(text):,}-char paste looks like a document: it is saved as {snap.path}; once it "
                           "leaves the recent tail the model keeps a pointer to it (use --own if these are your own words)")
            return text, Verdict(DOCUMENT, "explicit", "", None, 0.0, len(text), snap.first_line, (snap.to_json(),))
        return text, None

    def _check_size(self, text: str, what: str, hint: str = "") -> None:
        limit = int(self.profile().effective * MAX_MESSAGE_SHARE)
        size = estimate_tokens(text)
        if size > limit:
            raise InputError(f"{what} is about {size:,} tokens ({len(text):,} chars), more than half of the "
                             f"{self.profile().effective:,}-token usable window; shorten or split it{hint}")

    def _check_message(self, text: str | bytes) -> str:
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"the message is not UTF-8 text (bad byte at position {exc.start}); "
                                 "paste text, not binary data") from None
        if not isinstance(text, str):
            raise InputError(f"a message must be text, not {type(text).__name__}")
        if not text.strip():
            raise InputError("the message is empty: write something under %%chat")
        if "\x00" in text:
            raise InputError("the message contains NUL bytes, which looks like binary data; paste text instead")
        bad = [i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"]
        if bad:  # undecodable bytes smuggled in as lone surrogates: refused like the bytes themselves
            raise InputError(f"the message is not valid text ({len(bad)} undecodable character"
                             f"{'s' if len(bad) != 1 else ''}, the first at position {bad[0]}); "
                             "decode the source as UTF-8 (or with errors='replace') and paste it again")
        limit = int(self.profile().effective * MAX_MESSAGE_SHARE)
        if estimate_tokens(text) > limit:
            self._check_size(text, "the message", hint="; to send a long text whole, save it to a file and attach it "
                                                       "with %%chat --doc PATH (Session.chat(docs=[PATH]))")
        return text

    # -- ledger and persistence ------------------------------------------------------------
    def _log(self, kind: str, **data: Any) -> dict[str, Any]:
        # its own lock: the background compaction logs from its thread while a turn holds _lock
        with self._ledger_lock:
            self._ledger_seq += 1
            seq = self._ledger_seq
        return self.store.append_ledger(self.name, seq, kind, data, self._writer)

    def cost(self) -> dict[str, Any]:
        """What this session's calls cost, priced with litellm's local cost map (`cost.session_cost`):
        the chat's and the summarizer's apart, in dollars and tokens (input, read from the cache,
        written to it, output), and what the same calls would have cost with no cache."""
        from .cost import session_cost

        self._flush_calls()
        calls = self.store.load_calls(self.name, 10**9)
        summaries = [r for r in self.ledger() if r.get("kind") == "summarizer"]
        return session_cost(calls, summaries, self.settings.model)

    def miss_weight(self) -> float | None:
        """What a token of prompt-cache miss costs against a token less in the prefix, at the chat
        model's prices (`cost.miss_weight`); None where nothing is cached by our hints (the setting
        off, an injected model, an endpoint that refused them) or the price is not known."""
        if (not (self.settings.prompt_cache and isinstance(self.llm, LLM)) or is_offline(self.settings.model)
                or self.llm.no_cache):
            return None
        from .cost import miss_weight

        return miss_weight(self.settings.model)

    def ledger(self) -> list[dict[str, Any]]:
        """One row per memory-layer action and failure, oldest first."""
        return self.store.load_ledger(self.name)

    def close(self, wait_s: float = 10.0) -> None:
        """End this session's background work (the quiet-moment fold, the recall indexer) and write the
        waiting call rows, waiting up to `wait_s` for each, as before its store is deleted. Nothing is
        lost without it (the indexer resumes from its watermarks); the session can still be read."""
        self._quiet.close()
        self.indexer.close(wait_s)
        self._quiet.close(wait_s)
        self._flush_calls(wait_s)

    def _flush_calls(self, timeout: float | None = None) -> None:
        """Append the waiting call rows (a failed or timed-out write keeps them for the next batch)."""
        rows = list(self._calls_pending)
        if self.store.append_calls(self.name, rows, self._writer, timeout):
            del self._calls_pending[:len(rows)]

    def _save_meta(self, force: bool = False) -> None:
        """The session's state as one small row (settings, the usage anchor, the breaker, the parent,
        the uid high-water mark), written when it changed since this kernel wrote it (`force`: always,
        for changes another kernel's row must not hide). The call history is not in it."""
        anchor = {**self._meter.to_json(), "breaker": self._breaker, "parent": getattr(self, "parent", None),
                  "last_uid": max(self.last_uid, getattr(self, "_saved_last_uid", 0))}
        if getattr(self, "overrides", None):
            anchor["overrides"] = sorted(self.overrides)
        state = json.dumps([self._saved, anchor], sort_keys=True, default=str)
        if state == getattr(self, "_saved_state", None) and not force:
            return
        self.store.save_meta(self.name, settings=self._saved, anchor=anchor)
        self._saved_state = state

    def status(self) -> dict[str, Any]:
        """What `%mfs status` shows."""
        usage = self.usage()
        llm = self.llm
        return {
            "session": self.name,
            "store": self.store.shown,
            "model": self.settings.model,
            "events": len(self._events),
            "last_uid": self.last_uid,
            "turns": self.turn,
            "usage": usage.to_json(),
            "endpoint": llm.describe() if isinstance(llm, LLM) else type(llm).__name__,
            "summarizer": self.summarizer.describe() if isinstance(self.summarizer, LLM) else type(llm).__name__,
            "breaker": self.compactor.breaker_line(),
            "settings": self.settings.public(),
        }


_LIVE: weakref.WeakSet[Session] = weakref.WeakSet()


_EXIT_HOOK: list[bool] = []


def flush_at_exit(wait_s: float = 1.0) -> None:
    """Write the call rows every live session still holds. Not from a garbage-collection finalizer
    (it can run inside a store write of the same thread and wait for its own lock); a store another
    thread holds for `wait_s` is left alone, so a background write never hangs the exit."""
    for session in list(_LIVE):
        try:
            session._flush_calls(timeout=wait_s)
        except Exception:  # the rows are a chart's, never a message
            pass


def _register_exit_flush() -> None:
    """Once, after LanceDB is loaded: exit hooks run last-registered first, so this one writes while
    LanceDB's own runtime is still up (registered at import, it ran after it and crashed the exit)."""
    if not _EXIT_HOOK:
        _EXIT_HOOK.append(True)
        atexit.register(flush_at_exit)


def shared_prefix_tokens(before: list[dict[str, Any]], after: list[dict[str, Any]],
                         count: Callable[[int], int]) -> int:
    """Tokens of the longest common prefix of two payloads (whole messages, then characters)."""
    shared = 0
    for i, (a, b) in enumerate(zip(before, after)):
        if a is b or a == b:
            shared += count(i)
            continue
        if a.get("role") == b.get("role"):
            x, y = a.get("content") or "", b.get("content") or ""
            n = 0
            limit = min(len(x), len(y))
            while n < limit and x[n] == y[n]:
                n += 1
            shared += estimate_tokens(x[:n])
        break
    return shared

