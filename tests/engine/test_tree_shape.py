"""The tree planner: optimal against brute force over every small shape, chains where width does
not pay, wide trees where it is free, no speculation only when nothing is accepted, and the
expected-accepted formula against simulation."""

import itertools
import random
import time

import pytest

from specdec.engine import tree_shape
from specdec.engine.tree import DETERMINISTIC, ROOT, TokenTree
from specdec.engine.tree_shape import TreeShape, best_shape, evaluate

FLAT = lambda n: 0.01  # a GPU: wider passes cost the same
STEEP = lambda n: 0.01 * (1 + 0.5 * (n - 1))  # every verified token costs half a pass more


def forests(nodes: int, levels: int, width: int):
    """Every ordered list of subtrees (nested children lists) with `nodes` nodes in all, at most
    `width` children per node and `levels` levels."""
    if nodes == 0:
        yield []
        return
    if levels == 0:
        return

    def lists(remaining: int, slots: int):
        if remaining == 0:
            yield []
            return
        if slots == 0:
            return
        for first in range(1, remaining + 1):  # nodes in the first child's subtree
            for below in forests(first - 1, levels - 1, width):
                for rest in lists(remaining - first, slots - 1):
                    yield [below, *rest]

    yield from lists(nodes, width)


def to_shape(children: list) -> TreeShape:
    """Depth-first: a node's children still come in rank order."""
    parents, ranks = [], []

    def walk(parent: int, kids: list) -> None:
        for rank, grandkids in enumerate(kids):
            parents.append(parent)
            ranks.append(rank)
            walk(len(parents) - 1, grandkids)

    walk(ROOT, children)
    return TreeShape(tuple(parents), tuple(ranks))


def all_shapes(max_nodes: int, max_depth: int, width: int):
    for n in range(max_nodes + 1):
        for forest in forests(n, max_depth, width):
            yield to_shape(forest)


def test_the_enumeration_counts_plane_trees():
    """With no width or depth limit, n nodes under a root make Catalan(n) shapes."""
    assert [sum(1 for _ in forests(n, n, n)) for n in range(7)] == [1, 1, 2, 5, 14, 42, 132]


def random_vector(rng: random.Random, width: int) -> list[float]:
    raw = sorted((rng.random() ** 2 for _ in range(width)), reverse=True)
    scale = rng.uniform(0.3, 0.98) / sum(raw)
    return [x * scale for x in raw]


def random_cost(rng: random.Random):
    """From flat (a GPU) to steep (a CPU), sometimes with a step where a kernel changes tile."""
    base, slope = rng.uniform(0.005, 0.05), rng.choice([0.0, 0.01, 0.05, 0.2, 0.6])
    step = rng.choice([0.0, 0.0, 0.3])
    return lambda n: base * (1 + slope * (n - 1) + (step if n > 4 else 0.0))


@pytest.mark.parametrize("seed", range(24))
def test_the_dynamic_program_matches_brute_force(seed):
    rng = random.Random(seed)
    width, max_depth, max_nodes = rng.choice([(2, 4, 7), (3, 3, 7), (3, 6, 8), (4, 4, 7), (1, 5, 5)])
    per_depth = seed % 2 == 1
    acceptance = ([random_vector(rng, width) for _ in range(rng.randint(2, 3))] if per_depth
                  else random_vector(rng, width))
    cost = random_cost(rng)
    draft_level_cost = rng.choice([0.0, 0.001, 0.01])
    best = max(evaluate(s, acceptance, cost, draft_level_cost).tokens_per_second
               for s in all_shapes(max_nodes, max_depth, width))
    shape = best_shape(acceptance, cost, draft_level_cost=draft_level_cost, max_depth=max_depth,
                       max_nodes=max_nodes)
    assert len(shape) <= max_nodes and shape.depth <= max_depth and shape.width <= width
    assert evaluate(shape, acceptance, cost, draft_level_cost).tokens_per_second == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_free_nodes_get_the_most_expected_accepted_of_any_shape(seed):
    """With a flat cost every node is worth adding: the plan holds max_nodes nodes and no shape of
    that many has more expected accepted tokens (the dynamic program's core, on its own)."""
    rng = random.Random(100 + seed)
    width, max_depth, max_nodes = rng.choice([(2, 4, 8), (3, 3, 8), (3, 8, 8), (4, 2, 8)])
    acceptance = [random_vector(rng, width) for _ in range(1 + seed % 3)]
    shape = best_shape(acceptance, FLAT, max_depth=max_depth, max_nodes=max_nodes)
    best = max(s.expected_accepted(acceptance) for s in all_shapes(max_nodes, max_depth, width) if len(s) == max_nodes)
    assert len(shape) == max_nodes
    assert shape.expected_accepted(acceptance) == pytest.approx(best, rel=1e-12)


