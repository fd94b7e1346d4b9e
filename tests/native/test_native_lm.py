"""NativeLM keeps KVModel's contract (tests/engine/test_tree_pass.py's expectations), bit for bit where
KVModel holds to a tolerance: keep_path leaves the cache of a fresh prefill, keeping nothing restores the
prefix, truncate and sync drop the tree first, bad trees and a full cache are one-line errors, a cancel lands
between prefill chunks."""

import random

import pytest
import torch
from native_models import kernels_or_skip, native_model

from specdec.engine.cached_lm import PREFILL_CHUNK, CachedLM, Cancelled, as_cached_lm
from specdec.engine.tree import ROOT
from specdec.errors import SpecdecError


@pytest.fixture(scope="module")
def model():
    kernels_or_skip()
    return native_model(capacity=200)


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    tokens, parents = [], []
    for i in range(n):
        parents.append(rng.choice([ROOT, i - 1, rng.randint(ROOT, i - 1)]) if i else ROOT)
        tokens.append(rng.randrange(8, 380))
    return tokens, parents


def path_of(parents: list[int], node: int) -> list[int]:
    out = []
    while node != ROOT:
        out.append(node)
        node = parents[node]
    return out[::-1]


def fresh(model, tokens: list[int]) -> torch.Tensor:
    return model.new_cached_lm().extend(tokens)


def test_each_session_gets_its_own_cache(model):
    a, b = as_cached_lm(model), as_cached_lm(model)
    assert isinstance(a, CachedLM) and a is not b and a.cache is not b.cache
    assert as_cached_lm(a) is a


@pytest.mark.parametrize("seed", range(3))
def test_keep_path_leaves_the_cache_of_a_fresh_prefill(model, seed):
    rng = random.Random(100 + seed)
    prefix = [rng.randrange(8, 380) for _ in range(rng.randint(1, 40))]
    tokens, parents = random_tree(rng, rng.randint(3, 14))
    after = [rng.randrange(8, 380) for _ in range(3)]
    for node in [ROOT, *rng.sample(range(len(tokens)), 3)]:
        lm = model.new_cached_lm()
        lm.sync(prefix)
        rows = lm.extend_tree(tokens, parents)
        kept = path_of(parents, node)
        if kept:
            assert torch.equal(rows[kept[-1]], fresh(model, prefix + [tokens[i] for i in kept])[-1])
        lm.keep_path(kept)
        path_tokens = [tokens[i] for i in kept]
        assert lm.tokens == prefix + path_tokens and lm.tree_tokens == []
        assert torch.equal(lm.extend(after), fresh(model, prefix + path_tokens + after)[-len(after):])
        more = lm.extend_tree([50, 51, 52], [ROOT, ROOT, 0])  # the committed path grows a new tree
        assert torch.equal(more[2], fresh(model, prefix + path_tokens + after + [50, 52])[-1])


def test_keep_nothing_restores_the_prefix_exactly(model):
    prefix = [15, 16, 17, 18, 19]
    lm = model.new_cached_lm()
    lm.sync(prefix)
    before = [k[:, : len(prefix)].clone() for k in lm.cache.k]
    lm.extend_tree([60, 61, 62, 63], [ROOT, ROOT, 1, 0])
    lm.keep_path([])
    assert lm.tokens == prefix
    assert all(torch.equal(k[:, : len(prefix)], b) for k, b in zip(lm.cache.k, before))
    assert torch.equal(lm.extend([70])[-1], fresh(model, prefix + [70])[-1])


def test_truncate_and_sync_drop_the_tree_first(model):
    prefix = [21, 22, 23, 24]
    lm = model.new_cached_lm()
    lm.sync(prefix)
    lm.extend_tree([30, 31], [ROOT, ROOT])
    lm.truncate(10)  # past the committed tokens: only the tree goes
    assert lm.tokens == prefix and lm.tree_tokens == []
    lm.extend_tree([30, 31], [ROOT, 0])
    logits, reused, computed = lm.sync(prefix + [40, 41])
    assert (reused, computed) == (len(prefix), 2) and lm.tokens == prefix + [40, 41]
    assert torch.equal(logits, fresh(model, prefix + [40, 41])[-1])
    lm.truncate(2)
    assert lm.tokens == prefix[:2]
    assert torch.equal(lm.extend([99])[-1], fresh(model, prefix[:2] + [99])[-1])
    lm.extend_tree([30], [ROOT])
    lm.reset()
    assert lm.tokens == [] and lm.tree_tokens == []


