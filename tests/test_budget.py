"""The one budget of the window (issue 43): the plan is pure, the layers and the compactor read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import FakeLLM

from mfs_nb import Session
from mfs_nb.errors import ConfigError
from mfs_nb.settings import Settings
from mfs_nb.window import budget
from mfs_nb.window.usage import ContextProfile

WINDOWS = (4_096, 8_192, 16_384, 32_768, 65_536, 131_072, 200_000, 1_000_000, 10_000_000)


@pytest.mark.parametrize("window", WINDOWS)
def test_the_standing_layers_never_pass_their_share_and_a_compaction_ends_well_under_the_warn_line(window):
    eff = ContextProfile(window).effective
    for settings in (Settings(), Settings(fact_share=0.3, verbatim_share=0.4, knowledge_share=0.2),
                     Settings(fact_share=0, verbatim_share=0, knowledge_share=0)):
        p = budget.plan(eff, settings)
        assert p.standing <= budget.STANDING_LARGE * eff
        assert p.standing <= budget.standing_share(eff) * eff + 1
        assert p.target <= 0.6 * eff < 0.85 * eff  # the next compaction is ≥ 25 % of the window away
        assert p.tail >= budget.TAIL_MIN * eff - 1
        assert p.standing + p.tail >= p.target  # the layers at their ceilings plus the floor reach the target
        assert min(p.block, p.facts, p.verbatim, p.knowledge) >= 0


def test_small_windows_shrink_the_layers_first_and_large_ones_cap_them_in_tokens():
    shares = [budget.plan(ContextProfile(w).effective).standing / ContextProfile(w).effective for w in WINDOWS[:5]]
    assert shares == sorted(shares) and shares[0] < shares[-1] == pytest.approx(budget.STANDING_LARGE, abs=0.01)
    huge = budget.plan(ContextProfile(10_000_000).effective)
    assert (huge.block, huge.facts, huge.verbatim, huge.knowledge) == (
        budget.CAPS["block"], budget.CAPS["facts"], budget.CAPS["verbatim"], budget.CAPS["knowledge"])
    assert huge.tail == huge.target - huge.standing  # what the capped layers leave stays raw


def test_a_layer_turned_off_leaves_its_room_to_the_others_up_to_their_claims():
    eff = ContextProfile(32_768).effective
    on, off = budget.plan(eff, Settings()), budget.plan(eff, Settings(fact_share=0))
    assert off.facts == 0 and off.block > on.block and off.verbatim == on.verbatim
    assert off.block <= 0.35 * eff and on.verbatim == int(0.15 * eff)  # the user's own words get their claim
    no_slot = budget.plan(eff, Settings(knowledge_share=0))
    assert no_slot.knowledge == 0 and no_slot.block > on.block
    small = budget.plan(ContextProfile(8_192).effective, Settings())
    assert small.verbatim + small.knowledge <= budget.FIRST * budget.standing_share(small.effective) * small.effective


def test_the_architecture_page_shows_the_plan_the_code_makes():
    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    section = text.split("## One budget", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if re.match(r"\| [\d,]+ \|", line)]
    assert rows == budget.table()


def test_the_session_reads_every_layer_from_the_plan(store_dir):
    s = Session("plan", store=store_dir, window_tokens=16_384, llm=FakeLLM())
    p = s.plan()
    assert p == budget.plan(s.usage().effective, s.settings)
    assert s.knowledge_budget() == p.knowledge
    assert s.compactor.plan(s.usage().effective) == p


def test_a_compaction_ends_near_the_target_and_keeps_the_rest_raw(store_dir):
    s = Session("ends", store=store_dir, window_tokens=16_384, llm=FakeLLM(default="Noted."),
                background_compaction=False)
    eff = s.usage().effective
    afters = []
    for i in range(140):
        s.chat(f"turn {i}: the build on host-{i % 5} took {30 + i} s; keep the cache at /var/cache/b{i}. " * 6)
        rows = [r for r in s.ledger() if r["kind"] == "compaction"]
        if len(rows) > len(afters):
            afters.append(rows[-1]["tokens_after"])
    assert len(afters) >= 2
    p = s.plan()
    for after in afters:  # each ends under the target (or the layers at their ceilings and the raw tail's
        # floor, where a small window's fill leaves less) plus one turn's slack, far under the warn line
        assert after <= p.standing + p.tail + 0.08 * eff < 0.85 * eff
    view = s.send_view()
    raw = sum(x.tokens for x in view.layers if x.kind == "raw")
    assert raw >= p.tail * 0.8  # the raw tail kept is at least about the plan's floor


def test_a_segments_fact_list_follows_the_sessions_own_plan(store_dir):
    """A smaller fact track leaves the block more room (`budget.plan`), and a segment's fact list, an
    eighth of the block, reads the session's plan rather than the default one."""
    from mfs_nb.layers import segments as seg

    s = Session("fb", store=store_dir, window_tokens=16_384, llm=FakeLLM(default="Noted, that is done. " * 40),
                fact_share=0.05, background_compaction=False)
    eff = s.usage().effective
    mine, default = s.plan().block, budget.plan(eff).block
    assert seg.fact_budget(mine)[0] > seg.fact_budget(default)[0]
    for i in range(60):  # short lines, so the fact list's line cap (tokens ÷ 45) decides how many it keeps
        s.chat(f"ran `make b{i}`")
    if not s.compactor.segments:
        s.compact()
    first = s.compactor.segments[0]
    lines = [x for x in first.facts.splitlines() if x.startswith("- ")]
    assert seg.fact_budget(default)[0] < len(lines) <= seg.fact_budget(mine)[0]


