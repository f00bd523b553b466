"""One kernel of a fault run: chats and compacts on a shared session, printing what it was told is
saved (`ack UID SHA`), so the parent can check after any kill that nothing acknowledged is gone.

    python tests/faults/worker.py STORE SESSION --tag a --ops 20 --seed 1 [--wait-for N --done-dir D]

The model is a deterministic in-process fake (no network); its summaries mention the range's words,
so they pass validation. With --wait-for, the worker waits until N workers are done, then opens the
session afresh and prints `final {json}`: its segment spans, coverage and a hash of its send view.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mfs_nb import Session  # noqa: E402
from mfs_nb.models.llm import Completion  # noqa: E402


class Model:
    """Replies and summaries without a network: a summary names the first words of each user message."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def complete(self, messages, *, tools=None, stream=True, on_delta=None, on_reset=None):
        if self.delay:
            time.sleep(self.delay)
        last = messages[-1].get("content") or ""
        if last.startswith("<<mfs:summarize>>"):
            users = [(m.get("content") or "")[:60] for m in messages[1:-1] if m.get("role") == "user"]
            return Completion("- the user discussed: " + "; ".join(users), [], None, "primary", "fake")
        # a reply with substance, as a model's would be: compacting it makes the payload smaller
        return Completion(f"noted: {last[:80]}. " + "The trade-offs of this choice, step by step. " * 12, [], None,
                          "primary", "fake")


def message(tag: str, i: int, rng: random.Random) -> str:
    words = " ".join(rng.choice(["pool", "deploy", "latency", "cache", "shard", "replica", "index", "budget"])
                     for _ in range(rng.randint(20, 120)))
    return f"[{tag}-{i}] service {tag}{i} needs attention: {words}"


def snapshot(store: str, session: str, window: int) -> dict:
    s = Session(session, store=store, window_tokens=window, llm=Model())
    view = json.dumps(s.send_view().messages, sort_keys=True, ensure_ascii=False)
    return {"spans": [[x.uid_from, x.uid_to] for x in s.compactor.segments], "evicted": s.compactor.evicted,
            "coverage": s.coverage(), "view": hashlib.sha256(view.encode()).hexdigest()[:16],
            "last_uid": s.last_uid}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("session")
    ap.add_argument("--tag", default="a")
    ap.add_argument("--ops", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--compact-share", type=float, default=0.3)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--background", action="store_true")
    ap.add_argument("--wait-for", type=int, default=0)
    ap.add_argument("--done-dir", default="")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    try:
        s = Session(a.session, store=a.store, window_tokens=a.window, llm=Model(a.delay),
                    background_compaction=a.background)
        print("ready", flush=True)
        run(s, a, rng)
    finally:  # a failing worker still says it is done, so the others do not wait for it
        if a.wait_for:
            (Path(a.done_dir) / a.tag).write_text("done")
    if a.wait_for:
        done = Path(a.done_dir)
        deadline = time.monotonic() + 300
        while len(list(done.iterdir())) < a.wait_for and time.monotonic() < deadline:
            time.sleep(0.1)
        print("final", json.dumps(snapshot(a.store, a.session, a.window)), flush=True)


def run(s: Session, a: argparse.Namespace, rng: random.Random) -> None:
    for i in range(a.ops):
        if rng.random() < a.compact_share:
            notes = s.compact()
            print("compact", json.dumps(notes, ensure_ascii=False), flush=True)
        else:
            text = message(a.tag, i, rng)
            reply = s.chat(text)
            for uid in reply.uids:
                e = next(x for x in s.events if x.uid == uid)
                print("ack", uid, e.sha256, flush=True)
        time.sleep(rng.uniform(0, 0.05))


if __name__ == "__main__":
    main()
