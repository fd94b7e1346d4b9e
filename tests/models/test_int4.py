"""The int4/int8 target: exact GGUF codes, kernels that match their dequantized weights, and
greedy speculative output that equals plain greedy over the same quantized target."""

import pytest
import torch
from gguf_files import write_tiny_gguf

from specdec.engine.session import GenerationConfig, Session, greedy_reference
from specdec.engine.strategies import make_session
from specdec.models.gguf_codes import (
    GROUP,
    int8_per_channel,
    q4k_codes,
    quantize_q4k,
    read_qwen2_linears,
)
from specdec.models.int4 import (
    Int4Linear,
    Int8ChannelLinear,
    TargetQuantConfig,
    quantize_target,
)

HIDDEN = 256  # the smallest width Q4_K's 256-weight super-blocks fit
PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n  ",
           "import os\nimport sys\n\ndef main():\n    pass\n\nfunction add(a, b) {\n  return"]  # > DENSE_ROWS


def test_q4k_codes_reproduce_gguf_dequantization_exactly():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    torch.manual_seed(0)
    weight = torch.randn(48, 512) * torch.rand(48, 1)
    blocks = quantize_q4k(weight)
    assert blocks.shape == (48, 512 // 256 * 144)
    reference = torch.from_numpy(dequantize(blocks, GGMLQuantizationType.Q4_K)).reshape(48, 512)
    codes = q4k_codes(blocks, 512)
    assert torch.equal(codes.dequantize(), reference)  # same code, scale d*sc, zero 8*d*sc - dmin*m
    assert int(codes.codes.max()) <= 15
    assert (reference - weight).abs().max() < 0.1 * weight.abs().max()  # and it is a quantization of weight


def test_int4_linear_matches_its_dequantized_weight_on_both_routes():
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 256) * 0.1, torch.randn(64)
    codes = q4k_codes(quantize_q4k(weight), 256)
    layer = Int4Linear(codes, bias, dense_rows=4)
    w = codes.dequantize(torch.bfloat16)  # the weight as the kernel sees it (bf16 scale/zero)
    for rows in (1, 3, 9):  # int4 kernel, int4 kernel, dense copy
        x = torch.randn(rows, 256).bfloat16()
        expected = x.float() @ w.t() + bias.bfloat16().float()
        assert (layer(x).float() - expected).abs().max() < 0.02 * expected.abs().max()


def test_int8_channel_linear_matches_its_dequantized_weight():
    torch.manual_seed(0)
    weight = torch.randn(48, 96)
    codes = int8_per_channel(weight)
    assert (codes.dequantize() - weight).abs().max() <= codes.scale.max() / 2 + 1e-6
    layer = Int8ChannelLinear(codes)
    x = torch.randn(5, 96).bfloat16()
    expected = x.float() @ (codes.codes.float() * codes.scale.bfloat16().float()[:, None]).t()
    assert (layer(x).float() - expected).abs().max() < 0.02 * expected.abs().max()


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_kernels_are_row_independent(kind):
    """A row's result does not depend on how many rows share the call: what makes greedy
    speculative decoding (k + 1 rows per verify) exactly equal to plain (1 row per step)."""
    torch.manual_seed(0)
    weight = torch.randn(1024, 512) * 0.05
    if kind == "int4":
        layer = Int4Linear(q4k_codes(quantize_q4k(weight), 512), dense_rows=0)
    else:
        layer = Int8ChannelLinear(int8_per_channel(weight))
    x = torch.randn(64, 512).bfloat16()
    full = layer(x)
    for rows in range(1, 65):
        assert torch.equal(layer(x[:rows]), full[:rows]), rows
    for i in range(64):
        assert torch.equal(layer(x[i:i + 1])[0], full[i]), i


@pytest.fixture(scope="module")
def int4_target(tmp_path_factory):
    import tiny

    model = tiny.model(seed=1, hidden=HIDDEN)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(model, path)
    tensors = read_qwen2_linears(path)
    assert tensors["lm_head"].qtype == "Q8_0" and tensors["model.layers.1.mlp.down_proj"].qtype == "Q4_K"
    k_proj = model.model.layers[0].self_attn.k_proj
    assert tensors["model.layers.0.self_attn.k_proj"].shape == tuple(k_proj.weight.shape)
    # DENSE_ROWS: verifies of <= 9 rows on int4; ATen's kernel here (tests/models/test_w4a8.py: the other one)
    counts = quantize_target(model, TargetQuantConfig("int4", kernel="aten"), path)
    assert counts == {"int4": 14, "int8": 1}
    return model


@pytest.fixture(scope="module")
def int8_target():
    import tiny

    model = tiny.model(seed=1, hidden=HIDDEN)
    assert quantize_target(model, TargetQuantConfig("int8")) == {"int8": 15}
    return model


