"""One forward pass over a token tree gives, at every node, the logits a linear pass over its
path gives (the 4D ancestor mask is honoured by sdpa and eager alike), and committing a path
compacts the KV cache to exactly what a fresh prefill of prefix + path would hold."""

import random

import pytest
import tiny
import torch

from specdec.engine.kv import KVModel
from specdec.engine.tree import ROOT
from specdec.errors import SpecdecError

# fp32, logits of magnitude ~10: a linear pass chunked two ways (all at once, or prefix then
# path) already disagrees by up to ~3e-5, so the tree pass is held to the same scale
ATOL = 1e-4
ATTENTION = ("sdpa", "eager")


@pytest.fixture(scope="module", params=[(kind, attention) for kind in ("target", "draft") for attention in ATTENTION],
                ids=lambda p: "-".join(p))
def model(request):
    kind, attention = request.param
    if kind == "target":
        return tiny.model(seed=1, attn_implementation=attention)
    return tiny.model(seed=2, layers=1, hidden=32, attn_implementation=attention)


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    """n nodes in topological order, bushy or deep at random; duplicate sibling tokens allowed."""
    tokens, parents = [], []
    for i in range(n):
        parents.append(rng.choice([ROOT, i - 1, rng.randint(ROOT, i - 1)]) if i else ROOT)
        tokens.append(rng.randrange(8, 360))
    return tokens, parents


def path_of(parents: list[int], node: int) -> list[int]:
    out = []
    while node != ROOT:
        out.append(node)
        node = parents[node]
    return out[::-1]


def linear(model, tokens: list[int]) -> torch.Tensor:
    """The last token's logits from a fresh, plain causal pass."""
    return KVModel(model).extend(tokens)[-1]


def with_prefix(model, prefix: list[int]) -> KVModel:
    kv = KVModel(model)
    kv.sync(prefix)
    return kv


def extend_in_calls(kv: KVModel, tokens, parents, rng: random.Random) -> torch.Tensor:
    """The tree fed in random consecutive groups, as a level-by-level drafter feeds it."""
    cuts = sorted(rng.sample(range(1, len(tokens)), rng.randint(0, min(3, len(tokens) - 1)))) if len(tokens) > 1 else []
    rows, start = [], 0
    for end in cuts + [len(tokens)]:
        rows.append(kv.extend_tree(tokens[start:end], parents[start:end]))
        start = end
    return torch.cat(rows)


@pytest.mark.parametrize("seed", range(4))
def test_tree_pass_equals_linear_pass_along_every_path(model, seed):
    rng = random.Random(seed)
    prefix = [rng.randrange(8, 360) for _ in range(rng.randint(1, 30))]
    tokens, parents = random_tree(rng, rng.randint(2, 16))
    for incremental in (False, True):
        kv = with_prefix(model, prefix)
        rows = extend_in_calls(kv, tokens, parents, rng) if incremental else kv.extend_tree(tokens, parents)
        assert rows.shape == (len(tokens), model.config.vocab_size)
        assert kv.cache.get_seq_length() == len(prefix) + len(tokens) and kv.tokens == prefix
        for node in range(len(tokens)):
            expected = linear(model, prefix + [tokens[i] for i in path_of(parents, node)])
            torch.testing.assert_close(rows[node], expected, rtol=0, atol=ATOL, msg=f"node {node}")
            assert rows[node].argmax() == expected.argmax()


def test_the_mask_is_what_makes_it_right(model):
    """Negative control: the same tokens through the plain causal pass (siblings seeing each
    other, positions counted linearly) are far off, so the equality above is the mask's doing."""
    prefix, tokens, parents = [11, 12, 13, 14], [20, 21, 22, 23], [ROOT, ROOT, 0, 1]
    rows = with_prefix(model, prefix).extend_tree(tokens, parents)
    causal = with_prefix(model, prefix).extend(tokens)
    assert (rows[1:] - causal[1:]).abs().max() > 0.1
    torch.testing.assert_close(rows[0], causal[0], rtol=0, atol=ATOL)  # the first node's context is the same


def test_a_chain_takes_the_plain_pass_bit_for_bit(model):
    prefix, chain = [30, 31, 32], [40, 41, 42, 43]
    tree_rows = with_prefix(model, prefix).extend_tree(chain, [ROOT, 0, 1, 2])
    assert torch.equal(tree_rows, with_prefix(model, prefix).extend(chain))


