"""The draft model drafting a tree: grown EAGLE-2 style, or filled into a planned shape.

A chain bets every step on the draft's first choice; where the draft hesitates, a tree
also offers its runners-up, and one target pass verifies them all. The tree is built
level by level, one `extend_tree` pass of the draft per level. Grown (TreeLimits): the
level's most probable nodes (cumulative draft probability along their path) get the
draft's top `branch` tokens as children, and the most probable `budget` nodes overall
are kept; since a child is never more probable than its parent, they form a tree.
Planned (tree_shape.TreeShape, Sequoia's planner): each node of the shape is its
parent's rank-th best draft token.

Children are the draft's top-k, not samples, so the acceptance rule takes them as
deterministic (q one-hot per child) and sampling stays lossless whatever the shape.
Siblings come in rank order (TokenTree.rank = the draft's rank). After verification the
draft's cache keeps the accepted branch (`CachedLM.keep_path`), so the next round
computes only what the draft has not seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.sampling import SamplingConfig, probabilities
from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_plan import TreePlanner

# tokens a steady draft's sync computes: the bonus token, and a leaf of the accepted branch the draft never ran
STEADY_CATCH_UP = 2
from specdec.engine.tree_shape import TreeShape
from specdec.errors import SpecdecError


@dataclass
class TreeLimits:
    """How big a tree to grow when no shape is planned; read at every propose, so it may
    change between calls."""

    budget: int = 16  # nodes the target verifies, at most (the session's k caps it too)
    depth: int = 6  # levels, at most
    branch: int = 4  # children per expanded node: the draft's top-`branch` tokens
    width: int = 4  # nodes expanded per level: the level's most probable

    def __post_init__(self) -> None:
        for name in ("budget", "depth", "branch", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecdecError(f"tree limits: {name} must be a positive integer, got {value!r}")


class DraftTree(DraftModel):
    """The draft model's tree drafter. `length` only keeps the running acceptance and cost
    estimates (what Composite compares); the limits or the planned shape decide the tree.

    shape: a planned TreeShape to fill at every propose (None: grow within `limits`); the
    planner may set it (or pass one per call) whenever it likes. The empty shape drafts nothing.
    planner: Sequoia at run time; when set, it plans the shape of every draft that is given
    none, and learns from every verdict.
    """

    name = "draft-tree"

    def __init__(self, model, limits: TreeLimits | None = None, length: DraftLength | None = None,
                 shape: TreeShape | None = None, planner: TreePlanner | None = None, view=None):
        super().__init__(model, length, view)
        self.kv.check_tree_attention()
        self.limits = limits or TreeLimits()
        self.shape = shape
        self.planner = planner
        # the last tree proposed, and each node's slot in the draft cache's tree region
        # (None: a node without children, never run through the draft)
        self._pending: tuple[TokenTree, list[int | None]] | None = None
        self.catch_up = 0  # tokens the latest draft's sync computed before its first level
        self._timed = (0.0, 0.0, 0)  # the latest draft: sync seconds, seconds of its level passes, level passes
        self._levels_run = 0  # level passes of the draft being built

    def reset(self) -> None:
        super().reset()
        self._pending = None
        self.catch_up = 0
        self._timed = (0.0, 0.0, 0)

    def level_timing(self) -> float:
        """Seconds per draft level of the latest draft, for a planner to learn from; 0.0 when it
        timed no level. Timed here rather than taken from the session's draft seconds: the sync
        counts as a level only when it ran the usual bonus token or two. After plain steps it runs
        every token the target produced alone, which made a level look many times dearer than it
        is, and a planner that believed it never drafted again."""
        sync_seconds, level_seconds, levels = self._timed
        if self.catch_up <= STEADY_CATCH_UP:
            return (sync_seconds + level_seconds) / (levels + 1)
        return level_seconds / levels if levels else 0.0

    def propose(self, context: list[int], k: int, sampling: SamplingConfig, generator: torch.Generator | None = None,
                *, limits: TreeLimits | None = None, shape: TreeShape | None = None, request=None) -> Draft:
        """A tree of at most k nodes: `shape` (this call's, else self.shape) cut to its first k
        nodes, or else grown within `limits` (this call's, else self.limits).

        No randomness is drawn: children are top-k, so `generator` is unused; so is `request`.
        """
        shape = shape if shape is not None else self.shape
        if shape is None and limits is None and self.planner is not None:
            shape = self.planner.plan(k)
        limits = limits or self.limits
        nodes = min(len(shape) if shape is not None else limits.budget, k)
        self._pending = None
        if nodes <= 0:
            return Draft([], None, self.name, plan=shape)
        started = time.perf_counter()
        # the view's tokens; also drops what is left of an unverified tree
        logits, _, self.catch_up = self.kv.sync(self.seen(context))
        synced = time.perf_counter()
        self._levels_run = 0
        belief = self._belief(logits[None], sampling)[0]
        if shape is not None:
            tree, slots = self._fill(belief, shape, nodes, sampling)
        else:
            tree, slots = self._grow(belief, limits, nodes, sampling)
        self._timed = (synced - started, time.perf_counter() - synced, self._levels_run)
        self._pending = (tree, slots)
        return Draft.of_tree(tree, self.name, plan=shape)

    def _fill(self, root_belief: torch.Tensor, shape: TreeShape, nodes: int,
              sampling: SamplingConfig) -> tuple[TokenTree, list[int | None]]:
        """The shape's first `nodes` nodes (parents precede children: a tree), node i = the
        ranks[i]-th best draft token after its parent."""
        parents = list(shape.parents[:nodes])
        offered = [0] * (nodes + 1)  # children per position (ROOT = 0, node i = i + 1)
        for parent in parents:
            offered[parent + 1] += 1
        tokens: list[int] = [0] * nodes
        slots: list[int | None] = [None] * nodes
        ranked = {ROOT: torch.topk(root_belief, offered[0]).indices.tolist()}
        for level in shape.levels():
            level = [i for i in level if i < nodes]
            if not level:
                break
            for i in level:
                tokens[i] = ranked[parents[i]][shape.ranks[i]]
            expand = [i for i in level if offered[i + 1]]
            if not expand:
                continue
            beliefs = self._run_level(expand, tokens, parents, slots, sampling)
            for j, i in enumerate(expand):
                ranked[i] = torch.topk(beliefs[j], offered[i + 1]).indices.tolist()
        return TokenTree(tokens, parents), slots

    def _grow(self, root_belief: torch.Tensor, limits: TreeLimits, budget: int,
              sampling: SamplingConfig) -> tuple[TokenTree, list[int | None]]:
        """EAGLE-2: expand each level's `width` most probable nodes, keep the `budget` best."""
        tokens: list[int] = []
        parents: list[int] = []  # candidate index, or ROOT
        scores: list[float] = []  # cumulative draft probability of the path to the candidate
        depths: list[int] = []
        slots: list[int | None] = []

        def add_children(belief: torch.Tensor, parent: int, score: float, depth: int) -> None:
            top = torch.topk(belief, min(limits.branch, belief.shape[-1]))
            for p, token in zip(top.values.tolist(), top.indices.tolist()):
                if p <= 0:  # outside the sampling law (top-k/top-p cut): never worth a node
                    break
                tokens.append(token)
                parents.append(parent)
                scores.append(score * p)
                depths.append(depth)
                slots.append(None)

        add_children(root_belief, ROOT, 1.0, 1)
        level_start = 0
        for depth in range(1, min(limits.depth, budget)):  # the levels whose nodes may get children
            level, level_start = range(level_start, len(tokens)), len(tokens)
            # below the budget-th best score a node cannot be kept, nor can anything under it
            floor = sorted(scores, reverse=True)[budget - 1] if len(scores) >= budget else 0.0
            frontier = [i for i in sorted(level, key=lambda i: -scores[i])[: limits.width] if scores[i] >= floor]
            if not frontier:
                break
            beliefs = self._run_level(frontier, tokens, parents, slots, sampling)
            for j, i in enumerate(frontier):
                add_children(beliefs[j], i, scores[i], depth + 1)

        # best first; on a tie the shallower (an ancestor) first, so the kept set is a tree
        kept: set[int] = set()
        for i in sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i)):
            if len(kept) == budget:
                break
            if parents[i] == ROOT or parents[i] in kept:
                kept.add(i)
        chosen = sorted(kept)  # candidate order: parents first, siblings by rank
        node = {c: n for n, c in enumerate(chosen)}
        tree = TokenTree([tokens[c] for c in chosen], [ROOT if parents[c] == ROOT else node[parents[c]] for c in chosen])
        return tree, [slots[c] for c in chosen]

    def _run_level(self, nodes: list[int], tokens: list[int], parents: list[int], slots: list[int | None],
                   sampling: SamplingConfig) -> torch.Tensor:
        """One draft pass over a level's `nodes` (their parents already run): records each node's
        slot in the draft cache's tree region and returns the draft's beliefs after them, one row each."""
        self._levels_run += 1
        first_slot = len(self.kv.tree_tokens)
        rows = self.kv.extend_tree([tokens[i] for i in nodes],
                                   [ROOT if parents[i] == ROOT else slots[parents[i]] for i in nodes])
        for j, i in enumerate(nodes):
            slots[i] = first_slot + j
        return self._belief(rows, sampling)

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float,
                verdict=None) -> None:
        """Learn as a chain of the tree's depth would (one draft pass per level), and keep the
        accepted branch in the draft cache (verdict: the session's TreeVerdict)."""
        tree = draft.as_tree()
        self.length.observe(tree.depth, accepted, draft_seconds, target_pass_seconds)
        if self.planner is not None and verdict is not None:
            self.planner.observe(tree, verdict, self.level_timing(), 1, pass_seconds=target_pass_seconds)
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not draft.tree or verdict is None:
            self.kv.keep_path([])  # nothing to keep by: the next sync computes the accepted tokens
            return
        slots = pending[1]
        path = []
        for n in verdict.path:
            if slots[n] is None:  # a node without children: the draft never ran it
                break
            path.append(slots[n])
        self.kv.keep_path(path)

    @staticmethod
    def _belief(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """[rows, vocab]: the draft's law for the next token. Greedy's law is one-hot and would
        rank nothing past the argmax, so greedy ranks by the plain softmax."""
        if sampling.greedy:
            return logits.float().softmax(-1)
        return probabilities(logits, sampling)
