"""The matmuls' AMX path (specdec/native/csrc/w4a8.cpp, amx_*): on an Intel CPU with AMX, blocks of 12 to 16 rows go
through AMX tiles, and every output has the AVX512-VNNI kernels' bits (the same exact integer dots, their epilogue),
so a row's result does not depend on the path nor on the rows beside it.

test_w4a8_avx2.py's matmul tests compare the AMX path with AVX512-VNNI for 1..40 rows (its `pair` fixture). The
comparisons run where the CPU (and the OS) has AMX and are skipped, saying so, elsewhere; the refusal of the AMX
path on a CPU without it runs everywhere. The path each covers is in its id."""

import os
import subprocess
import sys

import pytest
import torch
from test_w4a8_avx2 import activations, assert_same_bits, extreme_rows, tiny_native, w4_weight, w8_weight

from specdec.models import w4a8


@pytest.fixture(scope="module")
def amx():
    if w4a8.load() is None:
        pytest.skip(f"the matmuls cannot run here: {w4a8.unavailable_reason()}")
    if w4a8.cpu_isa() != "amx":
        pytest.skip(f"this CPU runs the {w4a8.cpu_isa()} path, not AMX: the AMX path is covered on CPUs with AMX")


def on_both(fn):
    """fn() on the AMX path, then on AVX512-VNNI."""
    with w4a8.use_isa("amx"):
        assert w4a8.isa() == "amx"
        a = fn()
    with w4a8.use_isa("avx512"):
        b = fn()
    return a, b


def test_amx_extreme_activations_and_fused_rows_give_the_avx512_bits(amx):
    n, k = 48, 256
    x = extreme_rows(k)
    _, packed8, scale = w8_weight(n, k)
    packed = w4_weight(n, k)
    for name, fn in (("w4a8", lambda: w4a8.matmul(x, packed, n)), ("w8a8", lambda: w4a8.matmul8(x, packed8, scale))):
        a, b = on_both(fn)
        assert_same_bits(a, b, f"amx {name} extremes", ("amx", "avx512"))
    rows = lambda: w4a8.add_rms_norm_int8(None, activations(12, k), torch.ones(k), 1e-6)  # noqa: E731
    a, b = on_both(lambda: w4a8.matmul_rows(rows(), packed, n))
    assert_same_bits(a, b, "amx w4a8 on the fused norm's int8 rows", ("amx", "avx512"))


@pytest.fixture(params=("qwen2", "llama"))
def native(request, amx):
    return tiny_native(request.param)


def test_the_native_model_gives_the_same_logits_with_and_without_amx(native):
    """A 70-token prefill in chunks of 32 (AMX tiles), decode steps (VNNI) and a tree pass of 14 rows (AMX): every
    layer's hidden state and the logits, bit for bit those of the AVX512-VNNI path."""
    import random

    from specdec.engine.tree import ROOT

    rng = random.Random(5)
    prompt = [rng.randrange(8, 380) for _ in range(70)]
    tree_tokens = [rng.randrange(8, 380) for _ in range(14)]
    parents = [ROOT, 0, 1, 0, 3, ROOT, 5, 6, 6, 8, ROOT, 10, 11, 2]

    def run():
        lm = native.new_cached_lm()
        out = []
        for start in range(0, 64, 32):
            hidden = []
            out.append(lm.extend(prompt[start:start + 32], hidden_states=hidden))
            out.extend(hidden)
        for token in prompt[64:]:
            out.append(lm.extend([token]))
        out.append(lm.extend_tree(tree_tokens, parents))
        return [t.clone() for t in out]

    with_amx, without = on_both(run)
    for i, (a, b) in enumerate(zip(with_amx, without)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"output {i} differs between the paths"


def test_specdec_native_isa_avx512_keeps_amx_off(amx):
    code = "from specdec.models import w4a8; print(w4a8.isa(), w4a8.cpu_isa())"
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_NATIVE_ISA"}
    forced = subprocess.run([sys.executable, "-c", code], env={**env, "SPECDEC_NATIVE_ISA": "avx512"},
                            capture_output=True, text=True, timeout=300)
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert forced.stdout.split() == ["avx512", "amx"], forced.stderr
    assert plain.stdout.split() == ["amx", "amx"], plain.stderr


def test_a_cpu_without_amx_refuses_the_amx_path():
    if w4a8.load() is None:
        pytest.skip(f"the matmuls cannot run here: {w4a8.unavailable_reason()}")
    if w4a8.cpu_isa() == "amx":
        pytest.skip("this CPU has AMX: the tests above cover it")
    before = w4a8.isa()
    with pytest.raises(RuntimeError, match="does not support amx"):
        with w4a8.use_isa("amx"):
            pass
    assert w4a8.isa() == before