def test_sync_reuses_the_shared_prefix_and_recomputes_the_last_token(model):
    lm = model.new_cached_lm()
    context = list(range(10, 150))
    logits, reused, computed = lm.sync(context)
    assert (reused, computed) == (0, len(context)) and torch.equal(logits, fresh(model, context)[-1])
    _, reused, computed = lm.sync(context)
    assert (reused, computed) == (len(context) - 1, 1)
    edited = context[:100] + [7, 8]
    logits, reused, computed = lm.sync(edited)
    assert (reused, computed) == (100, 2) and torch.equal(logits, fresh(model, edited)[-1])


def test_a_cancel_lands_between_layers_of_a_prefill_chunk(model):
    """Issue #50 item 2: a superseded request's prefill stops within one layer of its chunk, not after the chunk;
    the chunk is not committed, the chunks before it are, and the cache then gives exactly a fresh cache's logits."""
    layers = len(model.model.weights.layers)
    context = list(range(10, 10 + 2 * PREFILL_CHUNK + 5))
    lm = model.new_cached_lm()
    calls = []

    def stop_in_second_chunk():  # asked before each chunk and each layer: the second chunk stops in its layers
        calls.append(len(lm.tokens))
        return len(calls) > layers + 3

    with pytest.raises(Cancelled):
        lm.sync(context, stop_in_second_chunk)
    assert len(calls) == layers + 4 and lm.tokens == context[:PREFILL_CHUNK]
    logits, reused, computed = lm.sync(context)
    assert (reused, computed) == (PREFILL_CHUNK, len(context) - PREFILL_CHUNK)
    assert torch.equal(logits, fresh(model, context)[-1])
    with pytest.raises(Cancelled):  # a cancel already set stops the first chunk before its first layer
        model.new_cached_lm().sync(context, lambda: True)


def test_bad_trees_and_a_full_cache_get_one_line_errors(model):
    lm = model.new_cached_lm()
    lm.sync([5, 6, 7])
    with pytest.raises(SpecdecError, match="parents must precede"):
        lm.extend_tree([1, 2], [ROOT, 1])
    with pytest.raises(SpecdecError, match="one parent per node"):
        lm.extend_tree([1, 2], [ROOT])
    lm.extend_tree([1, 2, 3], [ROOT, ROOT, 0])
    with pytest.raises(SpecdecError, match="uncommitted tree"):
        lm.extend([4])
    with pytest.raises(SpecdecError, match="does not continue a path"):
        lm.keep_path([1, 2])
    with pytest.raises(SpecdecError, match="does not continue a path"):
        lm.keep_path([2])
    lm.keep_path([0, 2])
    assert lm.tokens == [5, 6, 7, 1, 3]
    with pytest.raises(SpecdecError, match="cache holds 200"):
        lm.extend(list(range(10, 210)))
    assert lm.tokens == [5, 6, 7, 1, 3]  # nothing was lost
    with pytest.raises(SpecdecError, match="room"):
        lm.extend_tree(list(range(10, 10 + lm.tree_room + 1)), [ROOT] * (lm.tree_room + 1))
    with pytest.raises(SpecdecError, match="vocabulary"):
        lm.extend([100000])


def test_rounding_to_int8_a_slice_of_rows_at_a_time_changes_nothing(monkeypatch):
    """Per-channel int8 is row by row, so converting a matrix in slices (the load's memory bound) is exact."""
    kernels_or_skip()
    from specdec.native import gguf_weights

    tokens = list(range(20, 60))
    whole = native_model().new_cached_lm().extend(tokens)
    monkeypatch.setattr(gguf_weights, "CONVERT_ROWS", 48)  # the 384-row output layer in 8 slices
    assert torch.equal(native_model().new_cached_lm().extend(tokens), whole)
