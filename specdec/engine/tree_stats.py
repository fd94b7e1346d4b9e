"""The acceptance vector, learnt online from tree verdicts: the drafter half of Sequoia's input.

p[r] is the chance that a node's rank-r candidate is the one the target accepts, given the
node was accepted. Every verdict shows, at each position it walked through (the root and
every accepted node that had children), which of the offered candidates won, or that none
did. A rank's estimate counts only positions that offered that rank: a position with two
children says nothing about rank 2, and counting it as "rank 2 lost" would drag p[2]
toward zero for every narrow tree (and then the planner would never try a wide one).

Like the chain's running acceptance (draft_length.py): a prior, refined per observation
with exponential forgetting, so the estimate follows the file being edited. The prior
counts as `prior_weight` observations at the start and fades like any old observation;
a rank never offered keeps its prior.

For greedy decoding and deterministic candidates the marginal of a rank does not depend
on which other ranks were offered, so these per-rank rates are what the planner needs.
A drafter whose width depends on its confidence (EAGLE-2) offers deep ranks mostly where
it is unsure; those estimates then describe such positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specdec.engine.acceptance import TreeVerdict
from specdec.engine.tree import ROOT, TokenTree


def _default_prior() -> list[float]:
    return [0.6, 0.1, 0.05, 0.03, 0.02, 0.01, 0.01, 0.01]


@dataclass
class AcceptanceVector:
    """Per-rank acceptance, pooled over depths and per depth.

    width:        ranks tracked; deeper ranks are ignored (the planner never offers them).
    prior:        [width] starting estimate (padded with its last value, cut to width).
    decay:        weight of history per observation of a rank.
    prior_weight: how many observations the prior is worth at the start.
    max_depth:    depths tracked apart; deeper positions share the last row.
    """

    width: int = 8
    prior: list[float] = field(default_factory=_default_prior)
    decay: float = 0.97
    prior_weight: float = 4.0
    max_depth: int = 8
    _hits: list[float] = field(init=False, repr=False)  # decayed count of positions where rank r won
    _offers: list[float] = field(init=False, repr=False)  # decayed count of positions that offered rank r
    _depth_hits: list[list[float]] = field(init=False, repr=False)  # [depth - 1][rank], no prior
    _depth_offers: list[list[float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.width < 1 or self.max_depth < 1:
            raise ValueError(f"width ({self.width}) and max_depth ({self.max_depth}) must be >= 1")
        if not 0.0 < self.decay <= 1.0 or self.prior_weight <= 0:
            raise ValueError(f"decay ({self.decay}) must be in (0, 1] and prior_weight ({self.prior_weight}) > 0")
        prior = list(self.prior)[: self.width] or [0.0]
        prior += [prior[-1]] * (self.width - len(prior))
        if any(not 0.0 <= x <= 1.0 for x in prior):
            raise ValueError(f"prior {prior}: each rank's acceptance must be in [0, 1]")
        self.prior = prior
        self.reset()

    def reset(self) -> None:
        """Back to the prior."""
        self._hits = [self.prior_weight * p for p in self.prior]
        self._offers = [self.prior_weight] * self.width
        self._depth_hits = [[0.0] * self.width for _ in range(self.max_depth)]
        self._depth_offers = [[0.0] * self.width for _ in range(self.max_depth)]

    def observe(self, tree: TokenTree, verdict: TreeVerdict, ranks: Sequence[int] | None = None) -> None:
        """Fold in one verified tree. ranks: [n] each node's candidate rank; by default its place
        among its parent's children (drafters list a node's children best first)."""
        if ranks is None:
            ranks = [0] * len(tree)
            for parent in range(ROOT, len(tree)):
                for rank, child in enumerate(tree.children(parent)):
                    ranks[child] = rank
        elif len(ranks) != len(tree):
            raise ValueError(f"{len(ranks)} ranks for a tree of {len(tree)} nodes")
        visited = [ROOT, *verdict.path]
        for i, position in enumerate(visited):
            children = tree.children(position)
            if not children:  # an accepted leaf: its bonus token was never a candidate
                continue
            won = visited[i + 1] if i + 1 < len(visited) else None
            if won is not None and tree.parents[won] != position:
                raise ValueError(f"verdict path {verdict.path} does not follow the tree's parents")
            depth = 1 if position == ROOT else tree.depths[position] + 1
            self.observe_position((ranks[c] for c in children), None if won is None else ranks[won], depth)

    def observe_position(self, offered: Iterable[int], accepted: int | None, depth: int = 1) -> None:
        """One position: the ranks it offered, the rank accepted (None: none was), the children's depth."""
        row = min(max(depth, 1), self.max_depth) - 1
        for rank in sorted(set(offered)):
            if not 0 <= rank < self.width:
                continue
            hit = 1.0 if rank == accepted else 0.0
            self._hits[rank] = self.decay * self._hits[rank] + hit
            self._offers[rank] = self.decay * self._offers[rank] + 1.0
            self._depth_hits[row][rank] = self.decay * self._depth_hits[row][rank] + hit
            self._depth_offers[row][rank] = self.decay * self._depth_offers[row][rank] + 1.0

    def vector(self) -> list[float]:
        """[width] acceptance per rank, pooled over depths; scaled to sum <= 1 (marginals of one event)."""
        return _sub_probability([h / o for h, o in zip(self._hits, self._offers)])

    def rows(self, depths: int | None = None) -> list[list[float]]:
        """[depths, width] per-depth acceptance (row d-1 = depth d; best_shape reuses the last row
        deeper), each shrunk toward the pooled vector by prior_weight observations, so a depth
        seldom reached borrows from the others. depths: how many rows (default max_depth); fewer
        rows plan faster."""
        count = self.max_depth if depths is None else max(1, min(depths, self.max_depth))
        pooled = self.vector()
        out = []
        for d in range(count):
            # the last row gathers every depth from there down
            hits = [sum(col) for col in zip(*self._depth_hits[d:])] if d == count - 1 else self._depth_hits[d]
            offers = [sum(col) for col in zip(*self._depth_offers[d:])] if d == count - 1 else self._depth_offers[d]
            out.append(_sub_probability([(h + self.prior_weight * p) / (o + self.prior_weight)
                                         for h, o, p in zip(hits, offers, pooled)]))
        return out


def _sub_probability(row: list[float]) -> list[float]:
    """Ranks estimated over different positions can sum past 1 by noise; the true marginals cannot."""
    total = sum(row)
    return [x / total for x in row] if total > 1.0 else row
