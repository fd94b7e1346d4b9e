"""Sequoia's tree shape: the token tree that maximises expected tokens per second.

The drafter's quality is summarised by an acceptance vector: p[r] = probability that a
node's r-th best candidate (rank r) is the one the target accepts, given the node itself
was accepted (a marginal over the candidates, so sum(p) <= 1; optionally one row per
depth). A node at rank r under an accepted parent is accepted with p[r], so a shape's
expected accepted count is the sum over its nodes of the product of p along the path.
The hardware is summarised by cost(n), the seconds of one target pass over n tokens, and
by what one level of drafting costs. A shape is then worth

    (1 + E[accepted]) / (cost(1 + nodes) + depth * draft_level_cost)

tokens per second. Cheap-to-widen hardware (a GPU's flat cost curve) buys wide trees;
a CPU whose cost grows with every token buys a short chain, or nothing: the empty shape
(a plain decoding step) is a candidate too, so drafting only happens when it pays.

The dynamic program (Sequoia, Chen et al. 2024, re-derived): G[h][m] = the best expected
accepted count of m nodes hung below one node with h levels left. A node's children
take ranks 0..c-1 (a drafter always offers its best candidates first), and splitting m
nodes between them is a max-plus convolution over the ranks, one numpy step per
(level, rank): O(depth * width * nodes^2) arithmetic in depth * width vector steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from specdec.engine.limits import MAX_DRAFT
from specdec.engine.tree import DETERMINISTIC, ROOT, Drawn, TokenTree

Acceptance = Sequence[float] | Sequence[Sequence[float]]  # one row, or one row per depth (row d-1 = depth d)
_TIE = 1e-12  # a bigger tree must be better by more than rounding to be chosen


@dataclass(frozen=True)
class TreeShape:
    """A token tree without tokens: where each node hangs and which candidate fills it.

    parents: [n] parent node index per node, -1 = child of the root, parents first
             (breadth-first from best_shape, so a drafter can fill it level by level).
    ranks:   [n] which candidate of its parent each node is: rank r = the parent's r-th
             best candidate. A node's children carry ranks 0..c-1, in that order.
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False, compare=False)
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(int(x) for x in self.parents))
        object.__setattr__(self, "ranks", tuple(int(x) for x in self.ranks))
        n = len(self.parents)
        if len(self.ranks) != n:
            raise ValueError(f"{n} parents but {len(self.ranks)} ranks")
        children: list[list[int]] = [[] for _ in range(n + 1)]
        depths: list[int] = []
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must precede children")
            if self.ranks[i] != len(children[parent + 1]):
                raise ValueError(f"node {i} has rank {self.ranks[i]}, but its parent's children so far "
                                 f"take ranks 0..{len(children[parent + 1]) - 1}: ranks run 0, 1, 2... in order")
            children[parent + 1].append(i)
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        """Levels below the root (0 for the empty shape): the drafter's sequential steps."""
        return max(self.depths, default=0)

    @property
    def width(self) -> int:
        """The most children any position has."""
        return max((len(c) for c in self._children), default=0)

    @property
    def is_chain(self) -> bool:
        return all(r == 0 for r in self.ranks)

    def children(self, node: int) -> tuple[int, ...]:
        """Child node indices of node (ROOT = -1 for the root), in rank order."""
        return self._children[node + 1]

    def levels(self) -> list[list[int]]:
        """Node indices per depth (row d-1 = depth d): what a level-by-level drafter expands."""
        out: list[list[int]] = [[] for _ in range(self.depth)]
        for i, d in enumerate(self.depths):
            out[d - 1].append(i)
        return out

    def rank_path(self, node: int) -> tuple[int, ...]:
        """The ranks from the root's child down to node: which candidate to take at each level."""
        out = []
        while node != ROOT:
            out.append(self.ranks[node])
            node = self.parents[node]
        return tuple(out[::-1])

    def expected_accepted(self, acceptance: Acceptance) -> float:
        """Sum over nodes of the product of p[depth][rank] along the node's path."""
        rows = _rows(acceptance)
        reach: list[float] = []
        for i, parent in enumerate(self.parents):
            row = rows[min(self.depths[i], len(rows)) - 1]
            p = row[self.ranks[i]] if self.ranks[i] < len(row) else 0.0
            reach.append(p * (1.0 if parent == ROOT else reach[parent]))
        return float(sum(reach))

    def tree(self, tokens: Sequence[int], child_probs: torch.Tensor | None = None,
             drawn: Drawn | list[Drawn] = DETERMINISTIC) -> TokenTree:
        """The TokenTree of this shape filled with tokens ([n], node i gets tokens[i])."""
        if len(tokens) != len(self):
            raise ValueError(f"the shape has {len(self)} nodes but {len(tokens)} tokens were given")
        return TokenTree(list(tokens), list(self.parents), child_probs, drawn)

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        return cls(tuple(range(-1, k - 1)), (0,) * k)

    @classmethod
    def of(cls, tree: TokenTree) -> TreeShape:
        """The shape of a token tree: each node's rank is its place among its parent's children."""
        ranks = [0] * len(tree)
        for parent in range(ROOT, len(tree)):
            for rank, child in enumerate(tree.children(parent)):
                ranks[child] = rank
        return cls(tuple(tree.parents), tuple(ranks))


