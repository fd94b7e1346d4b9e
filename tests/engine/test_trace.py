"""The pass trace (engine/trace.py): the tokens of its records rebuild the completion for every strategy, chains
and trees, greedy and sampling; each pass says how its next token was chosen; the stats are its folds; p and q
are recorded only when asked; the summary sets the i.i.d. formula beside the measured tokens per pass."""

import pytest

from specdec.engine.acceptance import expected_tokens_per_pass
from specdec.engine.cost_curve import CostCurve
from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.composite import Composite
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.drafters.draft_tree import DraftTree, TreeLimits
from specdec.engine.drafters.lookup_tree import LookupTree
from specdec.engine.drafters.prompt_lookup import PromptLookup
from specdec.engine.sampling import SamplingConfig
from specdec.engine.session import GenerationConfig, GenerationStats, Session
from specdec.engine.strategies import make_session
from specdec.engine.trace import BONUS, CORRECTION, PLAIN, PassRecord, SourceSummary, Trace, source_kind
from specdec.engine.tree_plan import TreePlanner
from specdec.engine.tree_shape import TreeShape

FLAT = CostCurve((1, 64), (1.0, 1.1))  # a GPU-like curve: the planner drafts wide trees
GREEDY = SamplingConfig(temperature=0)
SAMPLING = SamplingConfig(temperature=0.9, seed=7)
PROMPTS = ["x = 1\ny = 2\nx = 1\ny = 2\nx =", "def add(a, b):\n    return", "class Point:\n    def"]


class FixedPlan(TreePlanner):
    """Always plans `shape` (cut to the cap), so every drafting pass is a real tree."""

    def __init__(self, shape: TreeShape):
        super().__init__(FLAT, max_nodes=len(shape))
        self.shape = shape

    def plan(self, cap: int) -> TreeShape:
        self.last = TreeShape(self.shape.parents[:cap], self.shape.ranks[:cap])
        return self.last


def session_for(kind, target, unrelated, tok):
    length = lambda: DraftLength(k_max=5, adaptive=False)  # noqa: E731
    if kind == "plain":
        return Session(target, tok)
    if kind == "chain-same":  # a chain the target accepts: bonus tokens
        return Session(target, tok, DraftModel(target, length()))
    if kind == "chain-unrelated":  # a chain the target mostly rejects: corrections
        return Session(target, tok, DraftModel(unrelated, length()))
    if kind == "lookup":
        return Session(target, tok, PromptLookup(max_ngram=3, min_ngram=1, length=length()))
    if kind == "composite":
        return Session(target, tok, Composite(PromptLookup(length=length()), DraftModel(unrelated, length())))
    if kind == "tree-grown":
        return Session(target, tok, DraftTree(unrelated, TreeLimits(budget=6, depth=3, branch=2, width=2)))
    if kind == "tree-planned":
        shape = TreeShape((-1, -1, 0, 0, 1, 2), (0, 1, 0, 1, 0, 0))
        return Session(target, tok, DraftTree(unrelated, planner=FixedPlan(shape)))
    if kind == "union":
        session = make_session(target, tok, "tree", unrelated, cost_curve=FLAT, max_draft=6)
        session.drafter.lookup = LookupTree(max_ngram=4, min_ngram=1)  # a random target repeats only short n-grams
        return session
    raise AssertionError(kind)


KINDS = ["plain", "chain-same", "chain-unrelated", "lookup", "composite", "tree-grown", "tree-planned", "union"]


def check_record(record: PassRecord) -> None:
    """What every pass must say about itself, whatever the strategy."""
    assert len(record.parents) == record.drafted == len(record.node_sources)
    assert all(-1 <= parent < i for i, parent in enumerate(record.parents))
    node = -1
    for child in record.path:  # the path descends the tree from the root
        assert record.parents[child] == node
        node = child
    if not record.drafted:
        assert record.next == PLAIN and record.path == [] and record.depth == 0
    elif record.next == BONUS:  # every drafted token on the path accepted, down to a leaf
        assert record.path and record.children(record.path[-1]) == []
    else:  # a rejection: the last accepted node (or the root) had children, all of them rejected
        assert record.next == CORRECTION and record.children(node)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_trace_rebuilds_the_completion(target, unrelated_draft, tok, kind, sampling):
    session = session_for(kind, target, unrelated_draft, tok)
    seen = set()
    for text in PROMPTS:
        prompt = tok.encode(text)
        out = session.generate(prompt, GenerationConfig(24, sampling, max_draft=6))
        trace = out.trace
        assert trace.tokens() == out.tokens and trace.new_tokens == len(out.tokens)
        assert tok.decode(trace.tokens()) == out.text == trace.text
        assert trace.prompt_tokens == len(prompt) and trace.stop_reason == out.stop_reason
        assert trace.passes[0].prefill and not any(r.prefill for r in trace.passes[1:])
        for record in trace.passes:
            check_record(record)
            seen.add(record.next)
            assert record.p is None and record.q is None  # nobody asked: no softmax was spent
        assert GenerationStats.from_trace(trace) == out.stats  # the stats are the trace's folds
        assert out.stats.target_passes == len(trace.passes)
        assert sum(len(r.yielded) for r in trace.passes) >= len(out.tokens)
    if kind == "plain":
        assert seen == {PLAIN}
    if kind == "chain-same" and sampling is GREEDY:
        assert BONUS in seen
    if kind in ("chain-unrelated", "tree-grown", "tree-planned"):
        assert CORRECTION in seen