def test_int4_target_keeps_the_gguf_codes(int4_target, tmp_path):
    layer = int4_target.model.layers[0].mlp.up_proj
    assert isinstance(layer, Int4Linear) and isinstance(int4_target.lm_head, Int8ChannelLinear)
    assert layer.kernel == "aten"
    assert layer.packed.dtype == torch.uint8 and layer.packed.numel() == layer.out_features * layer.in_features // 2
    assert layer.scales_and_zeros.shape == (layer.in_features // GROUP, layer.out_features, 2)


@pytest.mark.parametrize("which", ["int4", "int8"])
@pytest.mark.parametrize("strategy", ["draft", "lookup", "auto"])
def test_speculative_greedy_equals_plain_over_the_quantized_target(request, which, strategy, tok, unrelated_draft):
    target = request.getfixturevalue(f"{which}_target")
    draft = target if strategy == "draft" else unrelated_draft  # draft = the target itself: long verifies
    plain, spec = make_session(target, tok, "plain"), make_session(target, tok, strategy, draft, max_draft=8)
    for text in PROMPTS:
        prompt = tok.encode(text)
        config = GenerationConfig(max_new_tokens=24, max_draft=8)
        want = plain.generate(prompt, config)
        got = spec.generate(prompt, config)
        assert got.tokens == want.tokens, (which, strategy, text)
        assert want.tokens == greedy_reference(target, prompt, 24, {tok.eos_token_id})
        if strategy == "draft":
            assert got.stats.accepted == got.stats.drafted > 0  # a self-draft verifies up to 9 rows at once


def test_long_prefill_takes_the_dense_route_and_stays_close(int4_target, tok):
    """Above dense_rows the bf16 copy runs: not bit-equal to the int4 kernel, but the same weights."""
    ids = torch.tensor([tok.encode(" ".join(PROMPTS))[:40]])
    with torch.inference_mode():
        batched = int4_target(ids).logits[0]
        stepwise = Session(int4_target, tok)
        rows = [stepwise.target.extend([t])[0] for t in ids[0].tolist()]
    diff = (batched.float() - torch.stack(rows).float()).abs().max()
    assert diff < 0.1 * batched.float().abs().max()  # bf16 end to end, attention included


def test_quantize_target_rejects_unknown_modes():
    import tiny

    with pytest.raises(ValueError):
        quantize_target(tiny.model(hidden=HIDDEN), TargetQuantConfig("int3"))
    with pytest.raises(ValueError):
        quantize_target(tiny.model(hidden=HIDDEN), TargetQuantConfig("int4", other="fp8"))


@pytest.mark.slow
def test_real_int4_target_fim_completion_is_lossless(real_cache):
    """In the tests' own cache (conftest's real_cache): the bf16 conversions the transformers forward needs land
    there, never in the user's."""
    from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
    from specdec.models.loading import load_pair
    from specdec.models.store import pull
    from specdec.prompts.completion import Completer

    pull(DEFAULT_TARGET)  # the user's GGUFs where they pulled them (read through links), else downloaded once
    pull(DEFAULT_DRAFT)
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, target_quant="int4", forward="transformers")
    assert isinstance(pair.target.model.model.layers[0].mlp.up_proj, Int4Linear)
    prefix = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    '
    suffix = "\n\n\nprint(fibonacci(10))\n"
    texts = {}
    for strategy in ("plain", "draft", "auto"):
        session = make_session(pair.target.model, pair.target.tokenizer, strategy, pair.draft.model)
        texts[strategy] = Completer.for_session(session).complete(prefix, suffix, GenerationConfig(32)).tokens
    assert "return" in pair.target.tokenizer.decode(texts["plain"])
    assert texts["draft"] == texts["plain"] and texts["auto"] == texts["plain"]


@pytest.mark.parametrize("mode", ["int4", "int8", "none"])
def test_load_pair_target_quant(tmp_path, mode):
    import tiny

    from specdec.models.loading import load_pair

    path = tiny.save(tmp_path, seed=1, hidden=HIDDEN)
    pair = load_pair(str(path), str(path), dtype="bf16", target_quant=mode)
    up = pair.target.model.model.layers[0].mlp.up_proj
    assert type(up) is {"int4": Int4Linear, "int8": Int8ChannelLinear, "none": torch.nn.Linear}[mode]
    plain = make_session(pair.target.model, pair.target.tokenizer, "plain")
    spec = make_session(pair.target.model, pair.target.tokenizer, "draft", pair.draft.model)
    prompt = pair.target.tokenizer.encode(PROMPTS[0])
    assert spec.generate(prompt, GenerationConfig(16)).tokens == plain.generate(prompt, GenerationConfig(16)).tokens


def test_load_pair_rejects_an_unknown_target_quant(tmp_path):
    import tiny

    from specdec.errors import SpecdecError
    from specdec.models.loading import load_pair

    with pytest.raises(SpecdecError, match="int3"):
        load_pair(str(tiny.save(tmp_path, hidden=HIDDEN)), None, target_quant="int3")
