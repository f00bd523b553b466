"""Projection and pressure: the exact payload the next call would get (`send_view`), its layers' inputs
(the fact track, the user-verbatim track, where S2 acts), its tokens, and the provider's usage anchor."""

from __future__ import annotations

from typing import Any

from .. import lang
from ..layers import clearing
from ..layers.clearing import Clearing
from ..layers.fact_track import FactTrack, fact_track
from ..layers.segments import Segment
from ..layers.view import SendView, project
from ..window.tokens import message_tokens
from ..window.usage import Usage
from .base import SessionBase
from .parts import shared_prefix_tokens


class Projection(SessionBase):
    """What the model is sent, and how full the window is."""

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
                       self.knowledge.text() if self.settings.knowledge_share else None, self.retried())

    def retried(self) -> dict[int, int]:
        """The events of turns that failed and were asked again at once, word for word, each to the uid of
        the question asked again: the payload leaves them out (the retry takes their place), `recall` marks
        them, nothing is deleted."""
        return self._retries.of(self._events)

    def fact_track(self, track: Any = None, clearing: Clearing | None = None) -> FactTrack | None:
        """The working set and fact lines of history the payload no longer shows as it was: text
        lines of the compacted range, tool lines (files touched, commands run, errors seen) of the
        compacted range and of the range whose tool results and arguments S2 cleared; less what a
        segment in the payload or the user-verbatim track shows; within the plan's fact track. Changes only
        at compaction and clearing events (both already change the payload's structure)."""
        upto = self.compactor.covered_to
        state = clearing or self.clearing_state()
        tool_upto = max(upto, max(state.clear_before, state.prune_before) - 1)
        budget = self.plan().facts
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
        budget = self.plan().verbatim
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

    @property
    def segments(self) -> list[Segment]:
        """Committed segments still in the payload, oldest first."""
        return list(self.compactor.segments)

    def coverage(self) -> dict[str, int]:
        """Every uid is raw in the payload, inside a segment, or in an evicted (recorded) range."""
        view = self.send_view()
        raw = view.raw_uids()
        spans = [(x.uid_from, x.uid_to) for x in self.compactor.segments] + list(self.compactor.evicted)
        retried = self.retried()
        in_segments = sum(1 for e in self._events if e.uid not in raw and any(a <= e.uid <= b for a, b in spans))
        asked_again = sum(1 for e in self._events if e.uid in retried and e.uid not in raw
                          and not any(a <= e.uid <= b for a, b in spans))
        total = len(self._events)
        return {"uids_total": total, "raw": len(raw), "in_segments": in_segments, "asked_again": asked_again,
                "lost": total - len(raw) - in_segments - asked_again}

    def _prefix_ratio(self, view: SendView) -> float | None:
        if self._last_payload is None:
            return None
        counts = self.token_counts(view)
        shared = shared_prefix_tokens(self._last_payload, view.messages, counts.__getitem__)
        return shared / max(view.tokens, 1)

    def budget_note(self, usage: Usage) -> str:
        """The model's own view of its budget (`show_budget`): one line at the tail of the request."""
        return lang.text("budget_note", self.language(), share=usage.percent,
                         line=f"{self.profile().compress:.0%}")

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
