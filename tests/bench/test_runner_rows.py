"""The benchmark's per-hole line shows what the planner chose for `auto` as for `tree`: nodes and depth per
drafting pass, and how many passes branched."""

from specdec_bench.runner import stats_row, tree_note
from specdec.engine.cost_curve import CostCurve
from specdec.engine.sampling import SamplingConfig
from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import make_session

FLAT = CostCurve((1, 64), (1.0, 1.1))  # a big target on a GPU: trees pay
STEEP = CostCurve((1, 2, 33), (1.0, 2.0, 33.0))  # every verified token costs a full pass: chains


def run(target, tok, strategy: str, curve: CostCurve) -> dict:
    session = make_session(target, tok, strategy, target, cost_curve=curve)  # the draft is the target
    out = session.generate(tok.encode("def add(a, b):\n    return"),
                           GenerationConfig(max_new_tokens=16, sampling=SamplingConfig(temperature=0)))
    return {"strategy": strategy, **stats_row(out.stats)}


def test_auto_rows_show_the_planners_trees_and_chains(target, tok):
    flat, steep = run(target, tok, "auto", FLAT), run(target, tok, "auto", STEEP)
    drafting = flat["target_passes"] - 1
    assert flat["tree_passes"] > 0 and f"{flat['tree_passes']}/{drafting} branched" in tree_note(flat)
    assert steep["tree_passes"] == 0 and f" 0/{steep['target_passes'] - 1} branched" in tree_note(steep)
    assert tree_note(flat).startswith(f" tree: {flat['drafted'] / drafting:.1f} nodes, ")
    assert tree_note({"strategy": "llama-lookup", "target_passes": 5}) == ""  # not one of ours
    assert tree_note({**flat, "target_passes": 1}) == ""  # nothing drafted after the prefill pass


def test_tree_note_is_empty_for_a_strategy_that_drafted_nothing():
    plain = {"strategy": "plain", "target_passes": 48, "drafted": 0, "drafted_depth": 0, "tree_passes": 0}
    assert tree_note(plain) == ""
