"""`mfs-nb` / `python -m mfs_nb`: demo, replay, bench and doctor."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .errors import MfsError


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
    b = sub.add_parser("bench", help="run benchmarks on real conversations and update docs/benchmarks.md")
    b.add_argument("suites", nargs="*", help="suites to run (default: all)")
    b.add_argument("--data", help="data directory with loaders.py (default: ../shared/data when it exists)")
    b.add_argument("--json", dest="json_out", help="write the results here as JSON")
    b.add_argument("--quick", action="store_true", help="subsampled run that fits in a few minutes")
    b.add_argument("--docs", default="docs/benchmarks.md",
                   help="markdown file whose sections are regenerated ('' to leave docs alone)")
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
        if args.command == "doctor":
            from .doctor import doctor

            lines, healthy = doctor(args.store, args.repair)
            print("\n".join(lines))
            return 0 if healthy or args.repair else 1
        if args.command == "bench":
            from pathlib import Path

            from .bench.runner import run as bench

            return bench(args.suites, args.data, args.quick, args.json_out, Path(args.docs) if args.docs else None)
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
    report = replay(messages, window=args.window, model=args.model, store=args.store, payloads=args.payloads)
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
