"""The fused residual add + RMSNorm + activation rounding (w4a8.add_rms_norm_int8, the native model's norms where
every matmul reading them is W4A8/W8A8): the int8 rows it hands the matmuls give the very bits the unfused path
gives (ops.add_rms_norm's fp32 rows, rounded again inside each matmul), op by op and through the whole model, on
every instruction-set path (AVX2's is csrc/w4a8_avx2.cpp's); the model takes it only where it applies.

Every test here runs twice (tests/conftest.py's NATIVE_ISA_SUITES): on the CPU's best path, and with the ops and the
matmuls forced onto AVX2, as an AVX2-only CPU runs them."""

import random

import pytest
import torch
from native_models import ARCHS, kernels_or_skip, native_model

from specdec.models import w4a8
from specdec.native import layers


@pytest.fixture(autouse=True)
def kernels():
    kernels_or_skip()
    if not layers.ops_available():
        pytest.skip(f"the native ops cannot run here: {layers.ops_unavailable_reason()}")


def weights(n: int, k: int, gen: torch.Generator):
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    scale, zero = torch.rand(n, k // 32, generator=gen) * 0.02, torch.randn(n, k // 32, generator=gen) * 0.02
    packed4 = w4a8.pack(codes, scale, zero)
    codes8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    return packed4, w4a8.pack8(codes8), torch.rand(n, generator=gen) * 0.02


@pytest.mark.parametrize("add", [True, False])
def test_int8_rows_give_the_unfused_bits(add):
    from specdec.native import ops

    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    for k in (32, 256, 1536, 8960):
        packed4, packed8, scale8 = weights(32, k, gen)
        for m in (1, 2, 7, 8, 9, 33, rng.randint(10, 64)):
            x = torch.randn(m, k, generator=gen) * rng.choice([0.01, 1.0, 300.0])
            residual = torch.randn(m, k, generator=gen) * 2
            residual[0, 32:64] = 0  # a group of zeros: its scale is 0
            weight = 1 + torch.randn(k, generator=gen) * 0.1
            unfused_residual, fused_residual = residual.clone(), residual.clone()
            h = ops.add_rms_norm(x, unfused_residual, weight, 1e-6) if add else ops.rms_norm(residual, weight, 1e-6)
            rows = w4a8.add_rms_norm_int8(x if add else None, fused_residual, weight, 1e-6)
            assert torch.equal(fused_residual, unfused_residual if add else residual), (m, k)
            codes, scales, sums = w4a8.quantize_activations(h)
            assert torch.equal(rows.codes, codes) and torch.equal(rows.scales, scales), (m, k)
            assert torch.equal(w4a8.matmul_rows(rows, packed4, 32), w4a8.matmul(h, packed4, 32)), (m, k)
            assert torch.equal(w4a8.matmul8_rows(rows, packed8, scale8), w4a8.matmul8(h, packed8, scale8)), (m, k)
            last = rows.last(1)  # the output layer's rows
            assert torch.equal(w4a8.matmul_rows(last, packed4, 32), w4a8.matmul(h[-1:], packed4, 32))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_model_on_int8_norms_computes_the_unfused_bits(arch, monkeypatch):
    fused = native_model(arch=arch, capacity=128)
    monkeypatch.setenv("SPECDEC_FUSED_NORM", "0")
    unfused = native_model(arch=arch, capacity=128)
    assert fused.model.int8_norms and not unfused.model.int8_norms
    tokens = [random.Random(1).randrange(8, 380) for _ in range(70)]
    a, b = fused.new_cached_lm(), unfused.new_cached_lm()
    hidden_a, hidden_b = [], []
    assert torch.equal(a.extend(tokens[:50], hidden_states=hidden_a), b.extend(tokens[:50], hidden_states=hidden_b))
    assert all(torch.equal(x, y) for x, y in zip(hidden_a, hidden_b))
    for token in tokens[50:]:
        assert torch.equal(a.extend([token]), b.extend([token]))
    assert torch.equal(a.extend_tree(tokens[:5], [-1, 0, 1, 0, 3]), b.extend_tree(tokens[:5], [-1, 0, 1, 0, 3]))


def test_int8_norms_only_where_every_reader_takes_int8_rows():
    assert not native_model(dense=True, capacity=64).model.int8_norms  # fp32 reference matmuls read fp32 rows
    dense = layers.Linear("dense", 16, 32, weight=torch.zeros(16, 32))
    with pytest.raises(TypeError, match="reads fp32 rows"):
        dense(w4a8.add_rms_norm_int8(None, torch.ones(1, 32), torch.ones(32), 1e-6))


def test_a_lora_adapter_gets_fp32_rows(monkeypatch):
    """A draft's LoRA side matmul (Linear.lora) reads the norm's fp32 rows: with one set, the norms give fp32 and
    the adapter counts, with the unfused path's bits; without, int8 rows again."""
    fused = native_model(capacity=64)
    monkeypatch.setenv("SPECDEC_FUSED_NORM", "0")
    unfused = native_model(capacity=64)
    tokens = list(range(20, 40))
    plain = fused.new_cached_lm().extend(tokens)
    gen = torch.Generator().manual_seed(3)
    for model in (fused, unfused):
        qkv = model.model.weights.layers[0].qkv.parts[0]
        qkv.lora = (torch.randn(qkv.in_features, 4, generator=gen), torch.randn(4, qkv.out_features, generator=gen))
        gen.manual_seed(3)
    adapted = fused.new_cached_lm().extend(tokens)
    assert torch.equal(adapted, unfused.new_cached_lm().extend(tokens)) and not torch.equal(adapted, plain)
    fused.model.weights.layers[0].qkv.parts[0].lora = None
    assert torch.equal(fused.new_cached_lm().extend(tokens), plain)
    with pytest.raises(TypeError, match="with a LoRA adapter"):
        layer = unfused.model.weights.layers[0].qkv.parts[0]
        layer(w4a8.add_rms_norm_int8(None, torch.ones(1, layer.in_features), torch.ones(layer.in_features), 1e-6))


def extreme_residuals(k: int) -> torch.Tensor:
    """Rows for the norm's sum of squares and the rounding after it: zeros, tiny and huge magnitudes, one value among
    zeros, alternating signs, a row whose normalized values land on .5 steps."""
    rows = [torch.zeros(k), torch.full((k,), 1e-20), torch.full((k,), -3e15), torch.zeros(k),
            torch.tensor([(-1.0) ** i * (i % 7 + 1) for i in range(k)]), (torch.arange(k) % 32 - 15.5).float()]
    rows[3][5] = 2.5
    return torch.stack(rows)


def test_every_path_gives_the_fused_norm_the_same_bits():
    """The fused norm runs on every path the CPU has (the AVX2 one too: an AVX2-only CPU's native model takes it),
    and its residual, codes, scales and sums are the same bits on each."""
    model = native_model(capacity=64)
    assert model.model.int8_norms and layers.int8_norms_now(model.model.norm_readers)
    paths = w4a8.PATHS[: w4a8.PATHS.index(w4a8.cpu_isa()) + 1]
    if len(paths) == 1:
        pytest.skip("this CPU runs the AVX2 path only: nothing to compare it with (the tests above run it)")
    gen = torch.Generator().manual_seed(11)
    k = 1536
    x = torch.cat([torch.randn(9, k, generator=gen) * 3, extreme_residuals(k)])
    residual = torch.cat([torch.randn(9, k, generator=gen), extreme_residuals(k).flip(0)])
    weight = 1 + torch.randn(k, generator=gen) * 0.1
    results = {}
    for path in paths:
        with w4a8.use_isa(path):
            assert w4a8.isa() == path
            for add in (True, False):
                r = residual.clone()
                rows = w4a8.add_rms_norm_int8(x if add else None, r, weight, 1e-6)
                results[path, add] = (r, rows.codes, rows.scales, rows.sums, rows.code_sums)
    def bits(t: torch.Tensor) -> torch.Tensor:
        return t if t.dtype == torch.int8 else t.view(torch.int32)

    for (path, add), got in results.items():
        for name, a, b in zip(("residual", "codes", "scales", "sums", "code sums"), got, results[paths[0], add]):
            assert torch.equal(bits(a), bits(b)), (path, paths[0], add, name)
