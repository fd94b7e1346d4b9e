"""The matmuls' AVX2 path (specdec/native/csrc/w4a8_avx2.cpp): the same packed weights as the AVX512-VNNI kernels and
the same bits for every row, so a row's result does not depend on which CPU ran it; and what that lets run on an
AVX2-only CPU (the int4 target's W4A8, the int8 layers' W8A8, the native forward).

Tests that compare the two paths run where the CPU has both (skipped, saying so, where it lacks AVX512-VNNI);
tests of the AVX2 path alone run on any CPU with AVX2 + FMA. The path each covers is in its id."""

import os
import platform
import subprocess
import sys

import pytest
import torch

from specdec.models import w4a8

GROUP = w4a8.GROUP


@pytest.fixture(scope="module")
def kernel():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"the matmuls are x86-64 kernels ({platform.machine()})")
    module = w4a8.load()
    if module is None and "SPECDEC_W4A8=0" in w4a8.unavailable_reason():
        pytest.skip("SPECDEC_W4A8=0 in the environment")
    if module is None and not w4a8.CPU_FLAGS <= w4a8.cpu_flags():
        pytest.skip(f"the CPU lacks {sorted(w4a8.CPU_FLAGS - w4a8.cpu_flags())}")
    assert module is not None, w4a8.unavailable_reason()  # this CPU can run it: a failed build is a failure
    return module