@dataclass(frozen=True)
class ShapeReport:
    """What a shape is worth under an acceptance vector and a cost curve."""

    nodes: int
    depth: int
    width: int
    expected_accepted: float  # drafted tokens kept per pass, on average
    tokens_per_pass: float  # 1 + expected_accepted: the target always adds its own token
    seconds_per_pass: float  # cost(1 + nodes) + depth * draft_level_cost
    tokens_per_second: float


def evaluate(shape: TreeShape, acceptance: Acceptance, cost: Callable[[int], float],
             draft_level_cost: float = 0.0) -> ShapeReport:
    """The shape's nodes, depth, expected tokens per pass and expected tokens per second."""
    expected = shape.expected_accepted(acceptance)
    seconds = float(cost(1 + len(shape))) + shape.depth * draft_level_cost
    if not seconds > 0:
        raise ValueError(f"a pass of {1 + len(shape)} tokens costs {seconds} s: costs must be positive")
    return ShapeReport(len(shape), shape.depth, shape.width, expected, 1 + expected, seconds, (1 + expected) / seconds)


def best_shape(acceptance: Acceptance, cost: Callable[[int], float], *, draft_level_cost: float = 0.0,
               max_depth: int = 8, max_nodes: int = MAX_DRAFT) -> TreeShape:
    """The shape of at most max_nodes nodes and max_depth levels with the most expected tokens per second.

    acceptance: [width] or [depths, width] (deeper than the last row reuses it).
    cost(n): seconds of one target pass over n tokens (the root + n - 1 drafted), n = 1..max_nodes + 1.
    draft_level_cost: seconds per level of drafting (0 for lookup-style drafters).
    Ties go to the smaller tree; the empty shape (no speculation) is among the candidates.
    """
    rows = _rows(acceptance)
    if max_depth < 0 or max_nodes < 0:
        raise ValueError(f"max_depth ({max_depth}) and max_nodes ({max_nodes}) must be >= 0")
    if draft_level_cost < 0:
        raise ValueError(f"draft_level_cost must be >= 0, got {draft_level_cost}")
    costs = tuple(float(cost(n)) for n in range(1, max_nodes + 2))
    bad = next((n + 1 for n, c in enumerate(costs) if not (c > 0 and np.isfinite(c))), None)
    if bad is not None:
        raise ValueError(f"cost({bad}) = {costs[bad - 1]}: costs must be positive and finite")
    parents, ranks = _best(rows, costs, float(draft_level_cost), int(max_depth), int(max_nodes))
    return TreeShape(parents, ranks)


def _rows(acceptance: Acceptance) -> tuple[tuple[float, ...], ...]:
    """Normalise to rows of equal width; check each is a sub-probability vector."""
    items = list(acceptance)
    if not items:
        raise ValueError("empty acceptance vector")
    rows = [tuple(float(x) for x in r) for r in items] if np.ndim(items[0]) > 0 else [
        tuple(float(x) for x in items)]
    width = max(len(r) for r in rows)
    if width == 0:
        raise ValueError("empty acceptance vector")
    rows = [r + (0.0,) * (width - len(r)) for r in rows]
    for d, r in enumerate(rows):
        if any(not 0.0 <= x <= 1.0 for x in r) or sum(r) > 1.0 + 1e-6:
            raise ValueError(f"acceptance row {d} = {list(r)}: each p[r] in [0, 1] and their sum <= 1 "
                             f"(they are the chances that one of a node's candidates is the accepted one)")
    return tuple(rows)


