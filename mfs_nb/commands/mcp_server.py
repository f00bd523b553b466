"""`mfs-nb mcp`: a store's memory served over the Model Context Protocol, for agents outside the notebook
(Claude Code, Codex, Cursor, JupyterLab AI): search and recall by uid over every session, the layered view
a session's model sees, and — only with `--allow-writes` — pins and notes. Guide: docs/guide/mcp.md.

The tools are the notebook's memory tools with a session argument: the same page size, the same
one-line errors. Every text the server returns goes through `redaction.redact`. Reads see what other
kernels committed (each call first takes the events appended since); writes take the session's
compaction lease, as a kernel does. The streamable-HTTP transport binds 127.0.0.1 unless told otherwise,
and then requires a bearer token from the environment (`MFS_MCP_TOKEN`), which is never printed.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from bisect import bisect_left
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..errors import InputError, MfsError
from ..recall.dates import uid_bounds
from ..recall.ranking import PAGE
from ..recall.searcher import reading
from ..recall.tools import MAX_RESULT_CHARS, format_events, memory_result_chars, parse_range
from ..redaction import redact
from ..session import Session, valid_session_name
from ..store import Store

TOKEN_ENV = "MFS_MCP_TOKEN"
MAX_QUERY_CHARS = 2_000
MAX_K = 100
PAGE_CHARS = MAX_RESULT_CHARS  # a page of `context`, an export or a ledger: what a memory tool returns at most
NAMES_S = 5.0
SEARCH_THREADS = 4  # sessions searched side by side in one recall_search
FETCH_AROUND = 2  # `fetch` returns the message and this many on each side
WATCH_S = 2.0  # how often the server looks for sessions that changed (`watch`), for the change notifications
SESSIONS_URI = "mfs://sessions"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
INSTRUCTIONS = (
    "Long-term memory of notebook conversations (mfs_nb) and of imported assistant transcripts. "
    "Find things with recall_search (short keywords and names; optional session, role, date or uid filters), "
    "then read the original messages word for word with recall_history(session, uid_from, uid_to). "
    "list_sessions shows what is stored; context(session) shows what that session's model is sent now."
)


class Refused(MfsError):
    """A request the server will not carry out; its text is the one sentence the client sees."""


class Memory:
    """The server's side of a store: sessions opened on first use and kept, each refreshed before a read."""

    def __init__(self, store: Store, allow_writes: bool = False, watch_s: float = WATCH_S):
        self.store = store
        self.allow_writes = allow_writes
        self.watch_s = watch_s
        self._open: dict[str, Session] = {}
        self._names: tuple[float, list[str]] | None = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=SEARCH_THREADS, thread_name_prefix="mfs-mcp-search")

    # -- sessions ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The store's sessions, read again at most every NAMES_S seconds (a read costs tens of ms)."""
        now = time.monotonic()
        if self._names is None or now - self._names[0] > NAMES_S:
            self._names = (now, sorted(self.store.sessions()))
        return self._names[1]

    def session(self, name: Any, refresh: bool = True) -> Session:
        if not isinstance(name, str) or not valid_session_name(name):
            raise Refused(f"session must be a session name (1-64 letters, digits, '.', '_' or '-'), not {name!r}")
        with self._lock:
            s = self._open.get(name)
            if s is None:
                names = self.names()
                if name not in names:
                    self._names = None  # made since the last look?
                    names = self.names()
                if name not in names:
                    listed = ", ".join(names[:20]) + (" …" if len(names) > 20 else "") if names else "none"
                    raise Refused(f"no session {name!r} in {self.store.shown}; sessions: {listed}")
                s = self._open[name] = Session(name, store=self.store)
                return s
        if refresh:
            s.refresh()  # outside the lock: the sessions of one request are read side by side
        return s

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for s in self._open.values():
            s.indexer.close()

    # -- the tools -----------------------------------------------------------------------------
    def list_sessions(self) -> str:
        names = self.names()
        if not names:
            raise Refused(f"the store at {self.store.shown} holds no sessions yet")
        lines = [f"{len(names)} sessions (name · messages · uids · first and last message):"]
        for name in names:
            events = self.session(name).events
            if events:
                lines.append(f"{name} · {len(events)} messages · uids 1–{events[-1].uid} · "
                             f"{events[0].created_at[:19]} … {events[-1].created_at[:19]}")
            else:
                lines.append(f"{name} · no messages")
        return _page("\n".join(lines), 1)

    def recall_search(self, query: Any, k: Any = PAGE, session: Any = None, role: Any = None, uid_from: Any = None,
                      uid_to: Any = None, date_from: Any = None, date_to: Any = None) -> str:
        if not isinstance(query, str) or not query.strip():
            raise Refused("query must be some words to look for")
        if len(query) > MAX_QUERY_CHARS:
            raise Refused(f"query is {len(query):,} characters; at most {MAX_QUERY_CHARS:,}: use a few keywords")
        count = _whole(k, "k")
        if not 1 <= count <= MAX_K:
            raise Refused(f"k must be between 1 and {MAX_K}, not {count}")
        if role is not None and role not in ("user", "assistant", "tool", "segment"):
            raise Refused(f"role must be user, assistant, tool or segment, not {role!r}")
        names = [session] if session is not None else self.names()
        if not names:
            raise Refused(f"the store at {self.store.shown} holds no sessions yet")
        with reading():  # the background indexers wait from here, not only during each session's search
            return self._search_all(query, count, names, role, uid_from, uid_to, date_from, date_to)

    def _search_all(self, query: str, count: int, names: list[str], role: Any, uid_from: Any, uid_to: Any,
                    date_from: Any, date_to: Any) -> str:
        # the query is embedded (once, kept for every session) while each session is read up to date; then
        # the sessions are searched side by side, their table reads overlapping
        first = self.session(names[0], refresh=False)
        embedder = first.indexer.model()
        embedding = self._pool.submit(first.indexer.query_vector, embedder, query) if embedder is not None else None
        opened = dict(zip(names, self._pool.map(self.session, names)))
        if embedding is not None:
            wait([embedding])  # a failure is met again, and said, by each search
        bounds = {name: _uid_bounds(s, uid_from, uid_to, date_from, date_to) for name, s in opened.items()}
        wanted = [name for name, (lo, hi) in bounds.items() if lo is None or hi is None or lo <= hi]

        def one(name: str) -> Any:
            lo, hi = bounds[name]
            return opened[name].search(query, count, role=role, uid_from=lo, uid_to=hi)

        results = dict(zip(wanted, self._pool.map(one, wanted)))
        found: list[tuple[float, str, Any]] = []
        notices: list[str] = []
        for name in wanted:
            notices += [f"{name}: {n}" if len(names) > 1 else n for n in results[name].notices]
            found += [(hit.score, name, hit) for hit in results[name]]
        found.sort(key=lambda x: -x[0])
        if len(notices) > 3:  # one line for many sessions whose vectors are still being built
            notices = notices[:2] + [f"and {len(notices) - 2} more notes like these"]
        lines = [f"[note: {n}]" for n in notices]
        top = found[:count]
        if not top:
            return "\n".join(lines + ["no matches; try other words, or recall_history with a session and a uid range"])
        lines.append(f"{len(top)} hits (best first); read one with recall_history(session, uid_from, uid_to):")
        limit = memory_result_chars(max(opened[n].profile().effective for _, n, _ in top))
        used = sum(len(x) + 1 for x in lines)
        logs: dict[str, list[Any]] = {}  # each session's log, copied once for the hits' times
        for i, (_, name, hit) in enumerate(top):
            if name not in logs:
                logs[name] = opened[name].events
            when = _created(logs[name], hit.uid)
            line = f"{name} {hit.line()}" + (f" ({when[:19]})" if when else "")
            if used + len(line) > limit and i:
                lines.append(f"[… {len(top) - i} more hits left out to fit; ask for a smaller k]")
                break
            lines.append(line[:limit])
            used += len(line) + 1
        return redact("\n".join(lines))

    def recall_history(self, session: Any, uid_from: Any, uid_to: Any = None) -> str:
        s = self.session(session)
        events = s.recall(*parse_range(uid_from, uid_to))
        return redact(format_events(events, memory_result_chars(s.profile().effective), s.retried()))

    def context(self, session: Any, page: Any = 1) -> str:
        s = self.session(session)
        view = s.send_view()
        blocks = [f"# what the model of session {s.name!r} is sent ({len(view.messages)} messages, "
                  f"{sum(s.token_counts(view)):,} tokens of a {s.window:,}-token window)"]
        for m in view.messages:
            body = m.get("content") or ""
            if not isinstance(body, str):
                body = json.dumps(body, ensure_ascii=False)
            calls = "; ".join(f"{c.get('function', {}).get('name', '?')}({c.get('function', {}).get('arguments', '')})"
                              for c in m.get("tool_calls") or ())
            blocks.append(f"[{m.get('role')}]\n{body}" + (f"\n[tool calls: {calls}]" if calls else ""))
        return _page(redact("\n\n".join(blocks)), page)

    def export(self, session: Any, page: Any = 1) -> str:
        s = self.session(session)
        with tempfile.TemporaryDirectory(prefix="mfs-mcp-") as tmp:
            path = s.export(Path(tmp) / f"{s.name}.md")
            return _page(path.read_text(encoding="utf-8"), page)  # the export is already redacted

    def ledger(self, session: Any, page: Any = 1) -> str:
        rows = self.session(session).ledger()
        return _page(redact(json.dumps(rows, ensure_ascii=False, indent=1, default=str)), page)

    # -- the search / fetch pair (the shape ChatGPT's connectors and deep-research clients call) ----
    def search(self, query: Any) -> str:
        """`{"results": [{"id", "title", "url"}]}` over every session: ids `session:uid`, for `fetch`."""
        if not isinstance(query, str) or not query.strip():
            raise Refused("query must be some words to look for")
        if len(query) > MAX_QUERY_CHARS:
            raise Refused(f"query is {len(query):,} characters; at most {MAX_QUERY_CHARS:,}: use a few keywords")
        names = self.names()
        results: list[dict[str, str]] = []
        if names:
            with reading():  # the sessions read and searched side by side, as recall_search does
                opened = dict(zip(names, self._pool.map(self.session, names)))
                pages = dict(zip(names, self._pool.map(lambda n: opened[n].search(query, PAGE), names)))
            found = sorted(((hit.score, name, hit) for name in names for hit in pages[name]), key=lambda x: -x[0])
            for _, name, hit in found[:PAGE]:
                when = _created(opened[name].events, hit.uid)
                what = f"#{hit.uid} {hit.role}" if hit.kind == "event" else f"summary of #{hit.uid}–{hit.uid_to}"
                snippet = " ".join(hit.snippet.split())[:100]
                results.append({"id": f"{name}:{hit.uid}",
                                "title": redact(f"{name} {what}" + (f" · {when[:10]}" if when else "") + f": {snippet}"),
                                "url": f"mfs://{name}/export.md#uid-{hit.uid}"})
        return json.dumps({"results": results}, ensure_ascii=False)

    def fetch(self, id: Any) -> str:
        """The message `session:uid` word for word, with `FETCH_AROUND` messages on each side."""
        name, _, uid = str(id).rpartition(":")
        if not name or not uid.isdigit():
            raise Refused(f"id must be session:uid as search returns it (e.g. analysis:12), not {id!r}")
        s = self.session(name)
        at = int(uid)
        events = s.recall(max(1, at - FETCH_AROUND), min(at + FETCH_AROUND, s.last_uid)) if 1 <= at <= s.last_uid else []
        if not any(e.uid == at for e in events):
            raise Refused(f"session {name!r} has no message with uid {at} (its uids are 1–{s.last_uid})")
        text = format_events(events, memory_result_chars(s.profile().effective), s.retried())
        when = _created(s.events, at)
        return json.dumps({"id": f"{name}:{at}", "title": f"{name} #{at}" + (f" · {when[:10]}" if when else ""),
                           "text": redact(text), "url": f"mfs://{name}/export.md#uid-{at}",
                           "metadata": {"session": name, "uid": at, "uids": [events[0].uid, events[-1].uid],
                                        "created_at": when}}, ensure_ascii=False)

    def sessions_json(self) -> str:
        """The `mfs://sessions` resource: every session with its last uid and last time."""
        marks = self.store.session_marks()
        return json.dumps([{"session": n, "last_uid": m[0], "messages": m[1]} for n, m in sorted(marks.items())],
                          ensure_ascii=False)

    # -- writes, only with --allow-writes ------------------------------------------------------------
    def _writable(self, session: Any, what: str) -> Session:
        if not self.allow_writes:
            raise Refused(f"{what} writes to the store, and this server is read-only; start it with --allow-writes")
        return self.session(session)

    def pin(self, session: Any, key: Any, value: Any) -> str:
        s = self._writable(session, "pin")
        with s.compactor.exclusive(wait_s=10.0) as busy:
            if busy:
                raise Refused(f"{busy}; try again in a moment")
            return redact("; ".join(s.pin(key, value, by="agent")))

    def unpin(self, session: Any, key: Any) -> str:
        s = self._writable(session, "unpin")
        with s.compactor.exclusive(wait_s=10.0) as busy:
            if busy:
                raise Refused(f"{busy}; try again in a moment")
            return redact("; ".join(s.unpin(key, by="agent")) or f"{key!r} was not pinned")

    def append_note(self, session: Any, text: Any) -> str:
        s = self._writable(session, "append_note")
        if not isinstance(text, str) or not text.strip():
            raise Refused("text must be the note to keep")
        limit = memory_result_chars(s.profile().effective)
        if len(text) > limit:
            raise Refused(f"the note is {len(text):,} characters; at most {limit:,} in one note")
        with s.compactor.exclusive(wait_s=10.0) as busy:
            if busy:
                raise Refused(f"{busy}; try again in a moment")
            event = s.record("user", redact(text), origin="note", new_turn=True)
        return f"kept as uid {event.uid} of session {s.name!r}"


