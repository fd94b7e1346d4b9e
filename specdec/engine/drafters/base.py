"""The one small interface every drafter implements.

A drafter looks at the context (prompt + generated so far) and proposes up to k next
tokens. If it drew them from a distribution q it returns q (one row per token) so the
acceptance rule can correct for it; deterministic drafters return probs=None, which the
rule treats as q = one-hot.

A draft may be a tree (`Draft.tree`); a linear draft is the one-branch tree, and the
session verifies both the same way (`as_tree`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.engine.draft_length import DraftLength
from specdec.engine.sampling import SamplingConfig
from specdec.engine.trace import credit
from specdec.engine.tree import TokenTree
from specdec.engine.tree_shape import TreeShape


@dataclass(frozen=True)
class RequestContext:
    """What one request tells the drafters besides its tokens: handed down with every proposal
    (`Session.generate(..., request=)` → `Drafter.propose(..., request=)`), never set on a drafter, so nothing of
    one request outlives it. Most drafters ignore it; the repository drafters read it."""

    document: str | None = None  # the key of the document being completed: its own text is not drafted from
    vocabulary: object = None  # whose token ids the context is (repo_index.vocabulary_of): no match in another's


NO_REQUEST = RequestContext()


@dataclass
class Draft:
    tokens: list[int]  # a tree's: its node tokens, in node order
    probs: torch.Tensor | None = None  # [len(tokens), vocab] or None for one-hot proposals (chains only)
    source: str = ""  # which drafter produced it (the composite reports its member)
    tree: TokenTree | None = None  # None: the tokens are a chain
    sources: list[str] | None = None  # a merged tree's: per node, the source that proposed it (None: all `source`)
    plan: TreeShape | None = None  # the planner's shape this draft filled (None: unplanned), for the pass trace

    def __post_init__(self) -> None:
        if self.tree is not None and (list(self.tokens) != self.tree.tokens or self.probs is not None):
            raise ValueError("a tree draft's tokens are its tree's, and its q lives in tree.child_probs")
        if self.sources is not None and len(self.sources) != len(self.tokens):
            raise ValueError(f"{len(self.sources)} node sources for {len(self.tokens)} drafted tokens")

    @classmethod
    def of_tree(cls, tree: TokenTree, source: str = "", sources: list[str] | None = None,
                plan: TreeShape | None = None) -> Draft:
        return cls(list(tree.tokens), None, source, tree, sources, plan)

    def credit(self, path: list[int]) -> dict[str, tuple[int, int]]:
        """{source: (nodes drafted, nodes accepted)} given the accepted path (node indices): per
        node for a merged tree, else everything to `source` (the pass trace's rule, trace.credit)."""
        return credit(self.source, self.sources, len(self.tokens), path)

    def as_tree(self) -> TokenTree:
        """What the target verifies: the tree, or the chain as its one-branch tree."""
        return self.tree if self.tree is not None else TokenTree.chain(self.tokens, self.probs)


class Drafter(Protocol):
    name: str
    length: "DraftLength"  # its draft-length policy: running acceptance and cost

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None = None, request: RequestContext = NO_REQUEST) -> Draft:
        """Up to k tokens; the drafter's own DraftLength may choose fewer. request: the request's context (the
        document being completed...), as the session was handed it; most drafters ignore it."""

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float) -> None:
        """Feedback after verification, for adaptive draft length.

        For a draft with a tree the session also passes `verdict=` (the TreeVerdict: which
        node, hence which child rank, was accepted at each depth); chain drafters never get it.
        """

    def prefill(self, context: list[int], should_stop) -> tuple[int, int]:
        """Bring any model state up to the prompt (cancellable); returns (reused, computed) tokens."""

    def reset(self) -> None: ...
