"""The call planner: what the memory layer does before each model call (S2 clearing, the compaction
tiers, the notices), the request itself with its cache hints and prompt-too-long retries, and
`%compact` with its preview and undo."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import lang
from ..errors import PromptTooLong
from ..events import now_iso
from ..layers import clearing
from ..layers.clearing import Clearing
from ..layers.view import SendView, drop_oldest_rounds
from ..models.llm import LLM, Completion
from ..models.prompt_cache import fingerprint, hints_for
from ..window import budget
from ..window.usage import TIERS, Usage, human, tier_label
from .parts import CALLS_BATCH, HISTORY, PTL_TRIES, CallPlan, shared_prefix_tokens
from .projection import Projection


class CallPlanner(Projection):
    """Before, and around, one model call."""

    def prepare_call(self) -> CallPlan:
        """What the memory layer does before a model call: project, measure, act on the tier.

        The tier comes from the same `Usage` the status line shows (docs/architecture.md, "Token
        accounting and the compaction tiers")."""
        view = self.send_view()
        usage = self.usage(view)
        notices: list[str] = list(self.compactor.recovered) + self.verbatim.notices
        self.compactor.recovered.clear()
        self.verbatim.notices.clear()
        cleared: list[str] = []
        if self.settings.tool_clearing and TIERS.index(usage.tier) >= TIERS.index("warn"):
            tier = usage.tier
            view, usage, cleared = self._clear_tool_results(view, usage)
            notices += cleared
        if self.settings.auto_compaction:
            sync = not self.settings.background_compaction
            acted = self.compactor.on_tier(usage.tier, synchronous_background=sync, effective=usage.effective,
                                           cleared=bool(cleared))
            if cleared and not acted:
                # the clearing has already paid the cache miss from the history layers on, where a new
                # segment would go: a compaction ready now costs nothing more (one reset, not two)
                acted = self.compactor.piggyback(tier, sync, usage.effective)
            if acted:
                notices += acted
                view = self.send_view()
                usage = self.usage(view)
                compacted = self.compactor.last_compaction_call == self.compactor.calls  # not a skip notice
                if compacted and self.settings.tool_clearing and not cleared:  # clear what the miss paid for
                    view, usage, cleared = self._clear_tool_results(view, usage, min_gain=0.0)
                    notices += cleared
        notices += self._act_on_tier(usage)
        over = budget.over_fill(self.plan(), view.layers)
        if over != self._over_fill:  # once per change: no compaction can bring such a payload to the fill
            self._over_fill = over
            if over:
                notices.append(over)
                self._log("over_fill", tokens=usage.tokens, target=self.plan().target, detail=over,
                          layers={x.kind: x.tokens for x in view.layers if x.kind in budget.LAYERS})
        entry = {"call": (self.history[-1]["call"] + 1) if self.history else 1, "turn": self.turn,
                 "tokens": usage.tokens, "tier": usage.tier, "acted": bool(notices), "at": now_iso()}
        self.history.append(entry)
        if len(self.history) > 2 * HISTORY:
            del self.history[:-HISTORY]  # memory does not grow with the number of calls
        if len(self._calls_pending) >= CALLS_BATCH:
            self._flush_calls()  # before this call's row, which the provider's usage completes after the reply
        self._calls_pending.append(entry)
        self._last_prefix_ratio = self._prefix_ratio(view)
        self._last_payload = view.messages
        self.last_plan = CallPlan(view, usage, notices)
        return self.last_plan

    def _clear_tool_results(self, view: SendView, usage: Usage,
                            min_gain: float = clearing.MIN_GAIN) -> tuple[SendView, Usage, list[str]]:
        """S2 at the warn line: clear old tool results (and, if still needed, long old arguments)
        in one go, only forward, the oldest rounds first and as few as bring the payload under the
        clearing target, and only when it frees enough to be worth a cache miss (`min_gain` of the
        usable window; any gain right after a compaction that left the payload over that target, since
        the compaction has paid the miss already)."""
        starts = clearing.rounds(self._events)
        if not starts:
            return view, usage, []
        current = self.clearing_state()
        keep = [starts[-n] for n in (clearing.KEEP_ROUNDS, 1) if len(starts) >= n]
        options = [(keep[0], current.prune_before), (keep[0], keep[0])] + ([(keep[1], keep[1])] if len(keep) > 1 else [])
        target = (self.profile().warn - clearing.HEADROOM) * usage.effective
        if usage.tokens < target:  # right after a compaction that got there: nothing to clear
            return view, usage, []
        # about the fewest old rounds that get there; only when clearing up to the kept rounds cannot, the
        # options that keep fewer rounds or stub old arguments too
        best = self._clear_to_target(current, [u for u in starts if current.clear_before < u <= keep[0]], target)
        for clear_before, prune_before in options if best is None else []:
            option = replace(current, clear_before=max(current.clear_before, clear_before),
                             prune_before=max(current.prune_before, prune_before))
            if option == current:
                continue
            new_view = self.send_view(option)
            best = (option, new_view, self.usage(new_view))
            if best[2].tokens < target:
                break
        if best is None or (gain := usage.tokens - best[2].tokens) <= 0 or gain < min_gain * usage.effective:
            return view, usage, []
        option, new_view, new_usage = best
        self._clear_before, self._prune_before = option.clear_before, option.prune_before
        before, after = view.clearing, new_view.clearing
        cleared = after.cleared - before.cleared
        chars = after.chars_saved - before.chars_saved
        self._log("clearing", tier=usage.tier, tokens_before=usage.tokens, tokens_after=new_usage.tokens,
                  cleared=cleared, trimmed=after.trimmed, pruned=after.pruned - before.pruned, chars_saved=chars,
                  tokens_saved=usage.tokens - new_usage.tokens, clear_before=option.clear_before,
                  prune_before=option.prune_before)
        text = f"cleared {cleared} old tool result{'s' if cleared != 1 else ''} (−{human(chars)} chars)"
        if after.pruned > before.pruned:
            text += f" and stubbed the long arguments of {after.pruned - before.pruned} old tool calls"
        return new_view, new_usage, [text]

    def _clear_to_target(self, current: Clearing, starts: list[int], target: float
                         ) -> tuple[Clearing, SendView, Usage] | None:
        """The clearing that clears about the fewest old results (the oldest first, whole rounds) and
        brings the payload under `target`, by bisection over the round starts (the payload shrinks with
        the boundary except where a result no longer than its placeholder adds fact lines: then a
        boundary a little later than the fewest); what it returns was measured under `target`. None
        when even the last allowed round start does not get there."""
        def at(i: int) -> tuple[Clearing, SendView, Usage]:
            option = replace(current, clear_before=starts[i])
            view = self.send_view(option)
            return option, view, self.usage(view)

        if not starts:
            return None
        last = at(len(starts) - 1)
        if last[2].tokens >= target:
            return None
        lo, hi, best = 0, len(starts) - 1, last
        while lo < hi:
            mid = (lo + hi) // 2
            got = at(mid)
            if got[2].tokens < target:
                best, hi = got, mid
            else:
                lo = mid + 1
        return best

    def _act_on_tier(self, usage: Usage) -> list[str]:
        """Says where the context stands, once per tier change (the ledger keeps a row)."""
        previous, self._last_tier = self._last_tier, usage.tier
        if usage.tier == previous or usage.tier == "ok" or TIERS.index(usage.tier) < TIERS.index(previous):
            return []
        language = self.language()
        text = lang.text("tier", language, share=usage.percent, tier=tier_label(usage.tier, language,
                                                                             usage.tokens >= usage.effective))
        if usage.tier == "hard" and not self.settings.auto_compaction:
            text += "; automatic compaction is off: run %compact, or start a fresh session with %mfs new NAME"
        self._log("tier", tier=usage.tier, tokens=usage.tokens, effective=usage.effective)
        return [text]

    def compaction_ahead(self, usage: Usage, view: SendView | None = None) -> str | None:
        """A warning ahead of an automatic compaction: when the next call would pass the compaction line
        if the context grew as much as in this call, the uids it would compact (the background
        result's, when one is ready or under way, else the range the compactor would choose now).
        The commit waits for the background summary, so it may come a few replies later."""
        if not self.settings.auto_compaction or usage.tier in ("compress", "hard") or len(self.history) < 1:
            return None
        # the growth from one call to the next (the last user message and reply); with one call
        # only, what this call's reply added
        growth = (int(self.history[-1]["tokens"]) - int(self.history[-2]["tokens"]) if len(self.history) > 1
                  else usage.tokens - int(self.history[-1]["tokens"]))
        growth = max(growth, usage.tokens - int(self.history[-1]["tokens"]), 0)
        line = self.profile().compress * usage.effective
        if usage.tokens + growth < line:
            return None
        pending = self.compactor.pending
        events = pending.events if pending is not None else self.compactor.choose(usage.effective)[0]
        if not events:
            return None
        return lang.text("ahead", self.language(), share=usage.percent,
                         line=f"{self.profile().compress:.0%}", a=events[0].uid, b=events[-1].uid) + self._miss_cost(view)

    def _miss_cost(self, view: SendView | None = None) -> str:
        """What the coming compaction's cache miss costs: the payload after the summaries (the fact and
        verbatim tracks, the raw tail) is sent again past the cache — in tokens, and in dollars at the
        chat model's cache-write and cache-read rates where they are known."""
        miss = sum(x.tokens for x in (view or self.send_view()).layers if x.kind in ("facts", "verbatim", "raw"))
        weight = self.miss_weight()
        if weight is None or miss <= 0:
            return lang.text("ahead_miss", self.language(), tokens=f"{miss:,}")
        from ..models.cost import price

        rates = price(self.settings.model) or {"write": 0.0, "read": 0.0}
        dollars = miss * max(rates["write"] - rates["read"], 0.0)
        return lang.text("ahead_miss_priced", self.language(), tokens=f"{miss:,}", dollars=f"${dollars:.4f}",
                         model=self.settings.model)

    def _call_with_ptl_retry(self, plan: CallPlan, tools: list[dict[str, Any]] | None, stream: bool,
                             on_delta: Callable[[str], None] | None, on_reset: Callable[[], None] | None,
                             notices: list[str]) -> tuple[Completion, SendView]:
        """Prompt-too-long: drop the oldest rounds of this request only (the log keeps them) until the
        gap the provider named is covered, else 20 % of the rounds; at most 3 tries."""
        view = plan.view
        for attempt in range(PTL_TRIES + 1):
            try:
                return self._complete(view, self.sent_messages(view, plan.usage), tools, stream, on_delta,
                                      on_reset, notices), view
            except PromptTooLong as exc:
                if attempt == PTL_TRIES:
                    raise PromptTooLong(f"the request is still too long after {PTL_TRIES} retries ({exc}); "
                                        "run %compact or start a fresh session with %mfs new NAME") from None
                starts = {e.uid for e in self._events if e.turn_start}
                smaller = drop_oldest_rounds(view, self.token_counts(view), starts, exc.gap_tokens)
                if smaller is None:
                    raise
                dropped = smaller.layers[1] if len(smaller.layers) > 1 else None
                self._log("ptl_retry", attempt=attempt + 1, gap_tokens=exc.gap_tokens,
                          dropped_from=dropped.uid_from if dropped else None, dropped_to=dropped.uid_to if dropped else None)
                notices.append(f"the provider said the request was too long; retried without the oldest rounds "
                               f"(uids {dropped.uid_from}–{dropped.uid_to}, still recallable)" if dropped else
                               "the provider said the request was too long; retried with fewer rounds")
                view = smaller
        raise AssertionError("unreachable")

    def _complete(self, view: SendView, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  stream: bool, on_delta: Callable[[str], None] | None, on_reset: Callable[[], None] | None,
                  notices: list[str]) -> Completion:
        """One request. The litellm client is also told where the payload's stable points are, and
        applies each endpoint's cache rules to them (`prompt_cache`); an injected model gets the bare call."""
        if not (self.settings.prompt_cache and isinstance(self.llm, LLM)):
            return self.llm.complete(messages, tools=tools, stream=stream, on_delta=on_delta, on_reset=on_reset)
        last = view.messages[-1].get("content") if view.messages else None
        note = messages[-1]["content"][len(last):] if messages is not view.messages and isinstance(last, str) else ""
        hints = hints_for(view.layers, len(messages), note, self._cache_key, self._cache_anchor, view.messages)
        try:
            completion = self.llm.complete(messages, tools=tools, stream=stream, on_delta=on_delta,
                                           on_reset=on_reset, cache=hints)
        finally:
            notices.extend(self.llm.take_notes())
        if hints.anchor is not None:  # the next call may mark this anchor again if all before it is unchanged
            self._cache_anchor = (hints.anchor, fingerprint(view.messages, hints.anchor))
        return completion

    def compact(self, focus: str = "") -> list[str]:
        """Compact now (`%compact [focus]`): the same path as the automatic one. Returns notices;
        "nothing to compact" when there is nothing."""
        self.check_writable()
        with self._lock:
            return self.compactor.compact(self.usage().tier, "manual", focus, manual=True)

    def undo_compaction(self) -> list[str]:
        """Retract the newest segment (`%compact --undo`), append-only; notices say what happened."""
        self.check_writable()
        with self._lock:
            return self.compactor.undo()

    def compact_preview(self, focus: str = "") -> dict[str, Any]:
        """What `compact(focus)` would do now, committing nothing (`%compact --preview`): the range,
        the segment text, payload tokens before and after, and the tokens the next call would read
        again because the cached prefix ends where the segment goes. The summary is really made
        (one LLM call, in the ledger as a `preview` row); nothing is declared."""
        from ..layers.segments import build

        self.check_writable()
        with self._lock:
            now = self.send_view()
            before = self.usage(now)
            events, why = self.compactor.choose(before.effective, small_ok=True)
            if not events:
                return {"nothing": (why or "nothing raw").replace("_", " ")}
            prose, info = self.compactor.summarize(events, before.effective, focus)
            segment = build(self.compactor.seq + 1, events, prose, before.effective)
            # the trial segment is in force for one projection; what other threads read of the
            # session (Host.segments: the indexer, search) leaves it out
            with self.compactor.trying(segment):
                then = self.send_view()
            shared = shared_prefix_tokens(now.messages, then.messages, self.token_counts(now).__getitem__)
            out = {"uid_from": segment.uid_from, "uid_to": segment.uid_to, "messages": len(events),
                   "tokens_before": before.tokens, "tokens_after": self.usage(then).tokens,
                   "cache_miss_tokens": max(before.tokens - shared, 0), "segment_tokens": segment.tokens,
                   "degraded": segment.degraded, "llm_tokens": info.get("llm_tokens", 0),
                   "error": info.get("error"), "focus": focus}
            out["would_commit"] = out["tokens_after"] < out["tokens_before"]  # as compact() decides
            self._log("preview", **out)
            return out | {"segment_text": segment.render()}
