"""Tiny random Qwen2 models written as GGUFs and loaded by the native forward, for tests/native."""

from __future__ import annotations

import functools

import pytest
import torch

import tiny
from gguf_files import write_qwen2_gguf

VOCAB = 384  # a multiple of 16: the output layer runs W8A8's 16-column tiles
HIDDEN = 256  # Q4_K needs inputs in 256s
# one layer's V and down in other types, as a Q4_K_M file mixes Q6_K in (gguf-py cannot write Q6_K)
MIXED = {"blk.1.attn_v": "Q5_0", "blk.1.ffn_down": "Q8_0", "blk.0.attn_output": "F16"}


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


def write(path, seed: int = 0, layers: int = 2, tied: bool = False, **kwargs):
    write_qwen2_gguf(hf_model(seed, layers), path, types=kwargs.pop("types", MIXED), tied=tied, **kwargs)
    return path


@functools.lru_cache(maxsize=4)
def _cached_gguf(seed: int, layers: int, tied: bool) -> str:
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp(prefix="specdec-native-"))
    return str(write(directory / f"tiny-{seed}-{layers}-{int(tied)}.gguf", seed, layers, tied))


def native_model(seed: int = 0, layers: int = 2, tied: bool = False, dense: bool = False, capacity: int = 512,
                 cache_dtype: torch.dtype = torch.bfloat16):
    """A NativeModel of a tiny random GGUF (written once per process and arguments)."""
    from specdec.native.gguf_weights import read_qwen2
    from specdec.native.lm import NativeModel
    from specdec.native.qwen2 import Qwen2

    return NativeModel(Qwen2(read_qwen2(_cached_gguf(seed, layers, tied), dense=dense)), capacity,
                       cache_dtype=cache_dtype)