@pytest.mark.parametrize("kind", ["tree-grown", "tree-planned", "union"])
def test_tree_passes_branch_and_carry_their_plan(target, unrelated_draft, tok, kind):
    session = session_for(kind, target, unrelated_draft, tok)
    out = session.generate(tok.encode(PROMPTS[0]), GenerationConfig(24, GREEDY, max_draft=6))
    drafting = [r for r in out.trace.passes if r.drafted]
    assert drafting and any(r.drafted > r.depth for r in drafting)  # some pass branched
    assert out.stats.tree_passes == sum(r.drafted > r.depth for r in out.trace.passes)
    if kind == "tree-grown":
        assert all(r.plan is None for r in out.trace.passes)  # grown, not planned
    else:
        for r in drafting:
            parents, ranks = r.plan
            assert r.drafted <= len(parents) == len(ranks)
        if kind == "tree-planned":
            assert all(r.parents == list(r.plan[0][: r.drafted]) for r in drafting)
    if kind == "union":
        assert {source_kind(s) for r in drafting for s in r.node_sources} <= {"draft", "lookup"}


def test_the_trace_rebuilds_what_a_stop_rule_or_the_budget_cut(target, tok):
    session = Session(target, tok, DraftModel(target, DraftLength(k_max=6, adaptive=False)))
    prompt = tok.encode("import os\nimport")
    full = session.generate(prompt, GenerationConfig(24, GREEDY))
    for n in (1, 2, 5, 7):  # the budget ends mid-draft: the last pass yielded more than was kept
        out = session.generate(prompt, GenerationConfig(n, GREEDY))
        assert out.trace.tokens() == out.tokens == full.tokens[:n]
    cut_at = len(tok.decode(full.tokens[:3])) - 1  # the stop rule cuts inside the third token
    out = session.generate(prompt, GenerationConfig(24, GREEDY), stop=lambda text: cut_at if len(text) > cut_at else None)
    assert out.stop_reason == "stop" and out.trace.tokens() == out.tokens and out.trace.text == out.text
    assert tok.decode(out.trace.tokens()).startswith(out.text)


def test_p_and_q_are_recorded_when_asked(target, unrelated_draft, tok):
    prompt = tok.encode(PROMPTS[1])
    # a sampled chain: q is the draft's law at the drafted token (> 0: it was drawn from it), p the target's
    out = Session(target, tok, DraftModel(unrelated_draft, DraftLength(k_max=4, adaptive=False))).generate(
        prompt, GenerationConfig(16, SAMPLING, trace=True))
    drafting = [r for r in out.trace.passes if r.drafted]
    assert out.trace.probabilities and drafting
    for r in drafting:
        assert len(r.p) == len(r.q) == r.drafted
        assert all(0 <= p <= 1 for p in r.p) and all(0 < q <= 1 for q in r.q)
    assert any(q < 1 for r in drafting for q in r.q)
    # a lookup (one-hot q) under greedy: q is 1.0, and an accepted token is the target's argmax, so its p is the
    # largest the target gives at that place (a rejected sibling's is below it)
    out = Session(target, tok, PromptLookup(max_ngram=3, min_ngram=1, length=DraftLength(k_max=4, adaptive=False))
                  ).generate(tok.encode(PROMPTS[0]), GenerationConfig(16, GREEDY, trace=True))
    drafting = [r for r in out.trace.passes if r.drafted]
    assert drafting and all(q == 1.0 for r in drafting for q in r.q)
    for r in drafting:
        for i in r.path:
            assert r.p[i] >= max(r.p[j] for j in range(r.drafted) if r.parents[j] == r.parents[i])
        if r.next == CORRECTION:
            rejected = r.children(r.path[-1] if r.path else -1)
            assert all(r.p[j] < 0.5 for j in rejected) or len(rejected) > 1
    # the same completion with and without probabilities: recording changes nothing
    plain = Session(target, tok, PromptLookup(max_ngram=3, min_ngram=1, length=DraftLength(k_max=4, adaptive=False))
                    ).generate(tok.encode(PROMPTS[0]), GenerationConfig(16, GREEDY))
    assert plain.tokens == out.tokens