def test_per_depth_rows_change_the_answer():
    """A drafter that is sure at depth 1 and unsure below should go wide low and narrow at the top."""
    rows = [[0.9, 0.05], [0.45, 0.4]]
    shape = best_shape(rows, FLAT, max_depth=3, max_nodes=7)
    pooled = best_shape(rows[0], FLAT, max_depth=3, max_nodes=7)
    assert len(shape.children(ROOT)) == 1 and shape.width == 2
    assert shape != pooled
    best = max(evaluate(s, rows, FLAT).tokens_per_second for s in all_shapes(7, 3, 2))
    assert evaluate(shape, rows, FLAT).tokens_per_second == pytest.approx(best)


def test_a_steep_cost_curve_buys_a_chain():
    p = [0.8, 0.1, 0.05]
    shape = best_shape(p, STEEP, max_depth=8, max_nodes=32)
    assert shape.is_chain and len(shape) >= 1
    assert evaluate(shape, p, STEEP).tokens_per_second > evaluate(TreeShape((), ()), p, STEEP).tokens_per_second


def test_a_flat_cost_curve_buys_a_wide_tree():
    p = [0.6, 0.15, 0.08, 0.04]
    shape = best_shape(p, FLAT, max_depth=8, max_nodes=32)
    assert len(shape) == 32  # free nodes are always worth having
    assert len(shape.children(ROOT)) == 4 and not shape.is_chain
    chain = TreeShape.chain(8)
    assert evaluate(shape, p, FLAT).tokens_per_pass > evaluate(chain, p, FLAT).tokens_per_pass


def test_the_empty_shape_wins_only_when_acceptance_is_about_zero():
    cpu = lambda n: 0.02 * (1 + 0.04 * (n - 1))  # a pass of 2 tokens costs 4 % more than one
    assert len(best_shape([0.1, 0.02], cpu)) >= 1
    assert len(best_shape([0.03], cpu)) == 0
    assert len(best_shape([0.0, 0.0], FLAT)) == 0  # ties go to the smaller tree
    assert len(best_shape([0.5], FLAT, draft_level_cost=0.0)) >= 1
    # drafting a level costs more than a pass: speculation loses even at decent acceptance
    assert len(best_shape([0.5], FLAT, draft_level_cost=0.02)) == 0
    assert len(best_shape([0.9], FLAT, max_nodes=0)) == 0 and len(best_shape([0.9], FLAT, max_depth=0)) == 0


def test_draft_cost_per_level_trades_depth_for_width():
    p = [0.7, 0.2, 0.05]
    free = best_shape(p, FLAT, max_depth=10, max_nodes=24)
    costly = best_shape(p, FLAT, draft_level_cost=0.004, max_depth=10, max_nodes=24)
    assert costly.depth < free.depth
    assert costly.width >= free.width


def test_more_budget_never_hurts():
    rng = random.Random(3)
    p, cost = random_vector(rng, 4), random_cost(rng)
    values = [evaluate(best_shape(p, cost, max_depth=6, max_nodes=n), p, cost).tokens_per_second
              for n in range(20)]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(values))


def simulate_accepted(shape: TreeShape, rows: list[list[float]], trials: int, rng: random.Random) -> list[int]:
    """The model: at a reached position, rank r is the accepted one with p[r], none with the rest;
    descend when that rank was offered."""
    out = []
    for _ in range(trials):
        node, accepted = ROOT, 0
        while True:
            depth = 1 if node == ROOT else shape.depths[node] + 1
            row = rows[min(depth, len(rows)) - 1]
            u, rank = rng.random(), None
            for r, p in enumerate(row):
                if u < p:
                    rank = r
                    break
                u -= p
            children = shape.children(node)
            if rank is None or rank >= len(children):
                break
            node = children[rank]
            accepted += 1
        out.append(accepted)
    return out


