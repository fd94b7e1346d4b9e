"""The draft model drafting a tree, EAGLE-2 style.

A chain bets every step on the draft's first choice; where the draft hesitates, a tree
also offers its runners-up, and one target pass verifies them all. The tree grows
level by level, one `extend_tree` pass of the draft per level: the level's most probable
nodes (cumulative draft probability along their path) get the draft's top `branch`
tokens as children. The most probable `budget` nodes overall are kept; since a child is
never more probable than its parent, they form a tree.

Children are the draft's top-k, not samples, so the acceptance rule takes them as
deterministic (q one-hot per child) and sampling stays lossless whatever the shape.
After verification the draft's cache keeps the accepted branch (`KVModel.keep_path`),
so the next round computes only what the draft has not seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.sampling import SamplingConfig, probabilities
from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_attention import check_tree_attention
from specdec.engine.tree_plan import TreePlanner
from specdec.engine.tree_shape import TreeShape
from specdec.errors import SpecdecError


@dataclass
class TreeSize:
    """How big a tree to draft; read at every propose, so a planner may change it between calls."""

    budget: int = 16  # nodes the target verifies, at most (the session's k caps it too)
    depth: int = 6  # levels, at most
    branch: int = 4  # children per expanded node: the draft's top-`branch` tokens
    width: int = 4  # nodes expanded per level: the level's most probable

    def __post_init__(self) -> None:
        for name in ("budget", "depth", "branch", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecdecError(f"tree shape: {name} must be a positive integer, got {value!r}")

    @classmethod
    def of(cls, shape: TreeShape) -> TreeSize:
        """The size of a planned shape (non-empty): its nodes, levels, widest fan-out and the most
        nodes of one level that have children. The drafter fills it dynamically, best first,
        which keeps at least the planned shape's nodes when the draft ranks as the plan assumed."""
        expanded = [sum(1 for i in level if shape.children(i)) for level in shape.levels()]
        return cls(budget=len(shape), depth=shape.depth, branch=max(1, shape.width), width=max(1, *expanded))


class DraftTree(DraftModel):
    """The draft model's tree drafter. `length` only keeps the running acceptance and cost
    estimates (what Composite compares); the shape decides the tree's size."""

    name = "draft-tree"

    def __init__(self, model, shape: TreeSize | None = None, length: DraftLength | None = None,
                 planner: TreePlanner | None = None):
        super().__init__(model, length)
        check_tree_attention(model)
        self.shape = shape or TreeSize()
        self.planner = planner  # set: Sequoia's program sizes every tree (shape is then ignored)
        # the last tree proposed, and each node's slot in the draft cache's tree region
        # (None: a last-level node, never run through the draft)
        self._pending: tuple[TokenTree, list[int | None]] | None = None

    def reset(self) -> None:
        super().reset()
        self._pending = None

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None = None, shape: TreeSize | None = None) -> Draft:
        """A tree of at most min(shape.budget, k) nodes (shape: this call's, else self.shape).

        No randomness is drawn: children are top-k, so `generator` is unused.
        """
        self._pending = None
        if shape is None and self.planner is not None:
            planned = self.planner.plan(k)
            if not len(planned):  # drafting does not pay right now: a plain step
                return Draft([], None, self.name)
            shape = TreeSize.of(planned)
        shape = shape or self.shape
        budget = min(shape.budget, k)
        if budget <= 0:
            return Draft([], None, self.name)
        logits, _, _ = self.kv.sync(context)  # also drops what is left of an unverified tree
        tokens: list[int] = []
        parents: list[int] = []  # candidate index, or ROOT
        scores: list[float] = []  # cumulative draft probability of the path to the candidate
        depths: list[int] = []
        slots: list[int | None] = []

        def add_children(belief: torch.Tensor, parent: int, score: float, depth: int) -> None:
            top = torch.topk(belief, min(shape.branch, belief.shape[-1]))
            for p, token in zip(top.values.tolist(), top.indices.tolist()):
                if p <= 0:  # outside the sampling law (top-k/top-p cut): never worth a node
                    break
                tokens.append(token)
                parents.append(parent)
                scores.append(score * p)
                depths.append(depth)
                slots.append(None)

        add_children(self._belief(logits[None], sampling)[0], ROOT, 1.0, 1)
        level_start = 0
        for depth in range(1, min(shape.depth, budget)):  # the levels whose nodes may get children
            level, level_start = range(level_start, len(tokens)), len(tokens)
            # below the budget-th best score a node cannot be kept, nor can anything under it
            floor = sorted(scores, reverse=True)[budget - 1] if len(scores) >= budget else 0.0
            frontier = [i for i in sorted(level, key=lambda i: -scores[i])[: shape.width] if scores[i] >= floor]
            if not frontier:
                break
            first_slot = len(self.kv.tree_tokens)
            rows = self.kv.extend_tree([tokens[i] for i in frontier],
                                       [ROOT if parents[i] == ROOT else slots[parents[i]] for i in frontier])
            beliefs = self._belief(rows, sampling)
            for j, i in enumerate(frontier):
                slots[i] = first_slot + j
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
        self._pending = (tree, [slots[c] for c in chosen])
        return Draft.of_tree(tree, self.name)

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float,
                verdict=None) -> None:
        """Learn as a chain of the tree's depth would (one draft pass per level), and keep the
        accepted branch in the draft cache (verdict: the session's TreeVerdict)."""
        tree = draft.as_tree()
        self.length.observe(tree.depth, accepted, draft_seconds, target_pass_seconds)
        if self.planner is not None and verdict is not None:
            self.planner.observe(tree, verdict, draft_seconds, tree.depth)
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not draft.tree or verdict is None:
            self.kv.keep_path([])  # nothing to keep by: the next sync computes the accepted tokens
            return
        slots = pending[1]
        path = []
        for n in verdict.path:
            if slots[n] is None:  # a last-level node: the draft never ran it, nor anything below
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