def test_per_source_counters_are_folds_of_the_records():
    """A merged tree's pass counts for each source in it; its nodes are credited per node."""
    trace = Trace(5, "tree", passes=[
        PassRecord([], [], "", None, [], 1, PLAIN, 0, 0.0, 0.01, prefill=True),
        PassRecord([10, 11, 12], [-1, 0, -1], "tree", ["draft-tree", "draft-tree", "lookup-tree"], [0, 1], 13,
                   BONUS, 2, 0.002, 0.02),
        PassRecord([20, 21], [-1, 0], "draft", None, [], 22, CORRECTION, 2, 0.001, 0.01),
        PassRecord([], [], "", None, [], 30, PLAIN, 0, 0.0, 0.01),
    ], new_tokens=6, stop_reason="eos")
    assert trace.tokens() == [1, 10, 11, 13, 22, 30]
    stats = GenerationStats.from_trace(trace)
    assert (stats.target_passes, stats.drafted, stats.accepted, stats.drafted_depth, stats.tree_passes) == (4, 5, 2, 4, 1)
    assert stats.produced == 7 and stats.tokens_per_pass == 7 / 4
    assert stats.drafted_by == {"draft-tree": 2, "lookup-tree": 1, "draft": 2}
    assert stats.accepted_by == {"draft-tree": 2, "lookup-tree": 0, "draft": 0}
    assert stats.passes_by == {"draft-tree": 1, "lookup-tree": 1, "draft": 1}
    assert stats.draft_seconds == pytest.approx(0.003) and stats.verify_seconds == pytest.approx(0.04)  # no prefill
    summary = trace.summary()
    assert [row["source"] for row in summary["sources"]] == ["draft", "draft-tree", "lookup-tree"]  # sorted
    assert summary["sources"][1] == {"source": "draft-tree", "passes": 1, "drafted": 2, "accepted": 2, "checked": 2, "alpha": 1.0, "k": 2.0,
                                                "expected_tokens_per_pass": 3.0, "measured_tokens_per_pass": 3.0}
    # α counts levels checked, not nodes: the lookup node lost its level to the draft's (checked, rejected);
    # the chain's second token was never checked after its first was rejected
    assert summary["sources"][2] == {"source": "lookup-tree", "passes": 1, "drafted": 1, "accepted": 0, "checked": 1,
                                     "alpha": 0.0, "k": 1.0, "expected_tokens_per_pass": 1.0,
                                     "measured_tokens_per_pass": 1.0}
    assert summary["sources"][0]["checked"] == 1 and summary["sources"][0]["k"] == 2.0
    assert summary["all"]["passes"] == 2 and summary["all"]["alpha"] == round(2 / 3, 4)
    assert summary["all"]["measured_tokens_per_pass"] == 2.0  # (3 + 1) tokens over the two drafting passes


def test_expected_tokens_per_pass_beside_the_measured():
    """(1 − α^(k+1)) / (1 − α): 1 token at α = 0, k + 1 as α → 1, and the typical case by hand."""
    assert SourceSummary(4, 12, 0, 4, 12).expected == 1.0 and SourceSummary(4, 12, 0, 4, 12).measured == 1.0
    assert SourceSummary(4, 12, 12, 12, 12).expected == 4.0 and SourceSummary(4, 12, 12, 12, 12).measured == 4.0
    assert expected_tokens_per_pass(1 - 1e-9, 3) == pytest.approx(4.0, rel=1e-6)  # continuous at α → 1
    typical = SourceSummary(2, 4, 2, 4, 4)  # α = 2/4 levels = 0.5, k = 2: 1 + 0.5 + 0.25
    assert (typical.alpha, typical.k, typical.expected, typical.measured) == (0.5, 2.0, 1.75, 2.0)
    assert SourceSummary(2, 5, 2, 5, 5).expected == pytest.approx((1 - 0.4 ** 3.5) / 0.6)  # k = 2.5: a fractional average
    chain = Trace(0, "draft", passes=[PassRecord([1, 2, 3], [-1, 0, 1], "draft", None, [0], 9, CORRECTION, 3, 0, 0)])
    assert chain.by_source()["draft"].alpha == 0.5  # 1 accepted of 2 checked: the third token was never checked
    assert SourceSummary(0, 0, 0).as_dict()["expected_tokens_per_pass"] == 0.0  # a source that never drafted
