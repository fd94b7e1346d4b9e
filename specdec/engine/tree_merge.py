"""Token trees as tries: token paths merged so shared prefixes are verified once.

Drafts that agree on a prefix should cost one row per shared token, and drafts that
disagree become siblings, so the target picks whichever continuation is right. That is
a trie: `trie` builds one from token paths (prompt lookup's several continuations),
`union` merges whole trees (lookup's and the draft model's), `prune_to_shape` keeps the
part of a tree a planned shape (tree_shape.py) has room for.

Merged trees have deterministic children: a merged position holds candidates from
different sources, so no single q describes them. That stays exact under sampling (the
candidates do not depend on the target's draws, and the rule takes q one-hot at each);
what is given up is the p/q credit a sampled draft would have had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specdec.engine.tree import DETERMINISTIC, ROOT, TokenTree
from specdec.engine.tree_shape import TreeShape


class _Trie:
    """Nodes in insertion order; (parent, token) -> node."""

    def __init__(self, max_nodes: int | None):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.origins: list[int] = []  # per node: which input put it there
        self.index: dict[tuple[int, int], int] = {}
        self.max_nodes = max_nodes

    def full(self) -> bool:
        return self.max_nodes is not None and len(self.tokens) >= self.max_nodes

    def child(self, parent: int, token: int, origin: int = 0) -> int | None:
        """The node for token under parent, added (credited to origin) if new and there is room (None if not)."""
        found = self.index.get((parent, token))
        if found is not None or self.full():
            return found
        self.tokens.append(token)
        self.parents.append(parent)
        self.origins.append(origin)
        self.index[(parent, token)] = len(self.tokens) - 1
        return len(self.tokens) - 1

    def tree(self) -> TokenTree:
        return TokenTree(self.tokens, self.parents, None, DETERMINISTIC)


def trie(paths: Iterable[Sequence[int]], max_nodes: int | None = None) -> TokenTree:
    """One tree holding every path (each a token sequence after the root), best path first:
    earlier paths keep their nodes when the budget runs out and take the lower ranks among
    siblings. A path that does not fit is cut where the budget ends."""
    out = _Trie(max_nodes)
    for path in paths:
        node = ROOT
        for token in path:
            node = out.child(node, int(token))
            if node is None:
                break
    return out.tree()


def union(trees: Sequence[TokenTree], max_nodes: int | None = None) -> TokenTree:
    """Every token path of every tree, once. Nodes are taken round-robin, each tree in its own
    node order (a tree's first nodes are its best), so under a budget each tree keeps its best
    part; the first tree's candidates come first among siblings. Without a budget the union
    contains each tree's paths, so greedy verification accepts at least as much as on any of them."""
    return union_origins(trees, max_nodes)[0]


def union_origins(trees: Sequence[TokenTree], max_nodes: int | None = None) -> tuple[TokenTree, list[int]]:
    """`union`, and per node of it the index of the tree that put it there (the first to reach it,
    round-robin): what per-source statistics credit a merged node to."""
    out = _Trie(max_nodes)
    mapped: list[list[int | None]] = [[None] * len(t) for t in trees]
    for i in range(max((len(t) for t in trees), default=0)):
        for t, tree in enumerate(trees):
            if i >= len(tree):
                continue
            parent = tree.parents[i]
            at = ROOT if parent == ROOT else mapped[t][parent]
            if at is not None:  # the parent fitted
                mapped[t][i] = out.child(at, tree.tokens[i], t)
    return out.tree(), out.origins


def prune_to_shape(tree: TokenTree, shape: TreeShape) -> TokenTree:
    """The nodes of tree whose rank path (place among siblings, level by level) is in shape:
    a big candidate tree (lookup's trie) cut to the planner's shape. Kept children are a
    prefix of their siblings, so drafts drawn without replacement keep their law; child_probs
    and drawn follow the kept positions."""
    wanted = {shape.rank_path(i) for i in range(len(shape))}
    keep: list[int] = []
    rank_path: dict[int, tuple[int, ...]] = {ROOT: ()}
    for parent in range(ROOT, len(tree)):
        if parent not in rank_path:
            continue
        for rank, child in enumerate(tree.children(parent)):
            path = rank_path[parent] + (rank,)
            if path in wanted:
                rank_path[child] = path
                keep.append(child)
    keep.sort()  # the original order is topological
    new_index = {old: new for new, old in enumerate(keep)}
    parents = [ROOT if tree.parents[i] == ROOT else new_index[tree.parents[i]] for i in keep]
    positions = [0] + [i + 1 for i in keep]
    probs = None if tree.child_probs is None else tree.child_probs[positions]
    return TokenTree([tree.tokens[i] for i in keep], parents, probs, [tree.drawn[j] for j in positions])
