"""Making one segment: the summarizer's call and its checks, the zero-LLM digest instead, the upgrade of
a degraded segment, the merged guide of a consolidation, and the notices they leave."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import MfsError
from ..events import Event
from ..layers import segments as seg
from ..layers.segments import Segment
from ..window.usage import human
from . import consolidation as con
from . import limits
from .summary_check import validate_summary

if TYPE_CHECKING:
    from .state import CompactorState

BREAKER_OPENED = (f"automatic LLM compaction stopped after {limits.BREAKER} failures in a row; history is kept with "
                  "zero-LLM segments. Fix the model, then %compact, or start over with %mfs new NAME")


class SegmentMaking:
    """The summarizer's side of the compactor: it reads the segments in force and writes the protocol's
    rows through `state`, and owns nothing else."""

    def __init__(self, state: CompactorState):
        self.state = state
        self.host = state.host

    # -- making one segment ----------------------------------------------------------------
    def summarize(self, events: Sequence[Event], effective: int, focus: str = "",
                  earlier: str = "") -> tuple[str | None, dict[str, Any]]:
        """Ask the model for the prose guide; (None, info) on any failure or unusable output."""
        target = self.state.target(events, effective)
        info: dict[str, Any] = {"target": target, "style": self.host.settings().summary_style, "llm_tokens": 0}
        if self.state.breaker.open and not self.state.breaker.may_try(limits.BREAKER_COOLDOWN_S):
            info["error"] = "circuit breaker open: automatic LLM compaction is off for this session"
            return None, info
        shown = _newest_within(events, seg.INPUT_CHARS)
        # a range larger than the compressor reads at once (a fork's whole history): the newest part,
        # after what the earlier summaries (`earlier`) say of the rest
        before = ([{"role": "user", "content": f"(uids {events[0].uid}–{shown[0].uid - 1} came before this and are "
                                              "not shown; their fact lines are kept with the summary"
                                              + (f"; earlier summaries of them:)\n\n{earlier[-limits.EARLIER_CHARS:]}"
                                                 if earlier else ")")}]
                  if shown[0].uid != events[0].uid else [])
        messages = [{"role": "system", "content": self.host.system_prompt()}, *before, *seg.compressor_messages(shown),
                    {"role": "user", "content": seg.instruction(self.host.settings().summary_style, events[0].uid,
                                                                events[-1].uid, target, focus,
                                                                self.language(events[-1].uid))}]
        info["envelope"] = {"model": self.host.settings().model, "messages": len(messages), "tools": False}
        started = time.monotonic()
        try:
            completion = self._summarizer_call(messages)
        except MfsError as exc:
            info["error"] = str(exc)
            return None, info
        except Exception as exc:  # the summarizer must never break the turn
            info["error"] = f"{type(exc).__name__}: {exc}"
            return None, info
        info["duration_s"] = round(time.monotonic() - started, 3)
        usage = completion.usage or {}
        info["llm_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        prose, why = validate_summary(completion.text, events, target)
        if prose is None:
            info["error"] = f"summary rejected: {why}; not committed"
            self.host.log("summary_rejected", reason=why, uid_from=events[0].uid, uid_to=events[-1].uid,
                        chars=len(completion.text or ""))
        elif why:
            info["note"] = why
        return prose, info

    def language(self, upto: int) -> str | None:
        """The conversation's language as the user writes it, from the user's messages up to `upto`."""
        return seg.conversation_language([e for e in self.host.events() if e.uid <= upto])

    def make(self, seq: int, events: list[Event], effective: int, focus: str = "",
             earlier: str = "") -> tuple[Segment, dict[str, Any]]:
        # the user messages of this range join the verbatim track when it commits: classify them
        # now, off the turn when this runs in the background (a failure leaves them own words)
        try:
            self.host.before_cover(events[-1].uid)
        except Exception:
            pass
        prose, info = self.summarize(events, effective, focus, earlier)
        if prose is None and "circuit breaker open" not in str(info.get("error")):
            info["breaker"] = self.state.breaker.failed()
        elif prose is not None:
            self.state.breaker.succeeded()
        segment = seg.build(seq, events, prose, self.state.plan(effective).block)
        self.state.rows.complete(seq, segment, info, degraded=segment.degraded)
        return segment, info

    def _summarizer_call(self, messages: list[dict[str, Any]]) -> Any:
        """One summarizer call; what the provider counted for it (input, cache reads and writes,
        output) is a `summarizer` ledger row, so the session's bill has it (`Session.cost`)."""
        completion = self.host.summarizer().complete(messages, tools=None, stream=False)
        usage = completion.usage or {}
        if usage:
            self.host.log("summarizer", model=completion.model, prompt_tokens=usage.get("prompt_tokens", 0),
                       cached_tokens=usage.get("cached_tokens", 0),
                       cache_write_tokens=usage.get("cache_write_tokens", 0),
                       completion_tokens=usage.get("completion_tokens", 0))
        return completion

    def upgrade_last_degraded(self, effective: int) -> str | None:
        """Catch-up, once per session: at a compaction event, re-summarize the newest degraded
        segment still in the payload and replace it only if the LLM version is strictly shorter.
        A failed attempt counts toward the circuit breaker like any summarizer failure."""
        degraded = [x for x in self.state.segments if x.degraded and x.level == 0]
        if self.state.breaker.open or self.state.upgrade_done or not degraded:
            return None
        old = degraded[-1]
        events = [e for e in self.host.events() if old.uid_from <= e.uid <= old.uid_to]
        prose, info = self.summarize(events, effective)
        if prose is None:  # the breaker may open on this try: its one notice is said here, else never
            return BREAKER_OPENED if self.state.breaker.failed() else None
        self.state.breaker.succeeded()
        new = seg.build(old.id, events, prose, self.state.plan(effective).block)
        if new.tokens >= old.tokens or new.covered_hash != old.covered_hash:
            return None
        self.state.upgrade_done = True
        seq = self.state.next_seq()
        self.state.rows.start(seq, trigger="upgrade", segment=old.id)
        self.state.rows.declare(seq, {"type": "upgrade", "segment": new.to_json()})
        self.state.rows.finish(seq)
        self.state.honour({"type": "upgrade", "segment": new.to_json()})
        self.host.log("upgrade", segment=old.id, tokens_before=old.tokens, tokens_after=new.tokens,
                    llm_tokens=info.get("llm_tokens", 0))
        return f"segment #{old.id} upgraded from its zero-LLM form: {human(old.tokens)} → {human(new.tokens)} tokens"

    def merge_prose(self, members: list[Segment], effective: int) -> tuple[str | None, dict[str, Any]]:
        """The members' guides merged by the summarizer (the one summary of summaries the design
        allows); (None, info) on any failure or unusable output — the originals then stay."""
        target = min(con.merge_target(members), int(0.2 * effective))
        info: dict[str, Any] = {"target": target, "llm_tokens": 0}
        messages = [{"role": "system", "content": self.host.system_prompt()},
                    *con.merge_messages(members, target, self.language(members[-1].uid_to))]
        info["envelope"] = {"model": self.host.settings().model, "messages": len(messages), "tools": False}
        try:
            completion = self._summarizer_call(messages)
        except Exception as exc:  # a failed consolidation keeps the originals; it never breaks the turn
            info["error"] = f"{type(exc).__name__}: {exc}"
            return None, info
        usage = completion.usage or {}
        info["llm_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        guides = [Event(x.uid_from, self.host.name, 0, "user", x.prose) for x in members]
        prose, why = validate_summary(completion.text, guides, target)
        if prose is None:
            info["error"] = f"merged guide rejected: {why}"
        return prose, info

    def digest_instead(self, seq: int, summary: Segment, events: list[Event], effective: int, tier: str,
                        reason: str, now: int, then: int) -> tuple[int, Segment, dict[str, Any]]:
        """The hard tier's answer to a summary that would not make the payload smaller (a model that
        ignored the target length): the summary's protocol number is aborted, and the zero-LLM digest
        of the same range is made under the next one (started → summary_completed → declared →
        finished, as any compaction). Returns (seq, digest, info) for the caller to check and commit."""
        s = self.host
        self.state.rows.abort(seq, "not_smaller", tokens=[now, then], fallback="degraded")
        s.log("skip", tier=tier, reason="not_smaller", trigger=reason, tokens_before=now, tokens_after=then,
              uid_from=summary.uid_from, uid_to=summary.uid_to, fallback="degraded")
        seq = self.state.next_seq()
        self.state.rows.start(seq, trigger=reason, tier=tier, uid_from=events[0].uid, uid_to=events[-1].uid,
                        fallback="not_smaller")
        digest = seg.build(seq, events, None, self.state.plan(effective).block)
        error = f"the summary would not make the payload smaller ({now} → {then} tokens)"
        self.state.rows.complete(seq, digest, {"envelope": None, "error": error}, degraded=True)
        return seq, digest, {"fallback": True, "error": error, "llm_tokens": 0}

    @staticmethod
    def fallback_note(digests: list[Segment], stuck: str | None, gone: list[Segment], within: bool) -> str:
        """The one notice of a hard-tier compaction whose summary was not smaller: what was kept instead.
        `digests`: what was committed instead; `stuck`: None, or why a range stayed raw because even its
        digest was not smaller ("" after a summary that was not smaller, the summarizer's error after a failure)."""
        if digests:
            ids = f"#{digests[0].id}" if len(digests) == 1 else f"#{digests[0].id}–#{digests[-1].id}"
            text = ("the summary was longer than what it replaced; kept a shorter automatic digest instead "
                    f"(segment{'s' if len(digests) > 1 else ''} {ids}: verbatim heads, tails and fact lines)")
        elif stuck:
            text = (f"summarizer unavailable ({_short(stuck)}), and the automatic digest was not smaller than what "
                    "it would replace; those messages stay as they were")
        else:
            text = ("the summary was longer than what it replaced, and so was the automatic digest; those messages "
                    "stay as they were")
        if gone:
            text += (f"; to fit the usable window, {len(gone)} segment map{'s' if len(gone) > 1 else ''} "
                     f"left the payload (uids {gone[0].uid_from}–{gone[-1].uid_to} stay recallable)")
        if not within:
            text += "; the context is still over the usable window, and nothing older is left to take out"
        return text

    def notes(self, segment: Segment, info: dict[str, Any], tier: str) -> list[str]:
        """Ledger rows and notices for a degraded segment and for the breaker opening (once)."""
        if not segment.degraded:
            return []
        self.host.log("degraded", tier=tier, seq=segment.id, error=info.get("error", ""), uid_from=segment.uid_from,
                    uid_to=segment.uid_to)
        if info.get("breaker"):
            return [BREAKER_OPENED]
        if self.state.breaker.open:
            return []
        return [f"summarizer unavailable ({_short(info.get('error', ''))}); segment #{segment.id} keeps verbatim "
                "heads, tails and fact lines instead"]


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text[:120] + ("…" if len(text) > 120 else "")


def _newest_within(events: Sequence[Event], max_chars: int) -> list[Event]:
    """`events`, or when the compressor would read more than `max_chars` of them, the newest that
    fit, starting at a turn start (a call never without its result). Ranges the cold-range choice
    makes always fit; a fork's whole history may not."""
    if sum(seg.compressor_chars(e) for e in events) <= max_chars:
        return list(events)
    used, start = 0, len(events) - 1
    for i in range(len(events) - 1, -1, -1):
        used += seg.compressor_chars(events[i])
        if used > max_chars and i < len(events) - 1:
            break
        if events[i].turn_start:
            start = i
    return list(events[start:])
