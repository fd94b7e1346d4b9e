"""Sequoia at run time: the planner sizes trees from the machine's cost curve and the session's
acceptance, the tree strategy stays lossless, and its cost curve is measured once and cached."""

import json

import pytest

from specdec.engine.acceptance import TreeVerdict
from specdec.engine.cost_curve import CostCurve
from specdec.engine.drafters.draft_tree import DraftTree
from specdec.engine.drafters.union_tree import UnionTree
from specdec.engine.sampling import SamplingConfig
from specdec.engine.session import GenerationConfig, greedy_reference
from specdec.engine.strategies import (
    make_drafter,
    make_session,
    needs_cost_curve,
    needs_draft_model,
)
from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_plan import TreePlanner
from specdec.engine.tree_shape import TreeShape
from specdec.engine.tree_stats import AcceptanceVector
from specdec.errors import SpecdecError

FLAT = CostCurve((1, 64), (0.010, 0.011))  # a GPU: 64 tokens cost what one costs
STEEP = CostCurve((1, 2, 33), (0.010, 0.020, 0.330))  # every token costs a full pass
CPU = CostCurve((1, 8, 33), (0.010, 0.013, 0.030))  # a little per token


def trained(p: list[float], rounds: int = 400) -> AcceptanceVector:
    """An acceptance vector that has seen rank r win with probability p[r] (deterministic fractions)."""
    vector = AcceptanceVector(width=len(p))
    for i in range(rounds):
        u = (i * 0.6180339887) % 1.0
        winner, total = None, 0.0
        for rank, pr in enumerate(p):
            total += pr
            if u < total:
                winner = rank
                break
        vector.observe_position(range(len(p)), winner)
    return vector


def test_flat_cost_buys_a_wide_tree_and_steep_cost_a_chain_or_nothing():
    acceptance = trained([0.5, 0.25, 0.1, 0.05])
    wide = TreePlanner(FLAT, acceptance, max_nodes=32, draft_level_seconds=0.001).plan(32)
    assert not wide.is_chain and wide.width >= 2 and len(wide) >= 8
    steep = TreePlanner(STEEP, acceptance, max_nodes=32, draft_level_seconds=0.001).plan(32)
    assert len(steep) <= 2 and steep.is_chain


def test_a_draft_that_keeps_missing_gets_no_tree_at_all():
    """Drafting must pay for itself: a level that costs half a pass and a draft right 5% of the time is
    worth less than a plain step, and the drafter then proposes nothing."""
    planner = TreePlanner(CPU, trained([0.05, 0.0, 0.0]), draft_level_seconds=0.005, explore_every=4)
    assert [len(planner.plan(16)) for _ in range(9)] == [0, 0, 0, 2, 0, 0, 0, 2, 0]  # now and then a probe
    assert len(planner.plan(1)) == 0 and len(planner.plan(1)) == 0 and len(planner.plan(1)) == 1  # within the cap


def test_the_plan_respects_the_cap_and_the_session_budget():
    planner = TreePlanner(FLAT, trained([0.9, 0.05]), max_nodes=6, draft_level_seconds=0.0001)
    assert len(planner.plan(32)) <= 6 and len(planner.plan(3)) <= 3
    assert len(planner.plan(0)) == 0


def test_a_row_that_sums_to_one_is_not_rounded_past_it():
    """A draft that is nearly always right: 0.866 + 0.044 + ... = 1 rounds (to nearest) to 1.01, which the
    program refuses; the planner rounds down."""

    class Rows:
        def rows(self, depths):
            return [[0.866, 0.044, 0.034, 0.024, 0.016, 0.006, 0.005, 0.005]] * depths

    assert sum(round(p, 2) for p in Rows().rows(1)[0]) > 1.0
    shape = TreePlanner(FLAT, Rows(), max_nodes=8, draft_level_seconds=0.0001).plan(8)
    assert len(shape) == 8


