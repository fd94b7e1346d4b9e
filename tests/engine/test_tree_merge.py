"""Tries of token paths, unions of trees and pruning to a planned shape: shared prefixes become one
path, distinct tokens siblings, budgets hold, and greedy verification of a union accepts exactly
what the best of its inputs would."""

import random

import pytest
import torch

from specdec.engine.acceptance import verify_tree
from specdec.engine.sampling import SamplingConfig
from specdec.engine.tree import (
    DETERMINISTIC,
    ROOT,
    WITH_REPLACEMENT,
    WITHOUT_REPLACEMENT,
    TokenTree,
)
from specdec.engine.tree_merge import prune_to_shape, trie, union, union_origins
from specdec.engine.tree_shape import TreeShape

GREEDY = SamplingConfig(temperature=0.0)


def token_paths(tree: TokenTree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[i] for i in tree.path(node)) for node in range(len(tree))}


def test_a_trie_shares_prefixes_and_makes_distinct_tokens_siblings():
    tree = trie([[1, 2, 3], [1, 2, 4], [5], [1, 2, 3], [1]])
    assert tree.tokens == [1, 2, 3, 4, 5]
    assert tree.parents == [ROOT, 0, 1, 1, ROOT]
    assert tree.children(1) == [2, 3]  # the first path's token takes rank 0
    assert tree.child_probs is None and set(tree.drawn) == {DETERMINISTIC}
    assert token_paths(tree) == {(1,), (1, 2), (1, 2, 3), (1, 2, 4), (5,)}


def test_a_trie_cuts_later_paths_at_the_budget():
    tree = trie([[1, 2, 3], [1, 4, 5], [6]], max_nodes=4)
    assert tree.tokens == [1, 2, 3, 4] and tree.parents == [ROOT, 0, 1, 0]
    assert len(trie([[1, 2]], max_nodes=0)) == 0


def random_tree(rng: random.Random, nodes: int, vocab: int) -> TokenTree:
    parents = [ROOT if i == 0 else rng.randrange(-1, i) for i in range(nodes)]
    return TokenTree([rng.randrange(vocab) for _ in range(nodes)], parents)  # duplicates allowed


def greedy_logits(tree: TokenTree, argmax_after, vocab: int) -> torch.Tensor:
    """Row j = the target's choice after position j's token path."""
    logits = torch.zeros(len(tree) + 1, vocab)
    for position in range(len(tree) + 1):
        path = () if position == 0 else tuple(tree.tokens[i] for i in tree.path(position - 1))
        logits[position, argmax_after(path)] = 3.0
    return logits


@pytest.mark.parametrize("seed", range(40))
def test_greedy_on_a_union_accepts_what_the_best_input_accepts(seed):
    rng = random.Random(seed)
    vocab = 3
    truth = [rng.randrange(vocab) for _ in range(12)]  # the target's own continuation

    def argmax_after(path):
        return truth[len(path)]  # off the target's path no node is ever accepted, whatever this says

    trees = [random_tree(rng, rng.randint(0, 9), vocab) for _ in range(rng.randint(1, 3))]
    merged = union(trees)
    assert token_paths(merged) == set().union(*(token_paths(t) for t in trees))
    assert len(merged) == len(token_paths(merged))  # no path twice
    accepted = [verify_tree(t, greedy_logits(t, argmax_after, vocab), GREEDY).accepted_tokens for t in trees]
    verdict = verify_tree(merged, greedy_logits(merged, argmax_after, vocab), GREEDY)
    assert len(verdict.accepted_tokens) == max(len(a) for a in accepted)
    assert verdict.accepted_tokens == truth[: verdict.accepted]
    assert verdict.next_token == truth[verdict.accepted]


def test_union_dedups_keeps_the_first_trees_order_and_drops_sampled_q():
    a = TokenTree([7, 8, 9], [ROOT, ROOT, 0])
    q = torch.softmax(torch.randn(4, 10), -1)
    b = TokenTree([8, 7, 5], [ROOT, ROOT, 1], q, WITH_REPLACEMENT)
    merged = union([a, b])
    assert merged.tokens == [7, 8, 9, 5] and merged.parents == [ROOT, ROOT, 0, 0]
    assert merged.child_probs is None and set(merged.drawn) == {DETERMINISTIC}
    assert union([a, a]).tokens == a.tokens
    assert len(union([])) == 0


def test_union_under_a_budget_takes_each_trees_best_nodes_in_turn():
    a = TokenTree([1, 2, 3, 4], [ROOT, 0, 1, 2])  # a chain 1 2 3 4
    b = TokenTree([5, 6, 7], [ROOT, 0, 1])  # a chain 5 6 7
    merged = union([a, b], max_nodes=4)
    assert token_paths(merged) == {(1,), (1, 2), (5,), (5, 6)}
    assert len(union([a, b], max_nodes=0)) == 0


def test_union_credits_each_node_to_the_tree_that_put_it_there():
    a = TokenTree([1, 2, 3], [ROOT, 0, 1])  # a chain 1 2 3
    b = TokenTree([1, 4, 5], [ROOT, 0, ROOT])  # 1 4 and 5
    merged, origins = union_origins([a, b])
    assert merged.tokens == [1, 2, 4, 3, 5] and origins == [0, 0, 1, 0, 1]  # 1 is a's: a comes first in turn
    assert union_origins([b, a])[1][merged.tokens.index(1)] == 0 and union_origins([])[1] == []
    small, kept = union_origins([a, b], max_nodes=3)
    assert small.tokens == [1, 2, 4] and kept == [0, 0, 1]


def test_pruning_to_a_shape_keeps_the_rank_paths_and_their_rows():
    # root: a(10) b(11) c(12); a: d(13) e(14); d: f(15)
    q = torch.softmax(torch.randn(7, 20), -1)
    tree = TokenTree([10, 11, 12, 13, 14, 15], [ROOT, ROOT, ROOT, 0, 0, 3], q, WITHOUT_REPLACEMENT)
    chain = prune_to_shape(tree, TreeShape.chain(3))
    assert chain.tokens == [10, 13, 15] and chain.parents == [ROOT, 0, 1]
    assert torch.equal(chain.child_probs, q[[0, 1, 4, 6]]) and chain.drawn == [WITHOUT_REPLACEMENT] * 4
    shape = TreeShape((ROOT, ROOT, 0, 0), (0, 1, 0, 1))
    pruned = prune_to_shape(tree, shape)
    assert pruned.tokens == [10, 11, 13, 14] and pruned.parents == [ROOT, ROOT, 0, 0]
    assert TreeShape.of(pruned) == shape
    wider = prune_to_shape(tree, TreeShape((ROOT, ROOT, ROOT, ROOT), (0, 1, 2, 3)))  # more than the tree has
    assert wider.tokens == [10, 11, 12]
