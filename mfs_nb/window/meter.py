"""S0 pressure: usage anchor, increment estimate, calibration (docs/architecture.md, "Token
accounting and the compaction tiers").

Pure state, no I/O. After each response the provider's `prompt_tokens` becomes the anchor,
with a fingerprint of the payload it priced (message count, last uid, hash of the system slot;
the tool list is deliberately not part of it). Pressure is the anchor plus the calibrated
estimate of every message added since, while the fingerprint still matches the current payload.
After a structural change (a compaction, a clearing, a pin, a config change) the anchor is carried
over: the provider's count plus the calibrated estimate of how much the whole payload changed
(the anchor keeps its payload's whole estimate for this), so a pin of 47 tokens moves the meter
by about 47 tokens, not by the gap between the provider's count and the estimate. Only without
an anchor (or one saved before it kept its estimate) is pressure a calibrated estimate of the whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..events import content_hash
from ..layers.view import SendView

ALPHA = 0.3  # EMA weight of the newest real/estimated increment ratio
DEVIATION = 0.15  # |k − 1| above this, held for PERSIST calibrations, is noted once
PERSIST = 3
MIN_INCREMENT = 32  # tokens; smaller increments are too noisy to calibrate on
RATIO_BOUNDS = (0.25, 4.0)  # a ratio outside this is a provider quirk, not a calibration signal


def fingerprint(view: SendView, n: int) -> str:
    """Structure of the first n messages of a payload: count, last uid, hash of the system slot, and
    the projection's structure key (S2 boundaries, segments), whose change is a structural change."""
    if n <= 0 or n > len(view.messages):
        return ""
    last_uid = next((u for u in reversed(view.uids[:n]) if u is not None), 0)
    system = view.messages[0].get("content") or "" if view.messages[0].get("role") == "system" else ""
    return f"{n}:{last_uid}:{content_hash(system)[:16]}:{view.structure}"


@dataclass
class Anchor:
    prompt_tokens: int
    messages: int
    fingerprint: str
    estimate: int = 0  # the whole estimate (messages + fixed) of the payload it priced; 0: unknown


@dataclass
class Meter:
    """The anchor and the calibration factor k of one session."""

    anchor: Anchor | None = None
    k: float = 1.0
    over: int = 0
    noted: bool = False

    def pressure(self, view: SendView, counts: list[int], fixed: int) -> tuple[int, str]:
        """(tokens, source): anchor + k·estimate(added); after a structural change anchor +
        k·(estimate(whole payload) − estimate(anchored payload)); without an anchor k·estimate(whole)."""
        a = self.anchor
        if a and a.fingerprint == fingerprint(view, a.messages):
            return a.prompt_tokens + round(self.k * sum(counts[a.messages:])), "anchor+estimate"
        whole = sum(counts) + fixed
        if a and a.estimate > 0:
            carried = a.prompt_tokens + round(self.k * (whole - a.estimate))
            if carried > 0:
                return carried, "anchor+estimate"
        return round(self.k * whole), "estimate"

    def observe(self, view: SendView, counts: list[int], usage: dict[str, int] | None,
                fixed: int = 0) -> str | None:
        """Anchor on a response's usage and calibrate k (`fixed`: the tokens sent outside the messages,
        kept with the anchor's whole estimate); returns a note the first time the
        estimate has deviated more than 15 % for several calibrations in a row."""
        prompt = (usage or {}).get("prompt_tokens") or 0
        if prompt <= 0:
            return None  # no usage: the anchor never moves
        note = None
        a = self.anchor
        if a and a.fingerprint == fingerprint(view, a.messages):
            estimated = sum(counts[a.messages:])
            real = prompt - a.prompt_tokens
            if estimated >= MIN_INCREMENT and real > 0 and RATIO_BOUNDS[0] <= real / estimated <= RATIO_BOUNDS[1]:
                self.k = (1 - ALPHA) * self.k + ALPHA * real / estimated
                self.over = self.over + 1 if abs(self.k - 1) > DEVIATION else 0
                if self.over >= PERSIST and not self.noted:
                    self.noted = True
                    note = (f"token estimates differ from the provider's count by {abs(self.k - 1):.0%}; "
                            f"estimates are now scaled by k={self.k:.2f}")
        n = len(view.messages)
        self.anchor = Anchor(int(prompt), n, fingerprint(view, n), sum(counts) + fixed)
        return note

    def to_json(self) -> dict[str, Any]:
        return {"anchor": asdict(self.anchor) if self.anchor else None, "k": self.k, "over": self.over,
                "noted": self.noted}

    @classmethod
    def from_json(cls, data: Any) -> Meter:
        if not isinstance(data, dict):
            return cls()
        raw = data.get("anchor")
        anchor = None
        if isinstance(raw, dict) and {"prompt_tokens", "messages", "fingerprint"} <= raw.keys():
            anchor = Anchor(int(raw["prompt_tokens"]), int(raw["messages"]), str(raw["fingerprint"]),
                            int(raw.get("estimate") or 0))
        k = data.get("k", 1.0)
        k = float(k) if isinstance(k, (int, float)) and RATIO_BOUNDS[0] <= k <= RATIO_BOUNDS[1] else 1.0
        return cls(anchor, k, int(data.get("over", 0) or 0), bool(data.get("noted", False)))