def test_a_compaction_of_short_questions_and_long_answers_reserves_only_what_the_tracks_would_take(store_dir):
    """The user-verbatim track takes the range's user messages, within its ceiling: when they are a few
    words each, a compaction keeps that room as raw tail instead of reserving the track's ceiling, and
    ends near the target rather than far under it."""
    s = Session("short", store=store_dir, window_tokens=32_768, background_compaction=False,
                llm=FakeLLM(default="The run finished and the numbers are in the table above. " * 30))
    eff = s.usage().effective
    afters = []
    for i in range(150):
        s.chat(f"next {i}?")
        rows = [r for r in s.ledger() if r["kind"] == "compaction"]
        if len(rows) > len(afters):
            afters.append(rows[-1]["tokens_after"])
    assert afters
    p = s.plan()
    verbatim = sum(x.tokens for x in s.send_view().layers if x.kind == "verbatim")
    assert verbatim < p.verbatim / 2  # the track holds far less than its ceiling ...
    assert all(after <= p.target + 0.08 * eff for after in afters)
    # ... and the first compaction (before the block settles) left that room to the raw tail: it ends
    # near the target, where sizing the track at its ceiling ended it at 38 % of the window
    assert afters[0] >= p.target - 0.1 * eff



def _compaction_ends(window: int, **settings) -> list[tuple[str, float]]:
    from test_clearing import coding_transcript

    from mfs_nb.commands.replay import normalise, replay

    seen: dict = {}
    replay(normalise(coding_transcript(60, 1800)), window=window, keep=lambda s: seen.setdefault("rows", s.ledger()),
           **settings)
    eff = ContextProfile(window).effective
    return [(r["trigger"], r["tokens_after"] / eff) for r in seen["rows"] if r["kind"] == "compaction"]


def test_a_compaction_riding_on_a_clearing_ends_at_the_planned_fill():
    """Issue 67: a compaction that rides on a clearing's cache miss keeps raw what the layers leave under
    the fill, measured as the payload sends it (a cleared result as its placeholder), and leaves no room
    for what would arrive before the compress line, since it is committed at once. Before, on this
    tool-heavy session at 32k it ended at 25 % and 34 % of the usable window (the tail was counted in
    the log's tokens and room was left for arrivals that never came)."""
    for window, settings in ((16_000, {}), (32_000, {}), (32_000, {"budget": "lean"})):
        ends = _compaction_ends(window, **settings)
        assert ends and {t for t, _ in ends} == {"with clearing"}
        fill = budget.fill_share(Settings(**settings), ContextProfile(window).effective)
        assert all(fill - 0.12 <= share <= fill for _, share in ends), (window, settings, ends)
    assert budget.fill_share(Settings(), ContextProfile(32_000).effective) == budget.FILLS["balanced"]


