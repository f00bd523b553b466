"""The session's ground floor: its log (record, catch up, ledger rows), its settings and model clients,
the tools it offers, its saved state row, and what it tells `%mfs status`."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import lang
from ..compaction import Compactor
from ..errors import ConfigError, StoreError
from ..events import Event, Retries, clean_text, now_iso
from ..layers.fact_track import FactTrack
from ..layers.knowledge import KnowledgeSlot
from ..layers.track import VerbatimTrack
from ..layers.view import RawCache
from ..models.llm import LLM, default_endpoints, is_offline, unknown_model
from ..recall.indexer import Indexer
from ..recall.tools import SHORT_BELOW, Tool
from ..settings import Settings
from ..store import Store, UidConflict
from ..store.quiet import Quiet
from ..window import budget
from ..window.meter import Meter
from ..window.tokens import message_tokens
from ..window.usage import ContextProfile
from .parts import (
    KNOWLEDGE_TOOLS,
    MAX_MESSAGE_SHARE,
    NOTEBOOK_TOOLS,
    WRITE_ATTEMPTS,
    CallPlan,
    ChatModel,
    profile_for,
    system_prompt,
    text_tokens,
    window_for,
)


def _check_models(new: Settings, values: dict[str, Any]) -> None:
    """A model named in `values` that litellm cannot route is refused where it is set, not on the next call."""
    for key, base in (("model", new.api_base), ("fallback_model", new.fallback_base_url)):
        if key in values and getattr(new, key) and (why := unknown_model(getattr(new, key), base)):
            raise ConfigError(why)


class SessionBase:
    """The state every part of a session reads, and the log they all append to."""

    # set by `Session.__init__`; every part reads them
    name: str
    store: Store
    settings: Settings
    history: list[dict[str, Any]]
    parent: dict[str, Any] | None
    overrides: set[str]
    fork_notices: list[str]
    copied: dict[str, Any] | None
    last_plan: CallPlan | None
    tools: dict[str, Tool]
    knowledge: KnowledgeSlot
    verbatim: VerbatimTrack
    compactor: Compactor
    indexer: Indexer
    _saved: dict[str, Any]
    _writer: str
    _lock: threading.RLock
    _ledger_lock: threading.Lock
    _events: list[Event]
    _meter: Meter
    _calls_pending: list[dict[str, Any]]
    _saved_state: str | None
    _breaker: dict[str, Any] | None
    _saved_last_uid: int
    _language: tuple[int, str | None] | None
    _ledger_seq: int
    _token_cache: dict[tuple[int, str], int]
    _last_recorded: Event | None
    _last_payload: list[dict[str, Any]] | None
    _last_prefix_ratio: float | None
    _last_provider_usage: dict[str, int] | None
    _last_tier: str
    _over_fill: str | None
    _injected_llm: ChatModel | None
    _llm: ChatModel | None
    _summarizer: ChatModel | None
    _window: int | None
    _cache_key: str
    _cache_anchor: tuple[int, str] | None
    _clear_before: int
    _prune_before: int
    _quiet: Quiet
    _raw_cache: RawCache
    _shown: set[int] | None  # in a turn's tool calls: the uids the model was sent whole
    _fact_cache: tuple[Any, FactTrack | None] | None
    _retries: Retries  # turns that failed and were asked again at once (`retried`)


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

    def _indexed(self, upto: int) -> None:
        """The recall index wrote vectors up to `upto` (in its thread): verdicts, and a quiet fold later."""
        self.verbatim.indexed(upto)
        self._quiet.turn_ended()

    def _catch_up(self) -> None:
        """Take the events other kernels appended since this one last read the log."""
        newer = self.store.load_events(self.name, uid_from=self.last_uid + 1)
        if newer:
            self._events = self._events + [e for e in newer if e.uid > self.last_uid]

    def check_writable(self) -> None:
        """Raise the store's one line when it is read-only here (`Store.read_only`): what writes asks first,
        so nothing is half done."""
        if self.store.read_only:
            raise StoreError(self.store.read_only_line())

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
        _check_models(self.settings.with_values(**values), values)  # may import litellm: not under the lock
        with self._lock:
            new = self.settings.with_values(**values)
            window = window_for(new)
            self._check_overhead(profile_for(window, new), new)
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
            self._window = window_for(self.settings)
        return self._window

    def profile(self) -> ContextProfile:
        """Window and tier thresholds of this session."""
        return profile_for(self.window, self.settings)

    def plan(self) -> budget.Plan:
        """The window's one budget: every standing layer's ceiling, the raw tail's floor (`budget.plan`)."""
        return budget.plan(self.profile().effective, self.settings)

    def _check_overhead(self, profile: ContextProfile, settings: Settings) -> None:
        overhead = message_tokens({"role": "system", "content": system_prompt(settings.system_prompt)})
        overhead += self._tool_schema_tokens(settings, profile.effective)
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

    def _tool_schemas(self, settings: Settings | None = None, effective: int | None = None) -> list[dict[str, Any]]:
        """The offered tools' schemas: their short forms below `SHORT_BELOW` usable tokens (`effective`,
        the session's own when None)."""
        short = (self.profile().effective if effective is None else effective) < SHORT_BELOW
        return [t.schema(short) for t in self._offered(settings).values()]

    def _tool_schema_tokens(self, settings: Settings | None = None, effective: int | None = None) -> int:
        schemas = self._tool_schemas(settings, effective)
        return text_tokens(json.dumps(schemas)) if schemas else 0

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
               tool_call_id: str = "", name: str = "", new_turn: bool = False, created_at: str = "") -> Event:
        """Append one event to the log and persist it before returning. Never rewrites anything.
        `created_at`: when it was said, for a message imported from elsewhere (default: now)."""
        self.check_writable()
        with self._lock:
            # a tool-only round (the model answering tool results) registers a turn start too,
            # so the cold range can be cut there without separating a call from its result
            if role == "assistant" and self._events and self._events[-1].role == "tool":
                new_turn = True
            for attempt in range(WRITE_ATTEMPTS):
                turn = self.turn + 1 if new_turn or not self._events else self.turn
                event = Event(
                    uid=self.last_uid + 1, session=self.name, turn=turn, role=role, content=clean_text(content),
                    origin=origin or role, tool_calls=tuple(tool_calls or ()), tool_call_id=tool_call_id,
                    name=name, turn_start=new_turn or not self._events, created_at=created_at or now_iso(),
                )
                begun = time.monotonic()
                try:
                    self.store.append_events([event], self._writer)
                except UidConflict:
                    if attempt == WRITE_ATTEMPTS - 1:
                        raise
                    # another kernel appended: take its events and the next uid, after a random pause that
                    # grows with the tries and with what a write costs here (ms locally, far more on S3)
                    took = time.monotonic() - begun
                    time.sleep(random.uniform(0, max(0.02, took) * min(attempt + 1, 8)))
                    self._catch_up()
                    continue
                self._events.append(event)
                self._last_recorded = event
                self.indexer.kick()  # the turn never waits for the index
                return event
            raise AssertionError("unreachable")

    def record_cells(self, records: Sequence[Any]) -> Event | None:
        """The notebook cells run since the last chat (`cells.CellRecord`s) as one event: a tool result
        of the notebook, which S2 clears and S3 compacts like any other (failed cells go to the fact
        track). Nothing is written when `cell_log` is off or there are no records."""
        from ..layers.cells import NAME, event_text

        if not records or not self.settings.cell_log:
            return None
        return self.record("tool", event_text(list(records)), name=NAME)

    # -- ledger and persistence ------------------------------------------------------------
    def _log(self, kind: str, **data: Any) -> dict[str, Any]:
        # its own lock: the background compaction logs from its thread while a turn holds _lock
        with self._ledger_lock:
            self._ledger_seq += 1
            seq = self._ledger_seq
        return self.store.append_ledger(self.name, seq, kind, data, self._writer)

    def ledger(self) -> list[dict[str, Any]]:
        """One row per memory-layer action and failure, oldest first."""
        return self.store.load_ledger(self.name)

    def _flush_calls(self, timeout: float | None = None) -> None:
        """Append the waiting call rows (a failed or timed-out write keeps them for the next batch)."""
        rows = list(self._calls_pending)
        if self.store.append_calls(self.name, rows, self._writer, timeout):
            del self._calls_pending[:len(rows)]

    def _save_meta(self, force: bool = False) -> None:
        """The session's state as one small row (settings, the usage anchor, the breaker, the parent,
        the uid high-water mark), written when it changed since this kernel wrote it (`force`: always,
        for changes another kernel's row must not hide). The call history is not in it. Nothing on a
        read-only store: a setting changed there holds in this process only."""
        if self.store.read_only:
            return
        anchor = {**self._meter.to_json(), "breaker": self._breaker, "parent": self.parent,
                  "last_uid": max(self.last_uid, self._saved_last_uid)}
        if self.overrides:
            anchor["overrides"] = sorted(self.overrides)
        state = json.dumps([self._saved, anchor], sort_keys=True, default=str)
        if state == self._saved_state and not force:
            return
        self.store.save_meta(self.name, settings=self._saved, anchor=anchor)
        self._saved_state = state

    def language(self) -> str | None:
        """The conversation's language as the user's recent messages show it (lang.py)."""
        last = self.last_uid
        if self._language is None or self._language[0] != last:
            recent = [e for e in self._events[-400:] if e.role == "user"][-40:]
            self._language = (last, lang.conversation_language(recent))
        return self._language[1]

    def cost(self) -> dict[str, Any]:
        """What this session's calls cost, priced with litellm's local cost map (`cost.session_cost`):
        the chat's and the summarizer's apart, in dollars and tokens (input, read from the cache,
        written to it, output), and what the same calls would have cost with no cache."""
        from ..models.cost import session_cost

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
        from ..models.cost import miss_weight

        return miss_weight(self.settings.model)

    def close(self, wait_s: float = 10.0) -> None:
        """End this session's background work (the quiet-moment fold, the recall indexer, a fold of the
        log under way) and write the waiting call rows, waiting up to `wait_s` for each, as before its
        store is deleted. Nothing is lost without it (the indexer resumes from its watermarks); the
        session can still be read."""
        self._quiet.close()
        self.indexer.close(wait_s)
        self._quiet.close(wait_s)
        self.store.settle(wait_s)
        self._flush_calls(wait_s)
