"""Prompt lookup as a tree: every distinct continuation of the context's last n-gram, at once.

Code repeats itself in several ways at once (`self.x = x` then `self.y = y`; a call with
different arguments): the chain drafter bets on the newest repeat and loses the pass when
another was right. Drafting is free, so the tree offers several continuations and lets
one target pass pick; shared prefixes are one trie path (tree_merge.trie), different next
tokens are siblings. Candidates are deterministic (q one-hot).

Ranking: the longest matching n-gram first (the most specific evidence), newest
occurrence first within it (nearby code predicts best). The chain PromptLookup drafts is
therefore the rank-0 path (or its start, when an older occurrence runs on past where the
newest one meets the end of the context), so the tree only adds to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from specdec.engine.tree import ROOT, TokenTree
from specdec.engine.tree_merge import prune_to_shape, trie, union
from specdec.engine.tree_shape import TreeShape


def continuations(context: list[int], *, max_depth: int = 10, max_ngram: int = 3,
                  min_ngram: int = 1) -> Iterator[list[int]]:
    """What followed earlier occurrences of the context's last n-gram, best first (see module
    docstring), each up to max_depth tokens; repeats included (the trie drops them)."""
    if max_depth <= 0:
        return
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        pattern, last = context[-n:], context[-1]
        # the match must end before the pattern itself, as in PromptLookup
        for start in range(len(context) - n - 1, -1, -1):
            if context[start + n - 1] == last and context[start : start + n] == pattern:
                yield context[start + n : start + n + max_depth]


def lookup_tree(context: list[int], *, max_nodes: int | None = 16, max_branches: int = 4, max_depth: int = 10,
                max_ngram: int = 3, min_ngram: int = 1) -> TokenTree:
    """A trie of up to max_branches distinct continuations (each adding at least one new node),
    within max_nodes nodes (None: no limit); earlier (better) continuations keep their nodes when the budget ends."""
    kept: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()  # every prefix already in the trie
    for path in continuations(context, max_depth=max_depth, max_ngram=max_ngram, min_ngram=min_ngram):
        if len(kept) >= max_branches:
            break
        if tuple(path) in seen:  # nothing new: a repeat, or a prefix of an earlier continuation
            continue
        kept.append(path)
        seen.update(tuple(path[:i]) for i in range(1, len(path) + 1))
    return trie(kept, max_nodes)


@dataclass
class LookupTree:
    """The tree drafter's settings: a big trie of continuations, cut to a planned shape if given."""

    max_ngram: int = 3
    min_ngram: int = 1
    max_branches: int = 4
    max_depth: int = 10
    name: str = "lookup-tree"

    def propose_tree(self, context: list[int], max_nodes: int, shape: TreeShape | None = None) -> TokenTree:
        """Up to max_nodes nodes; with a shape, only the nodes whose rank path the shape has."""
        # with a shape the whole trie is cut to it, so the shape's deep ranks are not lost to the budget
        tree = lookup_tree(context, max_nodes=max_nodes if shape is None else None, max_branches=self.max_branches,
                           max_depth=self.max_depth, max_ngram=self.max_ngram, min_ngram=self.min_ngram)
        if shape is None:
            return tree
        return union([prune_to_shape(tree, shape)], max_nodes)  # a shape bigger than the budget: its first nodes


def as_chain(tree: TokenTree) -> list[int]:
    """The rank-0 path's tokens: the tree's chain view (PromptLookup's draft, or longer)."""
    out, node = [], ROOT
    while tree.children(node):
        node = tree.children(node)[0]
        out.append(tree.tokens[node])
    return out