def test_draft_level_cost_is_learnt_from_timings_and_starts_from_a_prior():
    planner = TreePlanner(CPU, trained([0.8, 0.1]))
    planner.plan(8)
    assert planner.draft_level_seconds is None  # the prior (level_prior x one pass) was used
    tree = TokenTree([5, 6, 7], [ROOT, 0, ROOT])
    planner.observe(tree, TreeVerdict([0, 1], [5, 6], 9, True), draft_seconds=0.04, levels=2)
    assert planner.draft_level_seconds == pytest.approx(0.02)
    planner.observe(tree, TreeVerdict([0, 1], [5, 6], 9, True), draft_seconds=0.0, levels=2)  # untimed: ignored
    assert planner.draft_level_seconds == pytest.approx(0.02)
    planner.observe(tree, TreeVerdict([0, 1], [5, 6], 9, True), draft_seconds=0.08, levels=2)
    assert planner.draft_level_seconds == pytest.approx(0.7 * 0.02 + 0.3 * 0.04)  # up: smoothly
    planner.observe(tree, TreeVerdict([0, 1], [5, 6], 9, True), draft_seconds=0.01, levels=2)
    assert planner.draft_level_seconds == pytest.approx(0.005)  # down: at once (a warm-up outlier is forgotten)


def test_the_drafter_fills_the_planned_shape_cut_to_the_sessions_budget(target, tok):
    planner = TreePlanner(FLAT, trained([0.5, 0.25, 0.1]), max_nodes=12, draft_level_seconds=0.0001)
    drafter = DraftTree(target, planner=planner)
    context = tok.encode("def add(a, b):\n    return")
    draft = drafter.propose(context, 12, SamplingConfig(temperature=0))
    assert not planner.last.is_chain and TreeShape.of(draft.tree) == planner.last
    drafter.observe(draft, 0, 0.01, 0.01, verdict=TreeVerdict([], [], 0, False))
    planner.draft_level_seconds = 0.0001  # the tiny model's real level time, on a busy machine, is not the point here
    small = drafter.propose(context, 3, SamplingConfig(temperature=0))
    assert len(small.tree) == len(planner.last) <= 3


def test_the_tree_strategy_needs_a_draft_model_and_a_cost_curve(target):
    assert needs_draft_model("tree") and needs_cost_curve("tree") and not needs_cost_curve("auto", draft_model=False)
    with pytest.raises(SpecdecError, match="needs a draft model"):
        make_drafter("tree", None, cost_curve=CPU)
    with pytest.raises(SpecdecError, match="cost curve"):
        make_drafter("tree", target)
    drafter = make_drafter("tree", target, max_draft=5, cost_curve=CPU)
    assert isinstance(drafter, UnionTree) and drafter.planner.max_nodes == 5
    assert isinstance(drafter.model, DraftTree) and drafter.model.planner is None  # one planner: the union's
    assert drafter.repo is None and drafter.lookup.min_ngram == 3  # no index given; lookups on a real repeat


def test_auto_plans_its_draft_model_with_the_cost_curve_and_drafts_chains_without_one(target):
    from specdec.engine.drafters.draft_model import DraftModel

    assert needs_cost_curve("auto") and not needs_cost_curve("auto", draft_model=False)
    auto = make_drafter("auto", target, max_draft=6, cost_curve=CPU)
    member = auto.members()[-1]
    assert isinstance(member, DraftTree) and member.planner.cost is CPU and member.planner.max_nodes == 6
    assert auto.name == "lookup+draft"  # the per-source statistics keep calling the draft model's drafts `draft`
    chain = make_drafter("auto", target).members()[-1]  # no curve (a caller that measured none): chains
    assert type(chain) is DraftModel


def test_auto_drafts_chains_where_the_drafts_attention_takes_no_tree_mask(target, monkeypatch):
    from specdec.engine.drafters.draft_model import DraftModel

    monkeypatch.setattr(target.config, "_attn_implementation", "flash_attention_2")
    assert type(make_drafter("auto", target, cost_curve=CPU).members()[-1]) is DraftModel
    with pytest.raises(SpecdecError, match="custom mask"):
        make_drafter("tree", target, cost_curve=CPU)


BIG_FLAT = CostCurve((1, 64), (1.0, 1.1))  # a big target on a GPU: the tiny draft's levels cost ~nothing beside it
BIG_STEEP = CostCurve((1, 2, 33), (1.0, 2.0, 33.0))  # every verified token costs a full pass