@pytest.mark.parametrize("per_depth", [False, True])
def test_expected_accepted_matches_simulation(per_depth):
    rows = [[0.6, 0.2, 0.1], [0.4, 0.3, 0.1], [0.7, 0.1, 0.0]] if per_depth else [[0.6, 0.2, 0.1]]
    shape = best_shape(rows if per_depth else rows[0], FLAT, max_depth=5, max_nodes=20)
    assert not shape.is_chain
    samples = simulate_accepted(shape, rows, 40000, random.Random(0))
    mean = sum(samples) / len(samples)
    sd = (sum((x - mean) ** 2 for x in samples) / len(samples)) ** 0.5
    assert abs(mean - shape.expected_accepted(rows)) < 4 * sd / len(samples) ** 0.5


def test_expected_accepted_by_hand():
    # root -> a (rank 0) -> c (rank 0); root -> b (rank 1)
    shape = TreeShape((ROOT, ROOT, 0), (0, 1, 0))
    assert shape.expected_accepted([0.5, 0.3]) == pytest.approx(0.5 + 0.3 + 0.25)
    assert shape.expected_accepted([[0.5, 0.3], [0.2, 0.1]]) == pytest.approx(0.5 + 0.3 + 0.1)
    report = evaluate(shape, [0.5, 0.3], lambda n: 0.1 * n, draft_level_cost=0.05)
    assert (report.nodes, report.depth, report.width) == (3, 2, 2)
    assert report.tokens_per_pass == pytest.approx(2.05)
    assert report.seconds_per_pass == pytest.approx(0.4 + 0.1)
    assert report.tokens_per_second == pytest.approx(2.05 / 0.5)


def test_the_shape_is_breadth_first_and_fills_a_token_tree():
    shape = best_shape([0.6, 0.2, 0.1], FLAT, max_depth=4, max_nodes=12)
    assert list(shape.depths) == sorted(shape.depths)
    assert [len(level) for level in shape.levels()] == [shape.depths.count(d) for d in range(1, shape.depth + 1)]
    tree = shape.tree(list(range(100, 100 + len(shape))))
    assert isinstance(tree, TokenTree) and tree.parents == list(shape.parents) and tree.drawn[0] == DETERMINISTIC
    assert TreeShape.of(tree) == shape
    for node in range(len(shape)):
        assert len(shape.rank_path(node)) == shape.depths[node]
        assert shape.rank_path(node)[-1] == shape.ranks[node]


def test_bad_shapes_and_inputs_are_refused():
    with pytest.raises(ValueError, match="rank"):
        TreeShape((ROOT, ROOT), (1, 0))  # a node's children take ranks 0, 1, ... in order
    with pytest.raises(ValueError, match="precede"):
        TreeShape((1, ROOT), (0, 0))
    with pytest.raises(ValueError, match="sum"):
        best_shape([0.8, 0.5], FLAT)
    with pytest.raises(ValueError, match="positive"):
        best_shape([0.5], lambda n: 0.0)
    with pytest.raises(ValueError, match="tokens"):
        TreeShape.chain(3).tree([1, 2])


def test_sixty_four_nodes_plan_once_and_a_repeated_plan_is_the_memo():
    """The planner runs before every pass: a 64-node plan is made once and the same inputs again are answered from
    its memo, not searched again (its speed is a benchmark's: docs/trees.md, not a timed test)."""
    p = [0.55, 0.15, 0.08, 0.05, 0.03, 0.02, 0.01, 0.01]
    cost = lambda n: 0.02 * (1 + 0.01 * n)
    tree_shape._best.cache_clear()
    shape = best_shape(p, cost, max_depth=16, max_nodes=64)
    assert len(shape) > 8 and tree_shape._best.cache_info().misses == 1
    assert best_shape(p, cost, max_depth=16, max_nodes=64) == shape  # the same inputs: the memo
    assert tree_shape._best.cache_info().hits == 1 and tree_shape._best.cache_info().misses == 1
