"""Sequoia at run time: the next draft's tree shape from what this session has measured.

The dynamic program (tree_shape.best_shape) needs two inputs. The hardware's: the cost
curve of a target pass over n tokens, measured at load (cost_curve.py) and corrected by every
verify pass since (learned_cost.py).
The drafter's: the acceptance of its r-th best candidate at each depth, learnt from every
verdict (tree_stats.AcceptanceVector), plus what one level of drafting costs, learnt from
the drafter's own timings. A planner owns the last two and asks the program before every
draft, so the tree grows where the draft keeps being right and shrinks to a chain, or to
nothing, where branching or drafting does not pay on this machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdec.engine.acceptance import TreeVerdict
from specdec.engine.cost_curve import CostCurve
from specdec.engine.learned_cost import LearnedCostCurve
from specdec.engine.tree import TokenTree
from specdec.engine.tree_shape import TreeShape, best_shape
from specdec.engine.tree_stats import AcceptanceVector

PLANNED_DEPTHS = 3  # acceptance rows the program sees (deeper reuses the last): planning stays cheap


@dataclass
class TreePlanner:
    """cost: seconds of one target pass over n tokens (a CostCurve, or the LearnedCostCurve that moves under it).
    max_nodes / max_depth: hard caps on the tree."""

    cost: CostCurve | LearnedCostCurve
    acceptance: AcceptanceVector = field(default_factory=AcceptanceVector)
    max_nodes: int = 16
    max_depth: int = 8
    draft_level_seconds: float | None = None  # one level of drafting, running estimate (None: not yet timed)
    level_prior: float = 0.4  # a level's cost before any timing, in one-token target passes
    smoothing: float = 0.3  # weight of the newest timing
    explore_every: int = 16  # after this many plain steps in a row, one 2-node draft re-measures the draft
    slowdown: float | None = None  # live target pass seconds / the curve's, running estimate (None: not yet timed)
    last: TreeShape | None = None  # the latest plan, for the benchmark's report
    _plain_steps: int = field(default=0, repr=False)

    def plan(self, cap: int) -> TreeShape:
        """The best shape of at most min(cap, max_nodes) nodes. Acceptance is rounded to 1e-2, far below its
        own noise, so best_shape's cache answers most calls; down, so a row summing to 1 stays a law."""
        rows = [[math.floor(p * 100 + 1e-9) / 100 for p in row] for row in self.acceptance.rows(PLANNED_DEPTHS)]
        nodes = max(0, min(cap, self.max_nodes))
        seconds = self.draft_level_seconds
        # the draft is timed live, the curve was measured once (maybe on a quieter machine): a level's
        # cost goes into the curve's units by how much slower than the curve the target runs now
        level = round(self.level_prior * self.cost(1) if seconds is None else seconds / (self.slowdown or 1.0), 4)
        shape = best_shape(rows, self.cost, draft_level_cost=level, max_depth=max(1, min(self.max_depth, nodes)),
                           max_nodes=nodes) if nodes else TreeShape((), ())
        if nodes and not len(shape):
            # nothing is learnt while nothing is drafted: now and then a two-token draft checks
            # whether the file being edited has become predictable again
            self._plain_steps += 1
            if self._plain_steps >= self.explore_every:  # two nodes: the second level is timed even after a catch-up
                shape = TreeShape.chain(min(2, nodes))
        if len(shape):
            self._plain_steps = 0
        self.last = shape
        return shape

    def observe(self, tree: TokenTree, verdict: TreeVerdict, draft_seconds: float, levels: int,
                pass_seconds: float = 0.0) -> None:
        """Fold in one verified tree (ranks: each node's place among its siblings, best first),
        the seconds its `levels` sequential draft passes took, and the seconds the target's pass
        over it took (0: not timed)."""
        self.acceptance.observe(tree, verdict)
        if levels > 0 and draft_seconds > 0:
            self.draft_level_seconds = _track(self.draft_level_seconds, draft_seconds / levels, self.smoothing)
        if pass_seconds > 0:
            self.slowdown = _track(self.slowdown, pass_seconds / self.cost(1 + len(tree)), self.smoothing)


def _track(old: float | None, measured: float, smoothing: float) -> float:
    """A running estimate of a cost: down at once, up smoothly. Another process or a first call's warm-up
    only ever adds time, and an estimate stuck high stops the drafting that would correct it."""
    smoothed = measured if old is None else (1 - smoothing) * old + smoothing * measured
    return min(smoothed, measured)
