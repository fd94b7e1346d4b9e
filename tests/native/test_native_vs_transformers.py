"""The native Qwen2 computes what transformers' Qwen2 computes: on the same dequantized weights in fp32 (the
`dense` reference) to float rounding, and on its own kernels (W4A8/W8A8: activations rounded to int8) closely."""

import numpy as np
import pytest
import torch
from native_models import VOCAB, _cached_gguf, hf_model, kernels_or_skip, native_model

from gguf_files import QWEN2_PARTS

TOKENS = [5, 17, 99, 250, 3, 3, 42, 380, 7, 120, 64, 200, 11, 13, 300, 301, 2, 9, 77, 150] * 3  # 60 tokens


def dequantized_transformers(seed: int = 0, layers: int = 2, tied: bool = False):
    """transformers' Qwen2 holding exactly the GGUF's weights, dequantized to fp32 by gguf's own code."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model = hf_model(seed, layers)
    reader = GGUFReader(_cached_gguf(seed, layers, tied))
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    for i in range(layers):
        names[f"blk.{i}.attn_norm.weight"] = f"model.layers.{i}.input_layernorm.weight"
        names[f"blk.{i}.ffn_norm.weight"] = f"model.layers.{i}.post_attention_layernorm.weight"
        for part, module in QWEN2_PARTS.items():
            names[f"blk.{i}.{part}.weight"] = f"model.layers.{i}.{module}.weight"
            names[f"blk.{i}.{part}.bias"] = f"model.layers.{i}.{module}.bias"
    state = model.state_dict()
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        state[names[t.name]] = torch.from_numpy(np.array(values, dtype=np.float32)).reshape(
            state[names[t.name]].shape)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("ops", ["compiled", "torch-reference"])
@pytest.mark.parametrize("tied", [False, True])
def test_dense_reference_equals_transformers_in_fp32(tied, ops, monkeypatch):
    """Everything but the matmul kernels: embedding lookup, RMSNorm, QKV biases, RoPE (NeoX, the GGUF's theta),
    GQA attention, SiLU MLP, residuals, the output layer (token_embd when tied); on the compiled ops and on
    layers.py's torch reference of them."""
    from specdec.native import layers

    if ops == "torch-reference":
        monkeypatch.setattr(layers, "_ops", lambda: None)
    elif not layers.ops_available():
        pytest.skip(f"the native ops cannot run here: {layers.ops_unavailable_reason()}")
    expected = dequantized_transformers(tied=tied)(torch.tensor([TOKENS])).logits[0]
    lm = native_model(tied=tied, dense=True, cache_dtype=torch.float32).new_cached_lm()
    got = torch.cat([lm.extend(TOKENS[:37]), lm.extend(TOKENS[37:])])  # a prefix then more: positions carry on
    assert got.shape == (len(TOKENS), VOCAB)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-4 * expected.abs().max().item())


def test_kernels_compute_what_todays_int4_target_computes():
    """On W4A8/W8A8 (activations rounded to int8 per group of 32) the native forward is today's int4 target
    (transformers with specdec.models.int4's layers over the same GGUF codes) up to float order: a random tiny
    model amplifies int8 rounding, so both sit further from the float model than from each other."""
    kernels_or_skip()
    from specdec.models.int4 import TargetQuantConfig, quantize_target

    reference = dequantized_transformers()
    quantize_target(reference, TargetQuantConfig("int4", dense_rows=0, kernel="w4a8"), _cached_gguf(0, 2, False),
                    torch.float32)
    expected = reference(torch.tensor([TOKENS])).logits[0]
    got = native_model(cache_dtype=torch.float32).new_cached_lm().extend(TOKENS)
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert cosine.min() > 0.999, cosine
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9