@pytest.fixture
def both(kernel):
    """(fn) -> (fn() on AVX512-VNNI, fn() on AVX2); skips where the CPU lacks AVX512-VNNI."""
    if w4a8.cpu_isa() not in ("avx512", "amx"):
        pytest.skip("the CPU lacks AVX512-VNNI: nothing to compare the avx2 path with (it runs alone below)")

    def run(fn):
        with w4a8.use_isa("avx512"):
            assert w4a8.isa() == "avx512"
            a = fn()
        with w4a8.use_isa("avx2"):
            assert w4a8.isa() == "avx2"
            b = fn()
        return a, b

    return run


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str, paths: tuple[str, str] = ("avx512", "avx2")) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    same = bits(a) == bits(b)
    if not bool(same.all()):
        row, col = (~same).nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int((~same).sum())} elements differ, first at row {row} column {col}: "
                             f"{paths[0]} {a[row, col].item()!r}, {paths[1]} {b[row, col].item()!r}")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def w4_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = gen(seed)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    scale = torch.rand(n, k // GROUP, generator=g) * 0.01 + 1e-3
    zero = torch.randn(n, k // GROUP, generator=g) * 0.01
    return w4a8.pack(codes, scale, zero)


def w8_weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, packed, scale): every int8 code -128..127 occurs, the extremes included."""
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen(seed))
    codes[0, :256] = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)[: min(256, k)]
    codes[-1, :GROUP] = -128
    return codes, w4a8.pack8(codes), torch.rand(n, generator=gen(seed + 1)) * 0.01 + 1e-4


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    """N(0, 1) rows with outlier channels (x30) and magnitudes that differ between rows, so a sum or a rounding
    taken in another order shows in the last bit."""
    g = gen(seed)
    x = torch.randn(m, k, generator=g) * torch.where(torch.rand(k, generator=g) < 0.03, 30.0, 1.0)
    return x * torch.logspace(-3, 3, m)[:, None]


def extreme_rows(k: int) -> torch.Tensor:
    """Rows that stress the activations' rounding: zeros, all equal (positive, negative), one huge value among tiny
    ones, values on .5 after scaling (round half to even), subnormals, fp32's largest, alternating signs."""
    rows = [torch.zeros(k), torch.full((k,), 0.37), torch.full((k,), -2.5e-3), torch.full((k,), 1e-30)]
    huge = torch.full((k,), 1e-3)
    huge[::GROUP] = 1e30
    rows.append(huge)
    one = torch.zeros(k)
    one[5] = -7.0
    rows.append(one)
    halves = (torch.arange(k) % GROUP - 15.5).float()  # amax 16.5 -> codes (i - 15.5) * 127 / 16.5
    halves[::GROUP] = 127.0  # amax 127: inv 1, every other value lands on .5
    halves[1::GROUP] = 0.5
    halves[2::GROUP] = 1.5
    halves[3::GROUP] = -2.5
    rows.append(halves)
    rows.append(torch.full((k,), 1e-40))  # subnormal
    rows.append(torch.full((k,), torch.finfo(torch.float32).max))
    rows.append(torch.tensor([(-1.0) ** i * (i + 1) for i in range(k)]))
    return torch.stack(rows)


SHAPES = [(16, 32), (48, 96), (256, 1536), (1536, 256)]  # one tile and group; 3 x 3; Qwen's width; a tall one
DTYPES = [torch.float32, torch.bfloat16]


def dtype_id(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# the paths whose bits must agree: AVX2 against AVX512-VNNI, and AMX's tiles (blocks of 12-16 rows) against the
# VNNI kernels (test_w4a8_amx.py has the rest of the AMX path's tests)
PAIRS = [("avx512", "avx2"), ("amx", "avx512")]


@pytest.fixture(params=PAIRS, ids=lambda pair: f"{pair[0]}-vs-{pair[1]}")
def pair(request, kernel):
    """(fn) -> (fn() on the first path, fn() on the second), and the paths; skips where the CPU lacks the first."""
    first, second = request.param
    if first == "amx" and w4a8.cpu_isa() != "amx":
        pytest.skip(f"this CPU runs the {w4a8.cpu_isa()} path, not AMX: the AMX path is covered on CPUs with AMX")
    if first == "avx512" and w4a8.cpu_isa() not in ("avx512", "amx"):
        pytest.skip("the CPU lacks AVX512-VNNI: nothing to compare the avx2 path with (it runs alone below)")

    def run(fn):
        results = []
        for isa in (first, second):
            with w4a8.use_isa(isa):
                assert w4a8.isa() == isa
                results.append(fn())
        return results

    run.paths = request.param
    return run


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_w4a8_paths_agree_bit_for_bit_for_1_to_40_rows(pair, n, k, dtype):
    packed = w4_weight(n, k)
    x = activations(40, k).to(dtype)
    for m in range(1, 41):
        a, b = pair(lambda: w4a8.matmul(x[:m], packed, n))
        assert_same_bits(a, b, f"w4a8 {n}x{k} {dtype_id(dtype)} M={m}", pair.paths)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_w8a8_paths_agree_bit_for_bit_for_1_to_40_rows(pair, n, k, dtype):
    _, packed, scale = w8_weight(n, k)
    x = activations(40, k).to(dtype)
    for m in range(1, 41):
        a, b = pair(lambda: w4a8.matmul8(x[:m], packed, scale))
        assert_same_bits(a, b, f"w8a8 {n}x{k} {dtype_id(dtype)} M={m}", pair.paths)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_extreme_activations_give_the_same_bits_on_both_paths(both, dtype):
    n, k = 48, 256
    x = extreme_rows(k).to(dtype)
    _, packed8, scale = w8_weight(n, k)
    packed = w4_weight(n, k)
    a, b = both(lambda: w4a8.matmul(x, packed, n))
    assert_same_bits(a, b, f"w4a8 extremes {dtype_id(dtype)}")
    assert torch.isfinite(a[:8]).all()  # the finite rows stay finite (the largest float's row may overflow)
    a, b = both(lambda: w4a8.matmul8(x, packed8, scale))
    assert_same_bits(a, b, f"w8a8 extremes {dtype_id(dtype)}")
    assert (a[0] == 0).all()  # a zero row gives zeros


def test_the_activations_rounding_matches_the_reference_on_the_avx2_path(kernel):
    """Round half to even and the group scales as quantize_activations has them: a row whose codes are known
    (amax 127, so inv = 1 and x's halves round to even) gives exactly the product with those codes."""
    n, k = 16, 64
    codes, packed, scale = w8_weight(n, k)
    x = extreme_rows(k)[6:7]  # the .5 row
    q, xs, _ = w4a8.quantize_activations(x)
    assert q[0, 1] == 0 and q[0, 2] == 2 and q[0, 3] == -2  # 0.5 -> 0, 1.5 -> 2, -2.5 -> -2
    expected = w4a8.reference8(x, codes, scale)
    with w4a8.use_isa("avx2"):
        got = w4a8.matmul8(x, packed, scale)
    assert torch.allclose(got.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n,k", [(256, 1536), (1536, 512)])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_avx2_path_matches_the_fp64_reference(kernel, n, k, dtype):
    """On a CPU without AVX512-VNNI this is the matmuls' arithmetic test (tests/models/test_w4a8.py then runs on
    AVX2 too): W4A8 and W8A8 equal the same arithmetic in fp64 up to fp32 accumulation or the bf16 output."""
    from specdec.models.gguf_codes import int8_per_channel

    g = gen(3)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    sc, zr = torch.rand(n, k // GROUP, generator=g) * 0.01 + 1e-3, torch.randn(n, k // GROUP, generator=g) * 0.01
    int8 = int8_per_channel(torch.randn(n, k, generator=g))
    x = activations(16, k).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 5e-3
    with w4a8.use_isa("avx2"):
        y = w4a8.matmul(x, w4a8.pack(codes, sc, zr), n)
        y8 = w4a8.matmul8(x, w4a8.pack8(int8.codes), int8.scale.float())
    for got, ref in ((y, w4a8.reference(x, codes, sc, zr)), (y8, w4a8.reference8(x, int8.codes, int8.scale.float()))):
        assert got.dtype == dtype
        assert ((got.double() - ref).norm() / ref.norm()).item() < tolerance


def test_int8_and_int4_layers_give_the_same_bits_on_both_paths(both):
    """The layers that run the kernels (the int8 draft's Int8Linear on fbgemm's codes, the int4 target's
    Int4Linear and Int8ChannelLinear): a row's output is the same on an AVX2-only CPU."""
    from specdec.models.gguf_codes import int8_per_channel, q4k_codes, quantize_q4k
    from specdec.models.int4 import Int4Linear, Int8ChannelLinear
    from specdec.models.int8 import Int8Linear

    torch.manual_seed(0)
    k = 256
    draft = Int8Linear(torch.nn.Linear(k, 96))
    assert draft._w8a8 is not None
    int4 = Int4Linear(q4k_codes(quantize_q4k(torch.randn(64, k) * 0.05), k), dense_rows=0, dtype=torch.bfloat16,
                      kernel="w4a8")
    int8 = Int8ChannelLinear(int8_per_channel(torch.randn(64, k)), torch.randn(64), dtype=torch.bfloat16,
                             kernel="w8a8")
    x = activations(9, k)
    with torch.inference_mode():
        for name, layer, rows in (("Int8Linear", draft, x), ("Int4Linear", int4, x.bfloat16()),
                                  ("Int8ChannelLinear", int8, x.bfloat16())):
            a, b = both(lambda: layer(rows))
            assert_same_bits(a, b, name)


def test_use_isa_refuses_what_it_cannot_run(kernel):
    before = w4a8.isa()  # the CPU's best, or what SPECDEC_NATIVE_ISA chose
    with pytest.raises(RuntimeError, match="expected 'avx2', 'avx512' or 'amx'"):
        with w4a8.use_isa("sse2"):
            pass
    if w4a8.cpu_isa() == "avx2":
        with pytest.raises(RuntimeError, match="does not support avx512"):
            with w4a8.use_isa("avx512"):
                pass
    with w4a8.use_isa("avx2"):
        assert w4a8.isa() == "avx2"
    assert w4a8.isa() == before


def test_specdec_native_isa_avx2_forces_both_the_ops_and_the_matmuls(kernel):
    """The one override: a process started with SPECDEC_NATIVE_ISA=avx2 runs the native ops and the matmuls on
    AVX2; without it, each on the best this CPU has."""
    from specdec.native import ops

    code = ("from specdec.models import w4a8; from specdec.native import ops; "
            "print(w4a8.isa(), w4a8.cpu_isa(), ops.isa() if ops.available() else '-')")
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_NATIVE_ISA"}
    forced = subprocess.run([sys.executable, "-c", code], env={**env, "SPECDEC_NATIVE_ISA": "avx2"},
                            capture_output=True, text=True, timeout=300)
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert forced.returncode == 0 and plain.returncode == 0, forced.stderr + plain.stderr
    ops_isa = ops.cpu_isa() if ops.available() else "-"
    assert forced.stdout.split() == ["avx2", w4a8.cpu_isa(), "avx2" if ops_isa != "-" else "-"]
    assert plain.stdout.split() == [w4a8.cpu_isa(), w4a8.cpu_isa(), ops_isa]


def test_an_avx2_only_cpu_passes_the_gates(monkeypatch):
    """/proc/cpuinfo with AVX2 + FMA and no AVX512 is enough for the kernels (and so for the native forward);
    without AVX2 the reason names it."""
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("SPECDEC_W4A8", raising=False)
    monkeypatch.setattr(w4a8, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma", "f16c"})
    assert w4a8._why_not() == ""
    monkeypatch.setattr(w4a8, "cpu_flags", lambda: {"sse4_2", "avx", "fma"})
    assert "AVX2" in w4a8._why_not()


def test_only_the_avx512_kernels_hold_avx512_instructions(kernel):
    """The AVX2 path and the dispatch must run on a CPU without AVX512 (none here to run them on): in the built
    library, only the AVX512 kernels (quantize_row<T>, tile_kernel<MB>, tile_kernel8<MB>, the fused norm's
    rms_norm_row and add_row, the AMX path's amx_*, global namespace) use zmm or mask registers or EVEX encodings;
    every w4a8_avx2:: function (the fused norm's rms_norm_row and add_row among them) has AVX2 instructions and none
    of those."""
    import re

    from disassembly import instructions

    offenders, avx512, avx2_ymm = set(), set(), set()
    allowed = re.compile(r"^(void |float )?(quantize_row|tile_kernel8?|group_dot|bf16x16_to_ps|rms_norm_row|add_row"
                         r"|amx_tile_kernel8?|amx_group_dots|amx_groups|amx_config|amx_release)[<(]")
    for function, evex_or_zmm, operands in instructions(kernel.__file__):
        if evex_or_zmm:
            (avx512 if allowed.match(function) else offenders).add(function)
        elif "w4a8_avx2::" in function and "%ymm" in operands:
            avx2_ymm.add(function)
    assert avx512, "the avx512 kernels were not found in the library"
    for name in ("quantize_row", "w4a8_tile", "w8a8_tile", "rms_norm_row", "add_row"):
        assert any(f"w4a8_avx2::{name}" in f for f in avx2_ymm), (name, sorted(avx2_ymm))
    print(f"avx512 functions: {sorted(avx512)}; avx2 functions: {sorted(avx2_ymm)}")
    assert not offenders, sorted(offenders)[:5]


# ---- the whole native forward ----------------------------------------------------------------------------------

def tiny_native(arch: str):
    """A tiny random GGUF of `arch` on the native forward; skips where its kernels or ops cannot run."""
    from native_models import kernels_or_skip, native_model

    from specdec.native import ops

    kernels_or_skip()
    if not ops.available():
        pytest.skip(f"the native ops cannot run here: {ops.unavailable_reason()}")
    return native_model(capacity=256, arch=arch)


@pytest.fixture(params=("qwen2", "llama"))
def native(request, both):
    return tiny_native(request.param)


def test_the_native_model_gives_the_same_logits_on_avx2_and_avx512(native):
    """A tiny random GGUF on the native forward: a 70-token prefill in chunks, decode steps and a tree pass, every
    layer's hidden state and the logits, bit for bit the same with the ops and the matmuls on AVX2 (as an
    AVX2-only CPU runs them) and on AVX512."""
    import random

    from specdec.engine.tree import ROOT
    from specdec.native import ops

    rng = random.Random(5)
    prompt = [rng.randrange(8, 380) for _ in range(70)]
    tree_tokens, parents = [rng.randrange(8, 380) for _ in range(6)], [ROOT, 0, 1, 0, 3, ROOT]

    def run(isa: str):
        with ops.use_isa(isa), w4a8.use_isa(isa):
            assert (ops.isa(), w4a8.isa()) == (isa, isa)
            lm = native.new_cached_lm()
            out = []
            for start in range(0, 64, 32):
                out.append(lm.extend(prompt[start:start + 32]))
            for token in prompt[64:]:
                hidden = []
                out.append(lm.extend([token], hidden_states=hidden))
                out.extend(hidden)
            out.append(lm.extend_tree(tree_tokens, parents))
            return [t.clone() for t in out]

    avx512, avx2 = run("avx512"), run("avx2")
    assert len(avx512) == len(avx2)
    for i, (a, b) in enumerate(zip(avx512, avx2)):
        assert a.dtype == b.dtype and torch.equal(bits(a), bits(b)), f"output {i} differs between the paths"


def test_the_build_covers_the_avx2_source(tmp_path, monkeypatch):
    """w4a8_avx2.cpp is compiled with w4a8.cpp (before it, one translation unit) and its text is in the build's
    hash: an edit rebuilds instead of loading a stale library."""
    sources = w4a8._extension()["sources"]
    assert sources == [w4a8.AVX2_SOURCE.read_text(), w4a8.SOURCE.read_text()]
    assert "namespace w4a8_avx2" in sources[0] and "w4a8_avx2::w4a8_tile" in sources[1]
    before = w4a8.build_dir()
    edited = tmp_path / "w4a8_avx2.cpp"
    edited.write_text(sources[0] + "\n// an edit\n")
    monkeypatch.setattr(w4a8, "AVX2_SOURCE", edited)
    assert w4a8.build_dir() != before


def test_the_native_bench_compares_the_paths_in_one_process(native):
    """`python -m specdec.native.bench --isa avx512,avx2`: both paths timed in turns, one line each, and the
    process's paths as they were afterwards."""
    from specdec.native import ops
    from specdec.native.bench import compare_isas

    before = (ops.isa(), w4a8.isa())
    out = compare_isas(native.new_cached_lm(), list(range(8, 48)), ["avx512", "avx2"], steps=2, verify=3)
    lines = out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["avx512", "avx2"], out
    assert all("plain step at 40 context" in line and "verify pass of 3 rows" in line and "(2 turns)" in line
               for line in lines), out
    assert (ops.isa(), w4a8.isa()) == before
