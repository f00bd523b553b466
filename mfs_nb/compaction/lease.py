"""The compaction lock (docs/architecture.md, "The compaction protocol"): a lease with an owner and
an expiry.

It lives in the store (a LanceDB table), so it holds across processes and — on object storage —
across machines, with no file lock. The protocol needs only that the store's commits are
linear (every write lands in one version after another, and a read sees the latest version):

1. read the live claims of the session (not released, not expired); any → busy;
2. append our claim (a fresh id, our owner, an expiry);
3. read again: we hold the lease only if ours is the *only* live claim; else we release ours
   and back off. Two claimants that race both write before they read; the later reader sees
   the other's claim, so at most one of them can see itself alone.

The holder renews its expiry (a renew row) from a background thread while it works; a process
that dies stops renewing, and only an expired lease is treated as a crash. The holder checks its
lease again right before it declares anything.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, Protocol

MAX_TTL_S = 3600.0  # the longest lease lifetime; a release row carries it as its expiry (Store.load_leases)


def ttl_s() -> float:
    """Lease lifetime; renewed every third of it. MFS_LEASE_TTL_S shortens it (fault tests)."""
    try:
        value = float(os.environ.get("MFS_LEASE_TTL_S", "60"))
    except ValueError:
        return 60.0
    return value if 0.5 <= value <= MAX_TTL_S else 60.0


class LeaseRows(Protocol):
    def append_lease(self, session: str, claim: str, kind: str, owner: str, expires: float, n: int = 0) -> None: ...

    def load_leases(self, session: str) -> list[dict[str, Any]]: ...


def live_claims(rows: Iterable[dict[str, Any]], now: float) -> dict[str, dict[str, Any]]:
    """Claims neither released nor expired: {claim id: {owner, expires}}. Pure."""
    claims: dict[str, dict[str, Any]] = {}
    released: set[str] = set()
    for r in rows:
        if r["kind"] == "release":
            released.add(r["claim"])
            continue
        c = claims.setdefault(r["claim"], {"owner": r["owner"], "expires": 0.0})
        c["expires"] = max(c["expires"], float(r["expires"]))
    return {k: v for k, v in claims.items() if k not in released and v["expires"] > now}


def owner_name(writer: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{writer[:8]}"


class Lease:
    """One session's compaction lease, as seen by one kernel."""

    def __init__(self, rows: LeaseRows, session: str, owner: str):
        self.rows = rows
        self.session = session
        self.owner = owner
        self.claim: str | None = None
        self._renewals = 0
        self._stop: threading.Event | None = None
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        return self.claim is not None

    def holders(self) -> dict[str, dict[str, Any]]:
        return live_claims(self.rows.load_leases(self.session), time.time())

    def try_acquire(self) -> bool:
        """One attempt (steps 1–3 above). True when this kernel now holds the lease."""
        with self._mutex:
            if self.claim is not None:
                return self.valid()
            if self.holders():
                return False
            claim = uuid.uuid4().hex
            ttl = ttl_s()
            self.rows.append_lease(self.session, claim, "claim", self.owner, time.time() + ttl)
            live = self.holders()
            if set(live) != {claim}:
                self.rows.append_lease(self.session, claim, "release", self.owner, time.time() + MAX_TTL_S)
                return False
            self.claim, self._renewals = claim, 0
            self._start_renewer(claim, ttl)
            return True

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Try until `wait_s` has passed (random back-off, so racing kernels do not collide again)."""
        deadline = time.monotonic() + wait_s
        attempt = 0
        while True:
            if self.try_acquire():
                return True
            attempt += 1
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(random.uniform(0.02, 0.1) * attempt, 1.0, max(deadline - time.monotonic(), 0.0)))

    def valid(self) -> bool:
        """Our claim is live and no other claim is (checked against the store, before a commit)."""
        claim = self.claim
        return claim is not None and set(self.holders()) == {claim}

    def renew(self) -> None:
        claim = self.claim
        if claim is None:
            return
        self._renewals += 1
        self.rows.append_lease(self.session, claim, "renew", self.owner, time.time() + ttl_s(), self._renewals)

    def release(self) -> None:
        with self._mutex:
            claim, self.claim = self.claim, None
            if self._stop is not None:
                self._stop.set()
                self._stop = None
            if claim is not None:
                self.rows.append_lease(self.session, claim, "release", self.owner, time.time() + MAX_TTL_S)

    def _start_renewer(self, claim: str, ttl: float) -> None:
        stop = threading.Event()
        self._stop = stop

        def renew() -> None:
            while not stop.wait(ttl / 3):
                if self.claim != claim:
                    return
                try:
                    self.renew()
                except Exception:  # a failed renewal lets the lease expire; the commit check sees it
                    pass

        threading.Thread(target=renew, daemon=True, name=f"mfs-lease-{claim[:6]}").start()
