"""The hard tier always ends below the usable window (issue 39 item 7): a summary that would not
make the payload smaller gives way to the zero-LLM digest of the same range — and, when even that
is not enough, to the terminal chain — with one notice; a good summary is still the one used."""

from __future__ import annotations

from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.models.llm import Completion

REPLY = ("Here is how I would think about it: size the pool from the database's limit and the number of "
         "replicas, leave headroom for migrations and manual sessions, and let the retries back off. ") * 4
DIGEST = "kept a shorter automatic digest instead"


class VerboseSummarizer(FakeLLM):
    """A summarizer that ignores the target length: it hands back nearly all of what it read."""

    def complete(self, messages, **kwargs) -> Completion:
        if messages and (messages[-1].get("content") or "").startswith("<<mfs:summarize>>"):
            self.summaries.append(messages)
            body = "\n".join("- " + " ".join((m.get("content") or "").split()) for m in messages[1:-1])
            return Completion(body[: int(len(body) * 0.95)], [], {"prompt_tokens": 100, "completion_tokens": 900},
                              "primary", "fake")
        return super().complete(messages, **kwargs)


def ask(i: int) -> str:
    return (f"Turn {i}: the pool for service-{i % 7} should stay under {20 + i % 10} connections; "
            f"config lives in deploy/pool_{i}.yaml. ")


def _run(store_dir, llm, turns=40):
    s = Session("hard", store=store_dir, window_tokens=8000, llm=llm, background_compaction=False)
    effective = s.usage().effective
    digests, tiers = [], set()
    for i in range(turns):
        reply = s.chat(ask(i))
        tiers.add(s.last_plan.usage.tier)
        notes = [n for n in reply.notices if DIGEST in n]
        assert len(notes) <= 1, reply.notices
        assert not any(n.startswith("nothing worth compacting") for n in reply.notices), (i, reply.notices)
        digests += notes
        # the payload sent, and the payload after the turn, are below the usable window
        assert s.last_plan.usage.tokens < effective, (i, s.last_plan.usage.tokens, reply.notices)
        assert s.usage().tokens < effective, (i, s.usage().tokens, reply.notices)
    return s, digests, tiers


def uncapped(monkeypatch) -> None:
    """Summaries as long as the model wrote them: the cap at a multiple of the guide's target (which
    the one budget keeps small at this window) would otherwise make every summary smaller."""
    from mfs_nb.compaction import summary_check

    monkeypatch.setattr(summary_check, "CAP_FACTOR", 100)


def test_a_summary_that_is_not_smaller_gives_way_to_the_digest_at_the_hard_tier(store_dir, monkeypatch, roomy_layers):
    uncapped(monkeypatch)
    s, digests, tiers = _run(store_dir, VerboseSummarizer(default=REPLY))
    assert "hard" in tiers or digests  # the compaction that needed the fallback ran at the hard line
    assert digests and all(n.startswith("the summary was longer than what it replaced") for n in digests)
    assert any(x.degraded for x in s.compactor.segments) or s.compactor.evicted
    ledger = s.ledger()
    fell_back = [r for r in ledger if r["kind"] == "skip" and r.get("fallback") == "degraded"]
    assert fell_back and all(r["reason"] == "not_smaller" for r in fell_back)
    assert [r for r in ledger if r["kind"] == "degraded" and r.get("reason") == "not_smaller"]
    rows = s.store.load_compactions("hard")
    by_seq: dict[int, list[str]] = {}
    for r in rows:
        by_seq.setdefault(r["seq"], []).append(r["phase"])
    aborted = [r["seq"] for r in rows if r["phase"] == "aborted" and r.get("fallback") == "degraded"]
    assert aborted
    for seq in aborted:  # the summary's number is aborted; the digest is declared under the next one
        assert by_seq[seq] == ["started", "summary_completed", "aborted"]
        assert by_seq[seq + 1] == ["started", "summary_completed", "declared", "finished"]
        declared = next(r for r in rows if r["seq"] == seq + 1 and r["phase"] == "declared")
        assert declared["segment"]["degraded"] is True
    # a restart agrees with what this kernel holds
    again = Session("hard", store=store_dir, window_tokens=8000, llm=FakeLLM(default=REPLY))
    assert [x.id for x in again.compactor.segments] == [x.id for x in s.compactor.segments]
    assert again.compactor.evicted == s.compactor.evicted


def test_a_good_summary_is_still_the_one_used(store_dir):
    s, digests, _ = _run(store_dir, FakeLLM(default=REPLY))
    assert not digests
    assert s.compactor.segments and not any(x.degraded for x in s.compactor.segments)
    assert not [r for r in s.ledger() if r["kind"] in ("degraded", "skip") and r.get("reason") == "not_smaller"]


def test_when_not_even_the_digest_is_smaller_the_terminal_chain_makes_room(store_dir, monkeypatch, roomy_layers):
    uncapped(monkeypatch)
    import mfs_nb.layers.segments as segments

    class Switch(VerboseSummarizer):
        verbose = False

        def complete(self, messages, **kwargs) -> Completion:
            if self.verbose:
                return super().complete(messages, **kwargs)
            return FakeLLM.complete(self, messages, **kwargs)

    llm = Switch(default=REPLY)
    s = Session("chain", store=store_dir, window_tokens=8000, llm=llm, background_compaction=False)
    effective = s.usage().effective
    for i in range(50):  # good summaries first: maps in the block
        s.chat(ask(i))
    assert s.compactor.segments and not s.compactor.evicted
    llm.verbose = True  # then a summarizer that ignores the target, and a digest that is no help either
    monkeypatch.setattr(segments, "degraded_prose", lambda events, *a, **k: "\n".join(e.content * 2 for e in events))
    notes = []
    for i in range(50, 65):
        reply = s.chat(ask(i))
        mine = [n for n in reply.notices if n.startswith("the summary was longer than what it replaced")]
        assert len(mine) <= 1, reply.notices
        notes += mine
        assert not any(n.startswith("nothing worth compacting") for n in reply.notices), (i, reply.notices)
        assert s.last_plan.usage.tokens < effective and s.usage().tokens < effective, (i, reply.notices)
    assert any("and so was the automatic digest" in n and "left the payload" in n for n in notes), notes
    evictions = [r for r in s.ledger() if r["kind"] == "eviction" and r.get("reason") == "over_window"]
    assert evictions and all(r["within"] for r in evictions)
    again = Session("chain", store=store_dir, window_tokens=8000, llm=FakeLLM(default=REPLY))
    assert again.compactor.evicted == s.compactor.evicted
    assert [x.id for x in again.compactor.segments] == [x.id for x in s.compactor.segments]