def _whole(value: Any, what: str) -> int:
    try:
        return parse_range(value)[0]
    except InputError:
        raise Refused(f"{what} must be a whole number, not {value!r}") from None


def _page(text: str, page: Any) -> str:
    number = _whole(page, "page")
    pages = max(1, -(-len(text) // PAGE_CHARS))
    if not 1 <= number <= pages:
        raise Refused(f"page must be between 1 and {pages}, not {number}")
    chunk = text[(number - 1) * PAGE_CHARS: number * PAGE_CHARS]
    return chunk + (f"\n[page {number} of {pages}; ask for page {number + 1} for more]" if number < pages else "")


def _created(events: list[Any], uid: int) -> str:
    i = bisect_left(events, uid, key=lambda e: e.uid)
    return events[i].created_at if i < len(events) and events[i].uid == uid else ""


def _uid_bounds(s: Session, uid_from: Any, uid_to: Any, date_from: Any, date_to: Any) -> tuple[int | None, int | None]:
    lo = parse_range(uid_from)[0] if uid_from is not None else None
    hi = parse_range(uid_to)[0] if uid_to is not None else None
    return uid_bounds(lambda: s.events, lo, hi, date_from, date_to)


# -- the server ------------------------------------------------------------------------------------
def build(memory: Memory) -> Any:
    """The MCPServer with the tools (writes only when allowed) and the per-session resources."""
    from contextlib import asynccontextmanager

    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.subscriptions import InMemorySubscriptionBus
    from mcp_types import ToolAnnotations

    bus = InMemorySubscriptionBus()

    @asynccontextmanager
    async def lifespan(_: Any) -> Any:
        """While the server runs: look for changed sessions every `memory.watch_s` and say so."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch, memory, bus)
            try:
                yield {}
            finally:
                tasks.cancel_scope.cancel()

    server = MCPServer("mfs-nb", instructions=INSTRUCTIONS, log_level="WARNING", subscriptions=bus,
                       lifespan=lifespan)
    reads = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)

    def guarded(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> str:
            try:
                return fn(*args, **kwargs)
            except MfsError as exc:  # Refused, InputError, a store that went away: one sentence back
                raise ToolError(redact(str(exc))) from None
        return run

    @server.tool(description="The sessions in this store: name, number of messages, uid range, first and last time.",
                 annotations=reads)
    def list_sessions() -> str:
        return guarded(memory.list_sessions)()

    @server.tool(description=(
        "Search stored conversations by meaning and by words, including what no model window shows any more. "
        "Best with short keyword-and-name queries. Optional: session (else every session), role "
        "(user/assistant/tool/segment), uid_from/uid_to, date_from/date_to (ISO dates). Returns "
        "`session [#uid role · turn · score] snippet` lines; read one with recall_history."), annotations=reads)
    def recall_search(query: str, k: int = PAGE, session: str | None = None, role: str | None = None,
                      uid_from: int | None = None, uid_to: int | None = None, date_from: str | None = None,
                      date_to: str | None = None) -> str:
        return guarded(memory.recall_search)(query, k, session, role, uid_from, uid_to, date_from, date_to)

    @server.tool(description=("The original messages of a session with uids uid_from..uid_to, word for word, "
                              "with their roles; any uid ever written, compressed or not."), annotations=reads)
    def recall_history(session: str, uid_from: int, uid_to: int | None = None) -> str:
        return guarded(memory.recall_history)(session, uid_from, uid_to)

    @server.tool(description=("What the model of a session is sent now, as text: the system prompt, the knowledge "
                              "slot, the summaries of compacted ranges and the recent messages. Paged."),
                 annotations=reads)
    def context(session: str, page: int = 1) -> str:
        return guarded(memory.context)(session, page)

    @server.tool(description=("Search every stored conversation (the search/fetch shape of connectors and deep "
                              "research): JSON {results: [{id, title, url}]}, best first; read one with fetch(id)."),
                 annotations=reads)
    def search(query: str) -> str:
        return guarded(memory.search)(query)

    @server.tool(description=("One message by the id search returned (session:uid), word for word, with two "
                              "messages on each side: JSON {id, title, text, url, metadata}."), annotations=reads)
    def fetch(id: str) -> str:  # noqa: A002 (the name the connector shape uses)
        return guarded(memory.fetch)(id)

    writes = {"pin": ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False),
              "unpin": ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True,
                                       openWorldHint=False),
              "append_note": ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False,
                                             openWorldHint=False)}
    if memory.allow_writes:
        @server.tool(description="Keep key = value in a session's knowledge slot, word for word, never compacted "
                                 "(a key set again is replaced).", annotations=writes["pin"])
        def pin(session: str, key: str, value: str) -> str:
            return guarded(memory.pin)(session, key, value)

        @server.tool(description="Remove a key from a session's knowledge slot.", annotations=writes["unpin"])
        def unpin(session: str, key: str) -> str:
            return guarded(memory.unpin)(session, key)

        @server.tool(description="Append a note to a session's log (a message of its own, recallable by uid).",
                     annotations=writes["append_note"])
        def append_note(session: str, text: str) -> str:
            return guarded(memory.append_note)(session, text)
    else:
        for name in ("pin", "unpin", "append_note"):
            server.tool(name=name, description=f"({name} writes to the store: it needs a server started with "
                                               "--allow-writes; this one is read-only and refuses it.)",
                        annotations=writes[name])(_refusal(name))

    @server.resource(SESSIONS_URI, mime_type="application/json",
                     description=("Every session with its last uid and last time; listen to it (or to the resource "
                                  "list) to hear when a session changes or a new one appears."))
    def sessions() -> str:
        return guarded(memory.sessions_json)()

    @server.resource("mfs://{session}/export.md", mime_type="text/markdown",
                     description="A session's export: every message under its uid, each segment, the ledger.")
    def export(session: str) -> str:
        return guarded(memory.export)(session)

    @server.resource("mfs://{session}/ledger.json", mime_type="application/json",
                     description="A session's ledger: every action of the memory layer, with its cost.")
    def ledger(session: str) -> str:
        return guarded(memory.ledger)(session)

    return server


async def watch(memory: Memory, bus: Any) -> None:
    """Every `memory.watch_s`, the sessions' last uids (one read of two columns); a new or removed session is
    a change of the resource list, and any session that changed updates `mfs://sessions` and its export."""
    import anyio
    from mcp.server.subscriptions import ResourcesListChanged, ResourceUpdated

    last: dict[str, tuple[int, int]] | None = None
    version = None
    while True:
        marks = last
        try:
            now = await anyio.to_thread.run_sync(memory.store.events_version)
            if now != version:  # the log was written: read who wrote what
                marks = await anyio.to_thread.run_sync(memory.store.session_marks)
                version = now
        except Exception:  # a store gone away for a moment: the next look may see it again
            pass
        if last is not None and marks is not None and marks != last:
            if set(marks) != set(last):
                await bus.publish(ResourcesListChanged())
            await bus.publish(ResourceUpdated(uri=SESSIONS_URI))
            for name in sorted(n for n in marks if marks[n] != last.get(n)):
                await bus.publish(ResourceUpdated(uri=f"mfs://{name}/export.md"))
        last = marks
        await anyio.sleep(memory.watch_s)


def _refusal(name: str) -> Any:
    def refuse(session: str = "", key: str = "", value: str = "", text: str = "") -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError(f"{name} writes to the store, and this server is read-only; start it with --allow-writes")
    return refuse


    return 0