def test_the_fill_is_one_setting_with_bounds_named_when_refused():
    assert budget.fill_share(Settings()) == budget.FILLS["balanced"]
    assert budget.fill_share(Settings(budget="lean")) == 0.40 and budget.fill_share(Settings(budget="rich")) == 0.70
    assert budget.fill_share(Settings(budget="lean", fill=0.5)) == 0.5  # an explicit fill wins
    assert budget.fill_share(Settings(budget="rich", warn_at=0.6)) == pytest.approx(0.45)  # under a lowered warn line
    small, eff = ContextProfile(8_192).effective, ContextProfile(32_768).effective
    assert budget.fill_share(Settings(), small) < budget.fill_share(Settings(), 13_000) < budget.fill_share(Settings(), eff)
    assert budget.fill_share(Settings(), small) == pytest.approx(0.55 * budget.window_factor(small))
    assert budget.fill_share(Settings(), small) < 0.35
    assert budget.fill_share(Settings(fill=0.5), small) == 0.5  # an explicit fill is the person's own
    lean, rich = budget.plan(eff, Settings(budget="lean")), budget.plan(eff, Settings(budget="rich"))
    assert lean.target < budget.plan(eff).target < rich.target
    assert lean.facts < rich.facts and lean.block < rich.block  # the layers are shares of the fill
    assert rich.standing / rich.target == pytest.approx(lean.standing / lean.target, abs=0.01)
    for bad, bound in ((dict(fill=0.2), "0.2"), (dict(fill=0.85), "0.85"), (dict(fill=0.9), "0.85"),
                       (dict(budget="huge"), "lean, balanced, rich"), (dict(fill=0.6, warn_at=0.6), "warn line")):
        with pytest.raises(ConfigError, match=re.escape(bound)) as err:
            Settings().with_values(**bad)
        assert "\n" not in str(err.value)


def test_standing_layers_over_the_fill_are_named_once_with_the_layer_and_by_how_much(store_dir, monkeypatch):
    from dataclasses import replace

    from mfs_nb.layers.view import Layer

    p = budget.plan(ContextProfile(32_768).effective)
    layers = [Layer("system", None, None, 100), Layer("knowledge", None, None, p.target + 500),
              Layer("facts", 1, 9, p.facts), Layer("raw", 10, 20, 3_000)]
    line = budget.over_fill(p, layers)
    assert line is not None and "\n" not in line
    assert "the knowledge slot holds" in line and f"{p.target + 500 - p.knowledge:,} over its share" in line
    assert "%mfs unpin" in line
    assert budget.over_fill(p, layers[:1] + layers[2:]) is None  # the raw tail never counts

    s = Session("over", store=store_dir, window_tokens=16_384, llm=FakeLLM(default="ok"))
    s.pin({"db_limit": "120", "region": "eu-west-1"})
    small = replace(s.plan(), target=5)
    monkeypatch.setattr(Session, "plan", lambda self: small)
    s.chat("hello")
    assert any(n.startswith("the standing layers alone take") for n in s.last_plan.notices)
    s.chat("again")
    assert not any(n.startswith("the standing layers alone take") for n in s.last_plan.notices)  # once
    rows = [r for r in s.ledger() if r["kind"] == "over_fill"]
    assert len(rows) == 1 and rows[0]["target"] == 5 and "the knowledge slot holds" in rows[0]["detail"]
    assert rows[0]["layers"]["knowledge"] == next(x.tokens for x in s.send_view().layers if x.kind == "knowledge")


def test_the_budget_setting_says_where_compactions_end_and_what_100_calls_cost():
    from mfs_nb.models.cost import budget_line, price

    eff = ContextProfile(200_000).effective
    model = "anthropic/claude-sonnet-4-5"
    rates = price(model)
    assert rates is not None
    lines = {b: budget_line(model, Settings(model=model, budget=b), eff) for b in budget.FILLS}
    for b, fill in budget.FILLS.items():
        mid = int((fill + 0.85) / 2 * eff)
        assert f"budget {b} ({fill:.0%}): a compaction ends at {int(fill * eff):,} tokens" in lines[b]
        assert f"${100 * mid * rates['read']:,.2f}–${100 * mid * rates['input']:,.2f} of input per 100 calls" in lines[b]
    assert "fill 50%" in budget_line(model, Settings(model=model, fill=0.5), eff)
    assert "no price for" in budget_line("openai/my-own-model-xyz", Settings(), eff)
