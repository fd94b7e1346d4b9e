"""The W4A8 int4 kernel: its arithmetic against a pure-torch reference, rows that do not depend on
their neighbours (what lossless speculation needs), the fallback to ATen's kernel, and greedy
speculative output equal to plain greedy over an int4 target that runs it.

The kernel is compiled once per machine (specdec.models.w4a8.build_dir(), by specdec.native.build); the
`kernel` fixture loads it once per test session and skips where the CPU cannot run it."""

import platform

import pytest
import torch

from specdec.engine.session import GenerationConfig, greedy_reference
from specdec.engine.strategies import make_session
from specdec.errors import SpecdecError
from specdec.models import w4a8
from specdec.models.gguf_codes import int8_per_channel, q4k_codes, quantize_q4k
from specdec.models.int4 import (
    Int4Linear,
    Int8ChannelLinear,
    TargetQuantConfig,
    quantize_target,
    resolve_kernel,
)

HIDDEN = 256  # the smallest width Q4_K's 256-weight super-blocks fit
PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n  ",
           "import os\nimport sys\n\ndef main():\n    pass\n\nfunction add(a, b) {\n  return"]


@pytest.fixture(scope="session")
def kernel():
    """The compiled module, built (or found built) once per session; a skip where the CPU cannot run it."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not w4a8.CPU_FLAGS <= w4a8.cpu_flags():
        pytest.skip(f"the W4A8 kernel needs an x86-64 CPU with AVX2 + FMA ({platform.machine()}, "
                    f"missing {sorted(w4a8.CPU_FLAGS - w4a8.cpu_flags())})")
    module = w4a8.load()
    if module is None and "SPECDEC_W4A8=0" in w4a8.unavailable_reason():
        pytest.skip("SPECDEC_W4A8=0 in the environment")
    assert module is not None, w4a8.unavailable_reason()  # this CPU can run it: a failed build is a failure
    return module


def random_weight(n: int, k: int, seed: int = 0):
    """codes [n, k] 0..15, scale > 0 and zero [n, k / 32], as Q4_K groups hold them."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    scale = torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3
    zero = torch.randn(n, k // 32, generator=g) * 0.01
    return codes, scale, zero


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    """N(0, 1) rows with a few outlier channels (x30), as a transformer's hidden states have, and one all-zero group."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.where(torch.rand(k, generator=g) < 0.02, 30.0, 1.0)
    x[min(3, m - 1), :32] = 0
    return x


@pytest.mark.parametrize("n,k", [(256, 1536), (1536, 512), (32, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_its_reference(kernel, n, k, dtype):
    """The packing and the kernel's arithmetic against the same arithmetic in fp64: equal up to fp32
    accumulation (fp32 out) or the bf16 rounding of the result (bf16 out)."""
    codes, scale, zero = random_weight(n, k)
    x = activations(16, k).to(dtype)
    y = w4a8.matmul(x, w4a8.pack(codes, scale, zero), n)
    assert y.dtype == dtype and y.shape == (16, n)
    ref = w4a8.reference(x, codes, scale, zero)
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < (1e-5 if dtype == torch.float32 else 5e-3), rel


def test_reference_is_the_int4_product_up_to_activation_rounding():
    """Rounding activations to int8 per group of 32 costs ~1% against the exact int4 product, not more."""
    n, k = 128, 512
    codes, scale, zero = random_weight(n, k)
    x = activations(8, k)
    sc, zr = scale.bfloat16().double(), zero.bfloat16().double()
    weight = (codes.double().reshape(n, -1, 32) * sc[..., None] + (zr - 8 * sc)[..., None]).reshape(n, k)
    exact = x.double() @ weight.T
    rel = ((w4a8.reference(x, codes, scale, zero) - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 3e-2, rel  # above 1e-4: the rounding is there (the reference is not the exact product)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_the_call(kernel, dtype):
    """Row i of an M-row call is bit-identical to row i alone and in any sub-slice, M = 1..33 (the kernel
    takes 8 rows per pass over a tile, so 33 rows cross every chunk boundary)."""
    n, k = 256, 512
    layer = Int4Linear(q4k_codes(quantize_q4k(torch.randn(n, k) * 0.05), k), dense_rows=0, dtype=dtype,
                       kernel="w4a8")
    assert_rows_independent(layer, activations(33, k).to(dtype))


def assert_rows_independent(layer, x: torch.Tensor) -> None:
    """Row i of every call is bit-identical: the whole batch, every prefix, each row alone, and sub-slices."""
    with torch.inference_mode():
        full = layer(x)
        for rows in range(1, len(x) + 1):
            assert torch.equal(layer(x[:rows]), full[:rows]), rows
        for i in range(len(x)):
            assert torch.equal(layer(x[i:i + 1])[0], full[i]), i
        for start, stop in ((5, 14), (8, 17), (30, 33), (1, 10)):
            assert torch.equal(layer(x[start:stop]), full[start:stop]), (start, stop)


def test_int4_linear_keeps_only_the_w4a8_weight(kernel):
    """One packed buffer (codes, scales and zeros inside: 0.625 bytes a weight), no ATen copy; and the
    layer computes its dequantized weight's product, bias included."""
    torch.manual_seed(0)
    n, k = 64, 256
    codes = q4k_codes(quantize_q4k(torch.randn(n, k) * 0.1), k)
    bias = torch.randn(n)
    layer = Int4Linear(codes, bias, dense_rows=0, kernel="w4a8")
    assert layer.kernel == "w4a8" and layer.scales_and_zeros is None
    assert layer.packed.dtype == torch.uint8 and layer.packed.numel() == n * k * 10 // 16
    assert torch.equal(layer.packed, w4a8.pack(codes.codes, codes.scale, codes.zero))  # a pure function of the codes
    x = torch.randn(5, k).bfloat16()
    expected = x.float() @ codes.dequantize(torch.bfloat16).float().t() + bias.bfloat16().float()
    assert (layer(x).float() - expected).abs().max() < 0.05 * expected.abs().max()


def test_pack_refuses_shapes_the_kernel_cannot_tile():
    codes, scale, zero = random_weight(24, 64)
    with pytest.raises(ValueError, match="out % 16"):
        w4a8.pack(codes, scale, zero)


@pytest.fixture
def fresh_load(monkeypatch):
    """load() decides again in this test (its answer is kept per process); the real answer comes back after."""
    monkeypatch.setattr(w4a8, "_state", {})
    return monkeypatch


@pytest.mark.parametrize("cause,reason", [("env", "SPECDEC_W4A8=0"), ("cpu", "lacks AVX2"),
                                          ("arm", "not an x86-64 CPU"), ("build", "its build failed"),
                                          ("slow build", "did not finish within")])
def test_fallback_to_aten_when_the_kernel_cannot_run(fresh_load, cause, reason, tmp_path):
    import sys

    from specdec.native import build

    monkeypatch = fresh_load
    monkeypatch.delenv("SPECDEC_W4A8", raising=False)
    if cause == "env":
        monkeypatch.setenv("SPECDEC_W4A8", "0")
    elif cause == "cpu":
        monkeypatch.setattr(platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(w4a8, "cpu_flags", lambda: {"sse4_2", "avx", "f16c"})  # no AVX2 (an AVX2 CPU runs it)
    elif cause == "arm":
        monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    else:  # the build itself (specdec.native.build), in a cache of its own where nothing is built yet
        monkeypatch.setattr(w4a8, "_why_not", lambda: "")
        monkeypatch.setattr(build, "why_not_buildable", lambda: "")
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
        if cause == "build":
            failing = f"print({build.ERROR_PREFIX + 'Error building extension'!r}); raise SystemExit(1)"
            monkeypatch.setattr(build, "_build_command", lambda spec: [sys.executable, "-c", failing])
        else:  # issue #40.8: a compile that never ends falls back at the bound (a tiny one here)
            monkeypatch.setattr(build, "_build_command", lambda spec: ["sh", "-c", "sleep 600 & wait"])
            monkeypatch.setenv("SPECDEC_BUILD_TIMEOUT_S", "0.5")
    assert w4a8.load() is None and reason in w4a8.unavailable_reason()
    assert resolve_kernel("auto") == "aten" and resolve_kernel("aten") == "aten"
    with pytest.raises(SpecdecError, match=f"w4a8 cannot run here.*{reason}"):
        resolve_kernel("w4a8")
    with pytest.raises(RuntimeError, match="unavailable"):
        w4a8.matmul(torch.zeros(1, 32), torch.zeros(320, dtype=torch.uint8), 16)
    if cause != "build":
        return
    import tiny  # and a whole target: every int4 layer on ATen's kernel

    model = tiny.model(seed=1, hidden=HIDDEN)
    assert quantize_target(model, TargetQuantConfig("int4", kernel="auto"))["int4"] == 14
    assert model.model.layers[0].mlp.up_proj.kernel == "aten"


def test_unknown_kernel_is_refused():
    import tiny

    with pytest.raises(ValueError, match="avx2"):
        resolve_kernel("avx2")
    with pytest.raises(ValueError, match="avx2"):  # in every mode, before any layer is swapped
        quantize_target(tiny.model(hidden=HIDDEN), TargetQuantConfig("int8", kernel="avx2"))


@pytest.fixture(scope="module")
def w4a8_target(kernel, tmp_path_factory):
    import tiny
    from gguf_files import write_tiny_gguf

    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=384)  # 384 output rows: a lm_head W8A8 tiles
    gguf = tmp_path_factory.mktemp("w4a8") / "tiny.gguf"
    write_tiny_gguf(model, gguf)  # its lm_head is Q8_0, as a real GGUF keeps some tensors: an int8 layer
    # DENSE_ROWS keeps verifies on the kernels
    assert quantize_target(model, TargetQuantConfig("int4", kernel="w4a8"), gguf) == {"int4": 14, "int8": 1}
    assert {m.kernel for m in model.modules() if isinstance(m, Int4Linear)} == {"w4a8"}
    assert model.lm_head.kernel == "w8a8"  # the int8 layer beside W4A8 ones runs W8A8
    return model


@pytest.mark.parametrize("strategy", ["draft", "lookup"])
def test_speculative_greedy_equals_plain_over_a_w4a8_target(w4a8_target, tok, unrelated_draft, strategy):
    """Verify passes of up to 9 rows through the kernel give the tokens 1-row decode steps give."""
    draft = w4a8_target if strategy == "draft" else unrelated_draft  # a self-draft verifies 9 rows at once
    plain = make_session(w4a8_target, tok, "plain")
    spec = make_session(w4a8_target, tok, strategy, draft, max_draft=8)
    for text in PROMPTS:
        prompt = tok.encode(text)
        config = GenerationConfig(max_new_tokens=24, max_draft=8)
        want = plain.generate(prompt, config)
        got = spec.generate(prompt, config)
        assert got.tokens == want.tokens, (strategy, text)
        if strategy == "draft":  # once is enough: plain decoding is not what this file tests
            assert want.tokens == greedy_reference(w4a8_target, prompt, 24, {tok.eos_token_id})
            assert got.stats.accepted == got.stats.drafted > 0


def test_load_pair_and_the_cli_flag_choose_the_kernel(kernel, tmp_path):
    import tiny

    from specdec.cli import build_parser
    from specdec.models.int4 import int4_kernel_in_use
    from specdec.models.loading import load_pair

    path = tiny.save(tmp_path, seed=1, hidden=HIDDEN)
    for choice, expected in (("aten", "aten"), ("w4a8", "w4a8"), ("auto", "w4a8")):
        pair = load_pair(str(path), None, dtype="bf16", target_quant="int4", int4_kernel=choice)
        assert int4_kernel_in_use(pair.target.model) == expected
    assert int4_kernel_in_use(load_pair(str(path), None, target_quant="int8").target.model) == ""
    with pytest.raises(SpecdecError, match="avx2"):
        load_pair(str(path), None, target_quant="int4", int4_kernel="avx2")
    parser = build_parser()
    for command in (["complete", "f.py", "--line", "1", "--col", "1"], ["bench"]):
        assert parser.parse_args(command).int4_kernel == "auto"
        assert parser.parse_args([*command, "--int4-kernel", "aten"]).int4_kernel == "aten"
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--int4-kernel", "avx2"])


def random_int8(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return int8_per_channel(torch.randn(n, k, generator=g) * (torch.rand(n, 1, generator=g) + 0.1))


@pytest.mark.parametrize("n,k", [(256, 1536), (1536, 512), (32, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_matches_its_reference(kernel, n, k, dtype):
    """int8 weights (offset to unsigned in the packing, the offset taken out again) times int8 activations,
    against the same arithmetic in fp64; and within activation rounding of the exact int8 product."""
    codes = random_int8(n, k)
    x = activations(16, k).to(dtype)
    y = w4a8.matmul8(x, w4a8.pack8(codes.codes), codes.scale.float())
    assert y.dtype == dtype and y.shape == (16, n)
    ref = w4a8.reference8(x, codes.codes, codes.scale.float())
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < (1e-5 if dtype == torch.float32 else 5e-3), rel
    exact = x.double() @ (codes.codes.double() * codes.scale.double()[:, None]).T
    assert 1e-4 < ((ref - exact).norm() / exact.norm()).item() < 3e-2  # the rounding is there, and small


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_rows_do_not_depend_on_the_call(kernel, dtype):
    n, k = 256, 512
    layer = Int8ChannelLinear(random_int8(n, k), torch.randn(n), dtype=dtype, kernel="w8a8")
    assert layer.kernel == "w8a8" and layer.packed.numel() == n * k and not hasattr(layer, "codes")
    x = activations(33, k).to(dtype)
    assert_rows_independent(layer, x)
    aten = Int8ChannelLinear(random_int8(n, k), torch.randn(n), dtype=dtype, kernel="aten")
    rel = ((layer(x).double() - aten(x).double()).norm() / aten(x).double().norm()).item()
    assert rel < 3e-2, rel  # the same layer on ATen's kernel (float activations): activation rounding apart


def test_int8_layers_follow_the_int4_kernel_and_fall_back_where_w8a8_cannot_tile(kernel, monkeypatch, tmp_path):
    import tiny
    from gguf_files import write_tiny_gguf

    from specdec.models.int4 import int8_kernel_fitting, int8_kernel_for

    assert (int8_kernel_for("w4a8"), int8_kernel_for("aten")) == ("w8a8", "aten")
    assert int8_kernel_fitting("w8a8", 372, 256) == "aten" and int8_kernel_fitting("w8a8", 384, 256) == "w8a8"
    model = tiny.model(seed=1, hidden=HIDDEN)  # the tokenizer's 372 rows: no 16-row tiling
    quantize_target(model, TargetQuantConfig("int4", kernel="w4a8"))
    assert model.lm_head.kernel == "aten"
    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=384)
    quantize_target(model, TargetQuantConfig("int8"))  # --target-quant int8 stays on ATen's kernel
    assert model.lm_head.kernel == "aten"
    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=384)
    write_tiny_gguf(model, tmp_path / "tiny.gguf")  # lm_head Q8_0: an int8 layer that W8A8 tiles
    quantize_target(model, TargetQuantConfig("int4", kernel="w4a8"), tmp_path / "tiny.gguf")
    assert model.lm_head.kernel == "w8a8"
    monkeypatch.setenv("SPECDEC_W8A8", "0")  # the A/B switch: W4A8 int4 layers, ATen int8 ones
    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=384)
    quantize_target(model, TargetQuantConfig("int4", kernel="w4a8"), tmp_path / "tiny.gguf")
    assert model.lm_head.kernel == "aten" and model.model.layers[0].mlp.up_proj.kernel == "w4a8"


def test_pack8_refuses_shapes_the_kernel_cannot_tile():
    with pytest.raises(ValueError, match="out % 16"):
        w4a8.pack8(random_int8(24, 64).codes)


def test_the_int8_draft_runs_w8a8_on_fbgemms_own_codes(kernel, monkeypatch):
    """The draft's Int8Linear keeps fbgemm's per-channel codes and scales, read by W8A8: each row on its own
    (no magnitude groups), as close to the float layer as fbgemm, and with SPECDEC_W8A8=0 fbgemm again."""
    from specdec.models.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96)
    layer = Int8Linear(linear)
    assert layer._w8a8 is not None
    x = activations(9, 256)
    with torch.inference_mode():
        want, got, fbgemm = linear(x), layer(x), layer._inner(x)
        assert torch.equal(layer(x[4:5]), got[4:5])  # a row alone is the row among others
    rel = lambda y: ((y - want).norm() / want.norm()).item()
    assert rel(got) < 2e-2 and rel(got) < 2 * rel(fbgemm), (rel(got), rel(fbgemm))
    monkeypatch.setenv("SPECDEC_W8A8", "0")
    assert Int8Linear(linear)._w8a8 is None
    assert Int8Linear(torch.nn.Linear(256, 90))._w8a8 is None  # 90 rows: no 16-row tiles
