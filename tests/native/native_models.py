"""Tiny random Qwen2 and Llama models written as GGUFs and loaded by the native forward, for tests/native.

arch "llama" is DeepSeek-Coder's shape in small: no biases, RoPE theta 1e5 scaled linearly by 4 (rope_scale
None: unscaled, as CodeLlama), Q/K permuted in the file as llama.cpp's converter permutes them."""

from __future__ import annotations

import functools

import pytest
import torch

import tiny
from gguf_files import write_llama_gguf, write_qwen2_gguf

VOCAB = 384  # a multiple of 16: the output layer runs W8A8's 16-column tiles
HIDDEN = 256  # Q4_K needs inputs in 256s
# one layer's V and down in other types, as a Q4_K_M file mixes Q6_K in (gguf-py cannot write Q6_K)
MIXED = {"blk.1.attn_v": "Q5_0", "blk.1.ffn_down": "Q8_0", "blk.0.attn_output": "F16"}
# the llama files in types transformers' GGUF loader reads too (no Q5_0); a permuted K in Q8_0 and F16 (int8)
LLAMA_MIXED = {"blk.1.attn_v": "Q8_0", "blk.1.ffn_down": "Q8_0", "blk.0.attn_output": "F16",
               "blk.0.attn_k": "Q8_0", "blk.1.attn_k": "F16"}
ARCHS = ("qwen2", "llama")
LLAMA_THETA, LLAMA_SCALE = 100_000.0, 4.0


def kernels_or_skip() -> None:
    from specdec.models import w4a8

    if w4a8.load() is None:
        pytest.skip(f"the native forward needs W4A8: {w4a8.unavailable_reason()}")


def hf_model(seed: int = 0, layers: int = 2):
    """A transformers Qwen2 with random QKV biases (zero at init), so the bias path is tested."""
    model = tiny.model(seed=seed, vocab_size=VOCAB, layers=layers, hidden=HIDDEN)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.2)
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.copy_(1 + torch.randn(norm.weight.shape, generator=gen) * 0.1)
    return model


def hf_llama_model(seed: int = 0, layers: int = 2, rope_scale: float | None = LLAMA_SCALE, vocab: int = VOCAB):
    """A transformers LlamaForCausalLM (no biases, GQA 4:2, head size 64) with random norms."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    rope = {"rope_type": "default", "rope_theta": LLAMA_THETA} if rope_scale is None else \
        {"rope_type": "linear", "factor": rope_scale, "rope_theta": LLAMA_THETA}
    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=0.3, tie_word_embeddings=False,
                         rms_norm_eps=1e-6, rope_parameters=rope, eos_token_id=0, bos_token_id=0, pad_token_id=4)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.copy_(1 + torch.randn(norm.weight.shape, generator=gen) * 0.1)
    return model


def write(path, seed: int = 0, layers: int = 2, tied: bool = False, arch: str = "qwen2",
          rope_scale: float | None = LLAMA_SCALE, **kwargs):
    if arch == "llama":
        write_llama_gguf(hf_llama_model(seed, layers, rope_scale), path, types=kwargs.pop("types", LLAMA_MIXED),
                         tied=tied, rope_scale=rope_scale, **kwargs)
    else:
        write_qwen2_gguf(hf_model(seed, layers), path, types=kwargs.pop("types", MIXED), tied=tied, **kwargs)
    return path


@functools.lru_cache(maxsize=8)
def _cached_gguf(seed: int, layers: int, tied: bool, arch: str = "qwen2",
                 rope_scale: float | None = LLAMA_SCALE) -> str:
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp(prefix="specdec-native-"))
    name = f"tiny-{arch}-{seed}-{layers}-{int(tied)}-{rope_scale}.gguf"
    return str(write(directory / name, seed, layers, tied, arch, rope_scale))


def native_model(seed: int = 0, layers: int = 2, tied: bool = False, dense: bool = False, capacity: int = 512,
                 cache_dtype: torch.dtype = torch.bfloat16, arch: str = "qwen2",
                 rope_scale: float | None = LLAMA_SCALE):
    """A NativeModel of a tiny random GGUF (written once per process and arguments)."""
    from specdec.native.gguf_weights import read_qwen2
    from specdec.native.lm import NativeModel
    from specdec.native.qwen2 import Qwen2

    path = _cached_gguf(seed, layers, tied, arch, rope_scale)
    return NativeModel(Qwen2(read_qwen2(path, dense=dense)), capacity, cache_dtype=cache_dtype)


def plain_greedy(model, prompt: list[int], n: int, stops) -> list[int]:
    """Token by token on a fresh cache of a NativeModel, argmax each step, up to a stop token: what every
    speculative strategy's greedy output must equal."""
    lm = model.new_cached_lm()
    logits = lm.extend(prompt)[-1]
    out = []
    for _ in range(n):
        token = int(torch.argmax(logits))
        if token in stops:
            break
        out.append(token)
        logits = lm.extend([token])[-1]
    return out
