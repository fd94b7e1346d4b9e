"""Token trees: the draft as a first-class tree; a chain is the one-branch tree.

Positions index everything that is "per place a token is predicted": position 0 is the
root (the last verified token), position i + 1 is node i. The target's rows, the draft
distributions and how children were drawn are all per position, so a node's children
share the q they were drawn from (the probabilities of the node's siblings live at the
parent's position).

Kept apart from drafting.py so the acceptance rule can import it without the drafter
interface, and drafters can build trees without the acceptance rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

Drawn = Literal["sampled with replacement", "without replacement", "deterministic"]
WITH_REPLACEMENT: Drawn = "sampled with replacement"
WITHOUT_REPLACEMENT: Drawn = "without replacement"
DETERMINISTIC: Drawn = "deterministic"
DRAWN: tuple[Drawn, ...] = (WITH_REPLACEMENT, WITHOUT_REPLACEMENT, DETERMINISTIC)

ROOT = -1  # the parent index of the root's children


@dataclass
class TokenTree:
    """n drafted nodes in topological order (parents precede children).

    tokens:      [n] token id per node.
    parents:     [n] parent node index per node; -1 = child of the root.
    child_probs: [n + 1, vocab] float or None. Row j is the draft distribution q the
                 children of position j were drawn from (row 0 = root, row i + 1 = node i);
                 rows of leaves are unused. None when every position is deterministic.
    drawn:       how children were drawn, per position ([n + 1]); a single value means
                 the same for every position. Sampled children need their row of q;
                 deterministic ones (top-k, lookup) need none: the rule takes q one-hot.
    depths:      [n] derived; the root's children have depth 1.
    """

    tokens: list[int]
    parents: list[int]
    child_probs: torch.Tensor | None = None
    drawn: Drawn | list[Drawn] = DETERMINISTIC
    depths: list[int] = field(init=False)
    _children: list[list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if isinstance(self.drawn, str):
            self.drawn = [self.drawn] * (n + 1)
        self.drawn = list(self.drawn)
        self.validate()
        self.depths = []
        self._children = [[] for _ in range(n + 1)]
        for i, parent in enumerate(self.parents):
            self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
            self._children[parent + 1].append(i)

    def validate(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n:
            raise ValueError(f"{n} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must precede children")
        if len(self.drawn) != n + 1:
            raise ValueError(f"drawn has {len(self.drawn)} entries, need one per position ({n + 1})")
        bad = [d for d in self.drawn if d not in DRAWN]
        if bad:
            raise ValueError(f"unknown way of drawing children: {bad[0]!r}; one of {DRAWN}")
        has_children = [False] * (n + 1)
        for parent in self.parents:
            has_children[parent + 1] = True
        sampled = [j for j in range(n + 1) if has_children[j] and self.drawn[j] != DETERMINISTIC]
        if sampled and self.child_probs is None:
            raise ValueError(f"position {sampled[0]} has sampled children but no child_probs")
        if self.child_probs is not None and self.child_probs.shape[0] != n + 1:
            raise ValueError(f"child_probs has {self.child_probs.shape[0]} rows, need n + 1 = {n + 1}")

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Child node indices of node (ROOT = -1 for the root), in drafting order."""
        return self._children[node + 1]

    @property
    def depth(self) -> int:
        """The longest path's length (0 for the empty tree)."""
        return max(self.depths, default=0)

    def rank(self, node: int) -> int:
        """node's place among its parent's children (0 = first tried): what a tree learner counts."""
        return self.children(self.parents[node]).index(node)

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to node (empty for the root)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    @classmethod
    def chain(cls, tokens: list[int], probs: torch.Tensor | None = None) -> "TokenTree":
        """The one-branch tree of a linear draft. probs: [k, vocab] (row i = q of token i) or None."""
        k = len(tokens)
        child_probs = None
        if probs is not None:
            child_probs = torch.cat([probs, probs.new_zeros(1, probs.shape[-1])])  # the leaf's row is unused
        return cls(list(tokens), list(range(-1, k - 1)), child_probs,
                   WITH_REPLACEMENT if probs is not None else DETERMINISTIC)
