"""Prompt lookup as a tree: several distinct continuations as one trie, best first, within a
budget; PromptLookup's chain is its rank-0 path (or the start of it), so the tree only adds to it."""

import random

import pytest
import torch

from specdec.engine.acceptance import verify_tree
from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.lookup_tree import (
    LookupTree,
    as_chain,
    continuations,
    lookup_tree,
)
from specdec.engine.drafters.prompt_lookup import PromptLookup
from specdec.engine.sampling import SamplingConfig
from specdec.engine.tree import DETERMINISTIC, ROOT, TokenTree
from specdec.engine.tree_shape import TreeShape

# "a b c" was followed by x y, then by z w, then by x q; the context ends in "a b c"
A, B, C, X, Y, Z, W, Q, S = range(1, 10)
CONTEXT = [A, B, C, X, Y, S, A, B, C, Z, W, S, A, B, C, X, Q, S, A, B, C]


def leaf_paths(tree: TokenTree) -> list[list[int]]:
    return [[tree.tokens[i] for i in tree.path(n)] for n in range(len(tree)) if not tree.children(n)]


def test_continuations_come_longest_match_first_then_newest_first():
    found = list(continuations(CONTEXT, max_depth=2, max_ngram=3))
    assert found[:3] == [[X, Q], [Z, W], [X, Y]]  # the 3-gram's occurrences, newest first
    assert found[3:6] == [[X, Q], [Z, W], [X, Y]]  # then the 2-gram's, the same places here
    assert list(continuations(CONTEXT, max_depth=0)) == []


def test_distinct_continuations_make_a_trie():
    tree = lookup_tree(CONTEXT, max_nodes=16, max_branches=4, max_depth=2)
    assert tree.tokens == [X, Q, Z, W, Y]
    assert tree.parents == [ROOT, 0, ROOT, 2, 0]  # "x" once, with q and y as siblings below it
    assert tree.children(0) == [1, 4] and set(tree.drawn) == {DETERMINISTIC} and tree.child_probs is None
    assert sorted(leaf_paths(tree)) == sorted([[X, Q], [Z, W], [X, Y]])


def test_branches_and_nodes_stay_within_their_limits():
    two = lookup_tree(CONTEXT, max_nodes=16, max_branches=2, max_depth=2)
    assert sorted(leaf_paths(two)) == sorted([[X, Q], [Z, W]])
    small = lookup_tree(CONTEXT, max_nodes=3, max_branches=4, max_depth=2)
    assert small.tokens == [X, Q, Z] and small.parents == [ROOT, 0, ROOT]
    assert len(lookup_tree([1, 2, 3, 4], max_nodes=8)) == 0  # nothing repeats
    assert len(lookup_tree([], max_nodes=8)) == 0


@pytest.mark.parametrize("seed", range(30))
def test_rank_zero_starts_with_prompt_lookups_chain_and_every_path_occurred(seed):
    rng = random.Random(seed)
    context = [rng.randrange(5) for _ in range(rng.randint(2, 60))]
    k = rng.randint(1, 8)
    chain = PromptLookup(max_continuation=k, length=DraftLength(k_max=k, adaptive=False)).propose(context, k).tokens
    tree = lookup_tree(context, max_nodes=64, max_branches=4, max_depth=k)
    # the newest continuation can be cut short by the end of the context; an older one may go on
    assert as_chain(tree)[: len(chain)] == chain and (len(as_chain(tree)) == len(chain) or len(chain) < k)
    for path in leaf_paths(tree):  # each followed an earlier occurrence of (at least) the last token
        assert len(path) <= k
        assert any(context[start : start + len(path)] == path and context[start - 1] == context[-1]
                   for start in range(1, len(context)))
    assert sum(1 for n in range(len(tree)) if not tree.children(n)) <= 4


def test_the_tree_accepts_where_the_chain_loses():
    """The target wants the older continuation (z w): the chain drafts x q and keeps nothing."""
    vocab = 12
    tree = lookup_tree(CONTEXT, max_nodes=16, max_depth=2)
    chain = TokenTree.chain(as_chain(tree))

    def logits_for(t: TokenTree) -> torch.Tensor:
        rows = torch.zeros(len(t) + 1, vocab)
        for position in range(len(t) + 1):
            path = [] if position == 0 else [t.tokens[i] for i in t.path(position - 1)]
            rows[position, [Z, W, S][min(len(path), 2)] if path == [Z, W][: len(path)] else 0] = 1.0
        return rows

    greedy = SamplingConfig(temperature=0.0)
    assert verify_tree(chain, logits_for(chain), greedy).accepted == 0
    verdict = verify_tree(tree, logits_for(tree), greedy)
    assert verdict.accepted_tokens == [Z, W] and verdict.next_token == S


def test_the_drafter_cuts_its_trie_to_a_planned_shape():
    drafter = LookupTree(max_depth=2)
    shape = TreeShape((ROOT, ROOT, 0, 0), (0, 1, 0, 1))  # two candidates at the root, two below the first
    tree = drafter.propose_tree(CONTEXT, max_nodes=16, shape=shape)
    assert sorted(tree.tokens) == sorted([X, Z, Q, Y])
    rank_paths = {TreeShape.of(tree).rank_path(i) for i in range(len(tree))}
    assert rank_paths == {shape.rank_path(i) for i in range(len(shape))}
    assert len(drafter.propose_tree(CONTEXT, max_nodes=2, shape=shape)) == 2
    assert drafter.propose_tree(CONTEXT, max_nodes=16).tokens == lookup_tree(CONTEXT, max_nodes=16, max_depth=2).tokens