@pytest.mark.parametrize("curve", [BIG_STEEP, BIG_FLAT], ids=["steep", "flat"])
def test_auto_picks_a_chain_or_a_tree_as_the_cost_curve_says_and_stays_plain_greedy(target, tok, curve):
    session = make_session(target, tok, "auto", target, cost_curve=curve)  # the draft is the target: always right
    planner = session.drafter.members()[-1].planner
    plans = []
    plan = planner.plan
    planner.plan = lambda cap: plans.append(plan(cap)) or plans[-1]
    branched = drafted = 0
    for text in ("def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n  "):
        prompt = tok.encode(text)
        out = session.generate(prompt, GenerationConfig(max_new_tokens=20, sampling=SamplingConfig(temperature=0)))
        assert out.tokens == greedy_reference(target, prompt, 20, {tok.eos_token_id})
        branched, drafted = branched + out.stats.tree_passes, drafted + out.stats.drafted_by.get("draft", 0)
    assert drafted > 0 and plans
    if curve is BIG_STEEP:
        assert branched == 0 and all(p.is_chain for p in plans if len(p))
    else:
        assert branched > 0 and any(not p.is_chain for p in plans)


def test_tree_strategy_equals_plain_greedy_and_its_planner_learns(target, unrelated_draft, tok):
    measured = make_session(target, tok, "tree", unrelated_draft).cost_curve  # measured on the target
    assert measured.tokens[0] == 1 and measured.tokens[-1] == 33 and measured(1) > 0
    session = make_session(target, tok, "tree", unrelated_draft, cost_curve=CPU)  # a known machine
    for text in ("def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n  "):
        prompt = tok.encode(text)
        out = session.generate(prompt, GenerationConfig(max_new_tokens=20, sampling=SamplingConfig(temperature=0)))
        assert out.tokens == greedy_reference(target, prompt, 20, {tok.eos_token_id})
    planner = session.drafter.planner
    assert planner.last is not None and planner.draft_level_seconds is not None
    assert planner.acceptance.vector() != AcceptanceVector(width=planner.acceptance.width).vector()


def test_the_cost_curve_is_measured_once_per_key(target, unrelated_draft, tok, tmp_path, monkeypatch):
    from specdec.engine import strategies

    measured = []
    real = strategies.target_cost_curve

    def counting(kv, key=None):
        measured.append(key)
        return real(kv, key)

    monkeypatch.setattr(strategies, "target_cost_curve", counting)
    calls = []
    from specdec.engine import cost_curve

    original = cost_curve.measure_cost_curve
    monkeypatch.setattr(cost_curve, "measure_cost_curve", lambda *a, **k: calls.append(1) or original(*a, **k))
    first = make_session(target, tok, "tree", unrelated_draft, cost_key="tiny-fp32")
    second = make_session(target, tok, "tree", unrelated_draft, cost_key="tiny-fp32")
    assert len(calls) == 1 and measured == ["tiny-fp32", "tiny-fp32"]
    assert second.cost_curve.to_json() == first.cost_curve.to_json()
    stored = json.loads((tmp_path / "cache" / "cost_curves.json").read_text())
    assert list(stored) == ["tiny-fp32"]


def test_a_draft_timed_on_a_busier_machine_than_the_curve_is_weighed_in_the_curves_units():
    """The curve is measured once; the draft is timed live. When the target's passes now run 4x slower than
    the curve says (another process), a level timed 4x slower is worth what it was: drafting goes on."""
    quiet = TreePlanner(CPU, trained([0.8, 0.1]), draft_level_seconds=0.004)
    busy = TreePlanner(CPU, trained([0.8, 0.1]), draft_level_seconds=0.016)
    assert len(quiet.plan(8)) > 0 and len(busy.plan(8)) == 0  # without knowing the machine is busier
    tree = TokenTree([5], [ROOT])
    busy.observe(tree, TreeVerdict([0], [5], 9, True), draft_seconds=0.016, levels=1, pass_seconds=4 * CPU(2))
    assert busy.slowdown == pytest.approx(4.0)
    assert busy.plan(8) == quiet.plan(8)
