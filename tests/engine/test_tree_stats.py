"""The acceptance vector learnt from tree verdicts converges to the true per-rank marginals,
counting each rank only where it was offered, pooled and per depth, from real verify_tree
verdicts too."""

import random

import pytest
import torch

from specdec.engine.acceptance import TreeVerdict, verify_tree
from specdec.engine.sampling import SamplingConfig
from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_shape import TreeShape
from specdec.engine.tree_stats import AcceptanceVector


def random_shape(rng: random.Random, width: int, depth: int) -> TreeShape:
    """Each position gets 1..width children at random (so deep ranks are offered seldom)."""
    parents, ranks, frontier = [], [], [ROOT]
    for _ in range(depth):
        nxt = []
        for parent in frontier:
            for rank in range(rng.randint(1, width)):
                parents.append(parent)
                ranks.append(rank)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return TreeShape(tuple(parents), tuple(ranks))


def draw_rank(rng: random.Random, row: list[float]) -> int | None:
    u = rng.random()
    for rank, p in enumerate(row):
        if u < p:
            return rank
        u -= p
    return None


def synthetic_verdict(tree: TokenTree, rows: list[list[float]], rng: random.Random) -> TreeVerdict:
    """At each reached position the accepted rank is drawn from the true row; descend if offered."""
    path, node = [], ROOT
    while tree.children(node):
        depth = 1 if node == ROOT else tree.depths[node] + 1
        rank = draw_rank(rng, rows[min(depth, len(rows)) - 1])
        if rank is None or rank >= len(tree.children(node)):
            return TreeVerdict(path, [tree.tokens[i] for i in path], 0, False)
        node = tree.children(node)[rank]
        path.append(node)
    return TreeVerdict(path, [tree.tokens[i] for i in path], 0, True)


def test_converges_to_the_true_marginals_counting_only_offered_ranks():
    true = [0.4, 0.25, 0.15, 0.1]
    rng = random.Random(0)
    learner = AcceptanceVector(width=4, prior=[0.9, 0.0, 0.0, 0.0], decay=0.999)
    for _ in range(6000):
        shape = random_shape(rng, 4, 3)
        tree = shape.tree(list(range(len(shape))))
        learner.observe(tree, synthetic_verdict(tree, [true], rng))
    # rank 3 is offered at a quarter of the positions: counting the others as misses would read ~0.025
    assert learner.vector() == pytest.approx(true, abs=0.03)


def test_per_depth_rows_converge_and_the_last_row_gathers_the_deeper_depths():
    true = [[0.7, 0.2], [0.3, 0.1], [0.5, 0.3], [0.5, 0.3]]
    rng = random.Random(1)
    learner = AcceptanceVector(width=2, decay=0.9995, max_depth=8)
    for _ in range(5000):
        shape = random_shape(rng, 2, 4)
        tree = shape.tree(list(range(len(shape))))
        learner.observe(tree, synthetic_verdict(tree, true, rng))
    rows = learner.rows(3)
    assert len(rows) == 3
    for got, want in zip(rows, true[:3]):
        assert got == pytest.approx(want, abs=0.04)
    assert learner.rows()[0] == pytest.approx(true[0], abs=0.04) and len(learner.rows()) == 8


def test_converges_from_real_greedy_verdicts():
    """verify_tree's own verdicts: the target's argmax at a position is the rank-r child with p[r]."""
    true = [0.5, 0.2, 0.1]
    vocab = 50
    rng = random.Random(2)
    learner = AcceptanceVector(width=3, prior=[0.1, 0.1, 0.1], decay=0.998)
    for step in range(1500):
        shape = random_shape(rng, 3, 2)
        tokens = rng.sample(range(1, vocab), len(shape))  # distinct, so the argmax names one child
        tree = shape.tree(tokens)
        logits = torch.zeros(len(shape) + 1, vocab)
        for position in range(len(shape) + 1):
            children = tree.children(position - 1)
            rank = draw_rank(rng, true)
            winner = tree.tokens[children[rank]] if children and rank is not None and rank < len(children) else 0
            logits[position, winner] = 5.0
        learner.observe(tree, verify_tree(tree, logits, SamplingConfig(temperature=0.0)))
    assert learner.vector() == pytest.approx(true, abs=0.04)


def test_one_verdict_by_hand():
    # root -> a (rank 0) -> c (rank 0); root -> b (rank 1). Accepted: a then c, a leaf (bonus).
    tree = TokenTree([10, 11, 12], [ROOT, ROOT, 0])
    learner = AcceptanceVector(width=3, prior=[0.3, 0.2, 0.1], prior_weight=1.0, decay=1.0)
    learner.observe(tree, TreeVerdict([0, 2], [10, 12], 99, True))
    # rank 0 offered at the root and at a, won both; rank 1 offered once (root), lost; rank 2 never offered
    assert learner.vector() == pytest.approx([(0.3 + 2) / 3, 0.2 / 2, 0.1])
    # nothing accepted: the root's two candidates both lose
    learner.observe(tree, TreeVerdict([], [], 99, False))
    assert learner.vector() == pytest.approx([(0.3 + 2) / 4, 0.2 / 3, 0.1])
    assert learner.rows(2)[1] == pytest.approx([(1 + 1.0 * learner.vector()[0]) / 2, learner.vector()[1], 0.1])


def test_ranks_can_be_given_and_bad_paths_are_refused():
    tree = TokenTree([10, 11], [ROOT, ROOT])
    learner = AcceptanceVector(width=2, prior=[0.2, 0.2], prior_weight=1.0, decay=1.0)
    learner.observe(tree, TreeVerdict([0], [10], 1, True), ranks=[1, 0])  # node 0 was the second candidate
    assert learner.vector() == pytest.approx([0.2 / 2, 1.2 / 2])
    chain = TokenTree([1, 2], [ROOT, 0])
    with pytest.raises(ValueError, match="parents"):
        learner.observe(chain, TreeVerdict([1], [2], 0, True))
    with pytest.raises(ValueError, match="ranks"):
        learner.observe(chain, TreeVerdict([0], [1], 0, False), ranks=[0])


def test_estimates_stay_a_sub_probability_and_reset_restores_the_prior():
    learner = AcceptanceVector(width=2, prior=[0.5, 0.4], decay=0.5, prior_weight=1.0)
    for _ in range(20):  # rank 0 always wins where only it is offered; rank 1 always wins where offered
        learner.observe_position([0], 0)
        learner.observe_position([0, 1], 1)
    vector = learner.vector()
    assert sum(vector) == pytest.approx(1.0) and vector[1] > vector[0] > 0
    learner.reset()
    assert learner.vector() == pytest.approx([0.5, 0.4])


def test_forgets_old_behaviour():
    learner = AcceptanceVector(width=1, prior=[0.5], decay=0.9)
    for _ in range(100):
        learner.observe_position([0], 0)
    assert learner.vector()[0] > 0.99
    for _ in range(100):
        learner.observe_position([0], None)
    assert learner.vector()[0] < 0.01
