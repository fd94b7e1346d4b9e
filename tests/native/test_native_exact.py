"""Bit-exactness: a row's logits and every layer's hidden state are the same whether the row came as a one-token
decode step, as row j of a k-row chain pass, as a node of a tree pass or inside a prefill chunk, with the
context length p fuzzed across the attention blocks' boundaries (32 keys) and k from 1 to 33. This is what
makes greedy speculation return plain greedy's output on the native forward whatever the drafts. Every test
runs for both architectures (qwen2: QKV biases; llama: none, linearly scaled RoPE, Q/K unpermuted at load)."""

import random

import pytest
import torch
from native_models import ARCHS, kernels_or_skip, native_model

from specdec.engine.tree import ROOT
from specdec.native import layers

PREFIXES = (1, 2, 31, 32, 33, 63, 64, 65, 95)
KS = range(1, 34)
LENGTH = max(PREFIXES) + max(KS) + 2


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    kernels_or_skip()
    print(f"native ops: {'compiled' if layers.ops_available() else 'torch reference: ' + layers.ops_unavailable_reason()}")
    return native_model(capacity=256, arch=request.param)


@pytest.fixture(scope="module")
def sequence():
    rng = random.Random(7)
    return [rng.randrange(8, 380) for _ in range(LENGTH)]


@pytest.fixture(scope="module")
def steps(model, sequence):
    """Decode steps from an empty cache, one token each: (logits [V], hidden states per layer [d]) per position."""
    lm = model.new_cached_lm()
    out = []
    for token in sequence:
        hidden = []
        logits = lm.extend([token], hidden_states=hidden)[0]
        out.append((logits, [h[0] for h in hidden]))
    return out


def assert_rows_equal(rows, hidden, steps, first, what):
    for j in range(len(rows)):
        logits, states = steps[first + j]
        assert torch.equal(rows[j], logits), f"{what}: row {j} (position {first + j}) logits differ"
        for layer, (got, expected) in enumerate(zip(hidden, states)):
            assert torch.equal(got[j], expected), f"{what}: row {j} layer {layer} hidden state differs"


def test_prefill_chunks_equal_decode_steps(model, sequence, steps):
    for chunk in (1, 5, 32, 33, 64, LENGTH):
        lm = model.new_cached_lm()
        for start in range(0, LENGTH, chunk):
            hidden = []
            rows = lm.extend(sequence[start : start + chunk], hidden_states=hidden)
            assert_rows_equal(rows, hidden, steps, start, f"chunk {chunk} at {start}")


@pytest.mark.parametrize("p", PREFIXES)
def test_chain_pass_rows_equal_decode_steps(model, sequence, steps, p):
    lm = model.new_cached_lm()
    lm.extend(sequence[:p])
    for k in KS:
        hidden = []
        rows = lm.extend_tree(sequence[p : p + k], [ROOT] + list(range(k - 1)), hidden_states=hidden)
        assert_rows_equal(rows, hidden, steps, p, f"chain p={p} k={k}")
        lm.keep_path([])
        hidden = []
        rows = lm.extend(sequence[p : p + k], hidden_states=hidden)  # committed rows, the way a verify commits
        assert_rows_equal(rows, hidden, steps, p, f"extend p={p} k={k}")
        lm.truncate(p)


def tree_around(chain: list[int], rng: random.Random, extra_nodes: int) -> tuple[list[int], list[int], list[int]]:
    """A random tree (topological order) holding `chain` as one root path among other branches;
    returns tokens, parents and the chain's slots."""
    tokens, parents, chain_slots = [], [], []
    for depth, token in enumerate(chain):
        for _ in range(rng.randint(0, extra_nodes)):  # decoys before the chain's node, attached anywhere
            tokens.append(rng.randrange(8, 380))
            parents.append(rng.choice([ROOT, *range(len(tokens) - 1)]))
        tokens.append(token)
        parents.append(chain_slots[-1] if chain_slots else ROOT)
        chain_slots.append(len(tokens) - 1)
    return tokens, parents, chain_slots


@pytest.mark.parametrize("p", PREFIXES)
def test_tree_pass_rows_equal_decode_steps(model, sequence, steps, p):
    rng = random.Random(p)
    lm = model.new_cached_lm()
    lm.extend(sequence[:p])
    for k in (1, 2, 3, 8, 17, 33):
        tokens, parents, chain_slots = tree_around(sequence[p : p + k], rng, 2 if k < 17 else 1)
        tokens, parents = tokens[:96], parents[:96]  # within the cache's tree room
        chain_slots = [s for s in chain_slots if s < 96]
        hidden = []
        rows = lm.extend_tree(tokens, parents, hidden_states=hidden)
        assert_rows_equal(rows[chain_slots], [h[chain_slots] for h in hidden], steps, p, f"tree p={p} k={k}")
        lm.keep_path(chain_slots)  # the kept path's K/V move down: the next pass sees them as committed
        assert lm.tokens == sequence[: p + len(chain_slots)]
        logits = lm.extend([sequence[p + len(chain_slots)]])[0]
        assert torch.equal(logits, steps[p + len(chain_slots)][0]), f"after keep_path p={p} k={k}"
        lm.truncate(p)


def test_a_tree_fed_level_by_level_equals_one_pass(model, sequence, steps):
    rng = random.Random(3)
    p = 40
    tokens, parents, chain_slots = tree_around(sequence[p : p + 6], rng, 2)
    lm = model.new_cached_lm()
    lm.extend(sequence[:p])
    whole = lm.extend_tree(tokens, parents)
    lm.keep_path([])
    cut = len(tokens) // 2
    parts = torch.cat([lm.extend_tree(tokens[:cut], parents[:cut]), lm.extend_tree(tokens[cut:], parents[cut:])])
    assert torch.equal(whole, parts)
    assert torch.equal(parts[chain_slots[-1]], steps[p + len(chain_slots) - 1][0])