@functools.lru_cache(maxsize=64)
def _best(rows: tuple[tuple[float, ...], ...], costs: tuple[float, ...], draft_level_cost: float,
          max_depth: int, max_nodes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parents, ranks) of the best shape; cached, since a caller replans with the same inputs often."""
    cost = np.asarray(costs)  # cost[m] = a pass over 1 + m tokens
    best_value, best_plan = 1.0 / cost[0], None  # the empty shape: a plain decoding step
    if max_depth == 0 or max_nodes == 0:
        return (), ()
    width = max(max((r for r, p in enumerate(row) if p > 0), default=-1) + 1 for row in rows)
    if width == 0:  # nothing is ever accepted
        return (), ()
    grid = _Grid(max_nodes, min(width, max_nodes))  # trailing ranks that are never accepted never help
    # levels are counted from the bottom (h = 1: the deepest children). With a depth limit L,
    # level h holds depth L - h + 1, whose row is rows[L - h] (the last row reused deeper), so
    # every level at or below L - len(rows) + 1 uses the last row: those are shared by all L
    bottom = [_Level.leaf(max_nodes)]
    for _ in range(max(0, max_depth - len(rows) + 1)):
        bottom.append(grid.level(bottom[-1], rows[-1]))
    for limit in range(1, max_depth + 1):
        levels = bottom[: max(0, limit - len(rows) + 1) + 1]
        for h in range(len(levels), limit + 1):
            levels.append(grid.level(levels[-1], rows[limit - h]))
        value = (1.0 + levels[limit].g) / (cost + limit * draft_level_cost)
        value[0] = -np.inf  # zero nodes at this depth is the empty shape, counted above
        m = int(np.argmax(value))
        if value[m] > best_value * (1 + _TIE):
            best_value, best_plan = value[m], (levels, limit, m)
    if best_plan is None:
        return (), ()
    levels, limit, m = best_plan
    return _flatten(_build(levels, limit, m))


@dataclass
class _Level:
    """One level of the dynamic program, h levels above the bottom.

    g:      [m] best expected accepted count of m nodes below one node with h levels left
            (-inf: m nodes do not fit).
    choice: [m] how many children that takes.
    split:  [c, m] nodes given to the child of rank c - 1 when m nodes go to ranks 0..c-1.
    """

    g: np.ndarray
    choice: np.ndarray | None = None
    split: np.ndarray | None = None

    @classmethod
    def leaf(cls, max_nodes: int) -> _Level:
        g = np.full(max_nodes + 1, -np.inf)
        g[0] = 0.0  # no levels left: only the empty set of children fits
        return cls(g)


class _Grid:
    """The index arrays of the max-plus convolution, built once per size."""

    def __init__(self, max_nodes: int, width: int):
        n = max_nodes
        self.n, self.width = n, width
        m_idx, k_idx = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        self.rest = np.where(k_idx <= m_idx, m_idx - k_idx, n + 1)  # index n + 1 holds -inf: k > m is impossible
        self.rows = np.arange(n + 1)

    def level(self, below: _Level, row: tuple[float, ...]) -> _Level:
        """The level above `below`, whose children are accepted with row[rank]."""
        n = self.n
        subtree = np.full(n + 1, -np.inf)
        subtree[1:] = 1.0 + below.g[:-1]  # a child with k nodes in its subtree: itself, k - 1 below
        ranks_so_far = np.full(n + 1, -np.inf)
        ranks_so_far[0] = 0.0
        best = ranks_so_far.copy()
        choice = np.zeros(n + 1, dtype=np.int64)
        split = np.zeros((self.width + 1, n + 1), dtype=np.int64)
        fits = np.isfinite(subtree)
        for c in range(1, self.width + 1):
            gain = row[c - 1] * subtree if row[c - 1] > 0 else np.where(fits, 0.0, -np.inf)  # 0 * -inf is nan
            total = np.append(ranks_so_far, -np.inf)[self.rest] + gain[None, :]  # [m, k]: k nodes to rank c - 1
            split[c] = np.argmax(total, axis=1)
            ranks_so_far = total[self.rows, split[c]]
            better = ranks_so_far > best + _TIE
            best = np.where(better, ranks_so_far, best)
            choice = np.where(better, c, choice)
        return _Level(best, choice, split)


def _build(levels: list[_Level], h: int, m: int) -> list:
    """The nested children lists of the best m nodes below a node with h levels left, in rank order."""
    if m == 0:
        return []
    level = levels[h]
    children = []
    for c in range(int(level.choice[m]), 0, -1):
        k = int(level.split[c][m])
        children.append(_build(levels, h - 1, k - 1))
        m -= k
    assert m == 0, m
    return children[::-1]


def _flatten(root_children: list) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Breadth-first (parents, ranks) of a nested children list."""
    parents, ranks = [], []
    queue = [(ROOT, root_children)]
    for parent, kids in queue:
        for rank, grandkids in enumerate(kids):
            parents.append(parent)
            ranks.append(rank)
            queue.append((len(parents) - 1, grandkids))
    return tuple(parents), tuple(ranks)