@pytest.mark.parametrize("seed", range(3))
def test_keep_path_leaves_the_cache_of_a_fresh_prefill(model, seed):
    rng = random.Random(100 + seed)
    prefix = [rng.randrange(8, 360) for _ in range(rng.randint(1, 20))]
    tokens, parents = random_tree(rng, rng.randint(3, 14))
    after = [rng.randrange(8, 360) for _ in range(3)]
    for node in [ROOT, *rng.sample(range(len(tokens)), 3)]:
        kv = with_prefix(model, prefix)
        extend_in_calls(kv, tokens, parents, rng)
        kept = path_of(parents, node)
        kv.keep_path(kept)
        path_tokens = [tokens[i] for i in kept]
        assert kv.tokens == prefix + path_tokens and kv.tree_tokens == []
        assert kv.cache.get_seq_length() == len(prefix) + len(kept)
        rows = kv.extend(after)
        fresh = KVModel(model).extend(prefix + path_tokens + after)[-len(after):]
        torch.testing.assert_close(rows, fresh, rtol=0, atol=ATOL)
        # and the committed path can grow a new tree, which sees the new prefix
        more = kv.extend_tree([50, 51, 52], [ROOT, ROOT, 0])
        expected = linear(model, prefix + path_tokens + after + [50, 52])
        torch.testing.assert_close(more[2], expected, rtol=0, atol=ATOL)


def test_keep_nothing_restores_the_prefix_exactly(model):
    prefix = [15, 16, 17, 18, 19]
    kv = with_prefix(model, prefix)
    before = [layer.keys.clone() for layer in kv.cache.layers]
    kv.extend_tree([60, 61, 62, 63], [ROOT, ROOT, 1, 0])
    kv.keep_path([])
    assert kv.tokens == prefix and kv.cache.get_seq_length() == len(prefix)
    assert all(torch.equal(layer.keys, b) for layer, b in zip(kv.cache.layers, before))
    assert torch.equal(kv.extend([70])[-1], with_prefix(model, prefix).extend([70])[-1])


def test_truncate_and_sync_drop_the_tree_first(model):
    prefix = [21, 22, 23, 24]
    kv = with_prefix(model, prefix)
    kv.extend_tree([30, 31], [ROOT, ROOT])
    kv.truncate(10)  # past the committed tokens: only the tree goes
    assert kv.tokens == prefix and kv.cache.get_seq_length() == len(prefix)
    kv.extend_tree([30, 31], [ROOT, 0])
    logits, reused, computed = kv.sync(prefix + [40, 41])
    assert (reused, computed) == (len(prefix), 2) and kv.cache.get_seq_length() == len(prefix) + 2
    torch.testing.assert_close(logits, linear(model, prefix + [40, 41]), rtol=0, atol=ATOL)
    kv.extend_tree([30], [ROOT])
    kv.reset()
    assert kv.tokens == [] and kv.tree_tokens == [] and kv.cache is None


def test_bad_trees_get_one_line_errors(model):
    kv = with_prefix(model, [5, 6, 7])
    with pytest.raises(SpecdecError, match="parents must precede"):
        kv.extend_tree([1, 2], [ROOT, 1])
    with pytest.raises(SpecdecError, match="one parent per node"):
        kv.extend_tree([1, 2], [ROOT])
    kv.extend_tree([1, 2, 3], [ROOT, ROOT, 0])
    with pytest.raises(SpecdecError, match="uncommitted tree"):
        kv.extend([4])
    with pytest.raises(SpecdecError, match="does not continue a path"):
        kv.keep_path([1, 2])  # 2's parent is 0, not 1
    with pytest.raises(SpecdecError, match="does not continue a path"):
        kv.keep_path([2])  # not a child of the committed tokens
    kv.keep_path([0, 2])
    assert kv.tokens == [5, 6, 7, 1, 3]


def test_flash_attention_is_refused_for_trees():
    from specdec.engine.drafters.draft_tree import DraftTree

    model = tiny.model(seed=3, layers=1, hidden=32)
    model.config._attn_implementation = "flash_attention_2"  # never run: the check comes first
    kv = KVModel(model)
    with pytest.raises(SpecdecError, match="flash_attention_2"):
        kv.extend_tree([5, 6, 7], [ROOT, ROOT, 0])
    assert kv.cache is None and kv.tree_tokens == []
    with pytest.raises(SpecdecError, match="custom mask"):
        DraftTree(model)
