"""The `Session` itself: its construction (every part's state, the host its parts get) and one turn
(the user's message, the tool loop, the state row)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..compaction import Compactor
from ..errors import ConfigError, InputError, MfsError, StoreError
from ..events import Event, Retries, now_iso
from ..host import Host
from ..layers.fact_track import FactTrack
from ..layers.knowledge import (
    FORGET_DESCRIPTION,
    FORGET_SCHEMA,
    FORGET_SHORT,
    REMEMBER_DESCRIPTION,
    REMEMBER_SCHEMA,
    REMEMBER_SHORT,
    KnowledgeSlot,
)
from ..layers.snapshots import read_document
from ..layers.track import VerbatimTrack
from ..layers.view import RawCache
from ..models import offprocess
from ..models.llm import LLM, Completion, missing_key
from ..recall.indexer import Indexer
from ..recall.tools import (
    RECALL_DESCRIPTION,
    RECALL_SCHEMA,
    RECALL_SHORT,
    SEARCH_DESCRIPTION,
    SEARCH_SCHEMA,
    SEARCH_SHORT,
    Tool,
    call_tool,
)
from ..redaction import redact
from ..settings import Settings, from_environment, warm_up_enabled
from ..store import Store
from ..store.quiet import Quiet
from ..window.meter import Meter
from .memory import Memory
from .parts import HISTORY, LIVE, SESSION_NAME, CallPlan, ChatModel, Reply, profile_for, register_exit_flush


class Session(Memory):
    """A named conversation persisted in a store; re-opening the name resumes it exactly."""

    def __init__(self, name: str = "default", store: str | Store | None = None, model: str | None = None,
                 window_tokens: int | None = None, *, llm: ChatModel | None = None, transient: Sequence[str] = (),
                 read_only: bool = False, **settings: Any):
        if not isinstance(name, str) or not SESSION_NAME.match(name):
            raise ConfigError(f"session name {name!r} is invalid: use 1-64 letters, digits, '.', '_' or '-'")
        self.name = name
        if isinstance(store, Store) and (store.read_only or not read_only):
            self.store = store
        else:  # `read_only`: the store opened for reading, whatever this process may do there
            self.store = Store(store.uri if isinstance(store, Store) else store, read_only=read_only)
        meta = self.store.load_meta(name)
        if self.store.read_only and not meta and name not in self.store.sessions():
            names = self.store.sessions()
            listed = ", ".join(names[:12]) + (" …" if len(names) > 12 else "") if names else "none"
            raise InputError(f"there is no session {name!r} in the store at {self.store.shown}, which is read-only "
                             f"here, so it cannot be made; its sessions: {listed} (%mfs use NAME reads one)")
        explicit = {k: v for k, v in {"model": model, "window_tokens": window_tokens, **settings}.items()
                    if v is not None}
        saved = dict(meta.get("settings") or {})
        self.settings = Settings().with_values(**from_environment()).with_values(**saved).with_values(**explicit)
        # `transient` settings hold in this process only (an import runs without the background indexer);
        # the next process opens the session with the ones saved, the person's
        self._saved = {**saved, **{k: getattr(self.settings, k) for k in explicit if k not in transient}}
        self._writer = uuid.uuid4().hex
        self._lock = threading.RLock()
        self._turn_ended_at = 0.0  # time.monotonic when the last turn ended (`Host.turn_ended`)
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
        LIVE.add(self)  # what is left of the call rows is written when the interpreter exits
        register_exit_flush()
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
        self.copied: dict[str, Any] | None = None  # what `copy_to` carried here, on the copy it returns
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
        self._over_fill: str | None = None  # the last notice that the standing layers pass the fill
        self.last_plan: CallPlan | None = None
        self._injected_llm = llm
        self._llm: ChatModel | None = llm
        self._summarizer: ChatModel | None = None
        self._window: int | None = None
        # prompt caching (prompt_cache.py): one key per session, and the last call's anchor
        self._cache_key = "mfs-" + hashlib.sha256(f"{self.store.uri}\x1f{name}".encode()).hexdigest()[:24]
        self._cache_anchor: tuple[int, str] | None = None
        self.tools: dict[str, Tool] = {}
        self.register_tool(Tool("recall_history", RECALL_DESCRIPTION, RECALL_SCHEMA, self._recall_tool, RECALL_SHORT))
        self.register_tool(Tool("recall_search", SEARCH_DESCRIPTION, SEARCH_SCHEMA, self._search_tool, SEARCH_SHORT))
        self.register_tool(Tool("remember", REMEMBER_DESCRIPTION, REMEMBER_SCHEMA, self._remember_tool,
                                REMEMBER_SHORT))
        self.register_tool(Tool("forget", FORGET_DESCRIPTION, FORGET_SCHEMA, self._forget_tool, FORGET_SHORT))
        # by time, not by seq: each kernel numbers its own rows, and the latest write of a key wins
        self.knowledge = KnowledgeSlot(sorted((r for r in ledger if r["kind"] == "knowledge"),
                                              key=lambda r: r["time"]))
        if self.settings.window_tokens:  # validated before anything is saved
            self._check_overhead(profile_for(self.settings.window_tokens, self.settings), self.settings)
        if explicit or not meta:
            self._save_meta()
        # S2 boundaries are declared by clearing rows in the ledger; the newest one is in force.
        self._clear_before = int(last_clearing["clear_before"]) if last_clearing else 0
        self._prune_before = int(last_clearing["prune_before"]) if last_clearing else 0
        host = self._host()
        self.verbatim = VerbatimTrack(host)
        self.compactor = Compactor(host)
        self._check_log_intact()
        # the quiet-moment fold exists before the indexer, whose thread tells it when it wrote
        self._quiet = Quiet(self._quiet_maintenance, lambda: self.settings.quiet_maintenance_s, name)
        self.indexer = Indexer(host, enabled=self.settings.recall_index)
        if self._events:
            self.indexer.kick()  # a restart resumes indexing where it stopped
        self._raw_cache = RawCache()
        self._shown = None
        self._fact_cache: tuple[Any, FactTrack | None] | None = None
        self._retries = Retries()
        if warm_up_enabled() and self._injected_llm is None:  # the embedding gate off the chat turns
            from ..layers.track import warm_gate_in_background

            warm_gate_in_background(self.settings.embedding_model)

    # -- a turn ----------------------------------------------------------------------------
    def chat(self, text: str | bytes = "", *, quote: bool = False, docs: Sequence[str | os.PathLike[str]] = (),
             own: bool = False, on_delta: Callable[[str], None] | None = None,
             on_reset: Callable[[], None] | None = None, stream: bool = True, origin: str = "user") -> Reply:
        """Send one user message, run the tool loop, return the reply. Each event is saved at once.

        Explicit channels for the user-verbatim track: `quote` (the text is pasted AI output; what
        follows a `---` line is the user's own note), `docs` (files attached as content-addressed
        snapshots), `own` (own words, whatever their length). A long paste that looks like a
        document becomes a snapshot on its own, and the reply says so."""
        self.check_writable()
        notices: list[str] = []
        attached = [read_document(p) for p in docs]  # every file is checked before anything is written
        if attached and (text is None or (isinstance(text, str) and not text.strip())):
            text = ""
        else:
            text = self._check_message(text)
        self._quiet.turn_started()
        try:
            with offprocess.foreground():  # the background encoder stops until the turn ends
                try:
                    return self._chat_locked(text, quote, attached, own, notices, origin, stream, on_delta, on_reset)
                finally:  # before the encoder goes on: the indexer's next look sees this turn's end
                    self._turn_ended_at = time.monotonic()
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
            self._shown = sent.shown_uids()  # what the model was sent whole (after a retry, the smaller view)
            try:
                for call in completion.tool_calls:
                    fn = call.get("function") or {}
                    try:
                        result = call_tool(self._offered(), fn.get("name", ""), fn.get("arguments", ""))
                    except Exception as exc:  # pairing never breaks: every call gets a result event
                        result = f"error: the tool call could not be executed ({type(exc).__name__})"
                    event = self.record("tool", result, tool_call_id=call["id"], name=fn.get("name", ""))
                    uids.append(event.uid)
            finally:
                self._shown = None
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

    def _host(self) -> Host:
        """What the compactor, the verbatim track and the recall index may use of this session."""
        return Host(
            self.name, self.store, self._writer, lambda: self.settings, lambda: self._events, self._log,
            catch_up=self._catch_up, usage=lambda: self.usage(), view=lambda: self.send_view(),
            counts=self.token_counts,
            system_prompt=self._system, summarizer=lambda: self.summarizer,
            before_cover=lambda upto: self.verbatim.classify_pending(upto),
            after_index=self._indexed,
            load_breaker=lambda: self._breaker, save_breaker=self._save_breaker,
            segments=lambda: self.compactor.in_force(),
            embedder=lambda load: self.verbatim.vector_layer() if load else self.verbatim.loaded_layer(),
            embedder_off=lambda: self.verbatim.off_reason, busy=self._busy, turn_ended=lambda: self._turn_ended_at,
            miss_weight=self.miss_weight, retried=self.retried)

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
        if not isinstance(name, str) or not SESSION_NAME.match(name):
            raise InputError(f"cannot fork to {name!r}: a session name is 1-64 letters, digits, '.', '_' or '-'")
        self.check_writable()
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

    def copy_to(self, store: str | Store, name: str | None = None) -> Session:
        """This session carried into another store, word for word (`%mfs fork NAME --store PATH`): the log
        under the same uids, the segments, ledger, verdicts and saved state, the snapshots its messages
        name; returns the copy, opened there. The way to go on with a session read from a read-only store.
        A copy that stopped half-way is finished by the same call; this session is untouched."""
        from ..store.copying import copy_session

        name = name or self.name
        if not isinstance(name, str) or not SESSION_NAME.match(name):
            raise InputError(f"cannot copy to {name!r}: a session name is 1-64 letters, digits, '.', '_' or '-'")
        target = store if isinstance(store, Store) else Store(store)
        with self._lock:
            self._catch_up()
            report = copy_session(self.store, self.name, target, name, self._writer)
        copy = Session(name, store=target, llm=self._injected_llm)
        copy.copied = report
        return copy

    def _copy_verdicts(self, child: Session, upto: int) -> None:
        """The fork inherits how this session classified each user message (a pasted AI reply stays
        quoted); the ones not classified yet the fork classifies itself, as this session would."""
        from ..layers.track import verdict_row

        models = {uid: d.get("model", "") for uid, d in self.store.load_verdicts(self.name).items()}
        verdicts = dict(self.verbatim.verdicts)  # the index thread may add to it meanwhile
        said = {e.uid: e.content for e in self._events if e.uid in verdicts}
        rows = [verdict_row(uid, v, models.get(uid, ""), said.get(uid)) for uid, v in verdicts.items() if uid <= upto]
        if rows:
            child.store.save_verdicts(child.name, rows)
            for uid, v in verdicts.items():
                if uid <= upto:
                    child.verbatim.verdicts.setdefault(uid, v)
