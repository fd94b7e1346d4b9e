"""Qwen2 and Llama (DeepSeek-Coder, CodeLlama) as a forward of our own, in gpt-fast's style: explicit positions, a
preallocated KV cache, a few ops a layer, every one of them row-exact (layers.py), so a row's logits do not
depend on the pass it came in. The two are one decoder: Llama lacks Qwen2's QKV bias (the weights hold None)
and may scale RoPE linearly (the config's rope_scale); gguf_weights puts a llama GGUF's permuted Q/K rows back
in HF order, so both rotate NeoX-style here.

A pass takes n rows: token ids, their positions (RoPE), the cache slots their K/V are written to, and what each
row attends to: slots 0 .. prefix-1, then `extra` slots in order (a tree node's ancestors by depth, then
itself). Which rows share a pass, and in which slots the keys sit, changes no bit of a row's result.

Per layer: x -> RMSNorm -> QKV -> bias (Qwen2), RoPE (NeoX: halves rotated), K/V into the cache (one op) -> attention ->
O -> residual add + RMSNorm -> gate|up -> SiLU * up -> down -> residual add + the next RMSNorm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError
from specdec.native import layers as F
from specdec.native.gguf_weights import Qwen2Config, Qwen2Weights


@dataclass
class KVCache:
    """k[layer], v[layer]: [Hk, S, D] each, preallocated for S slots (committed tokens, then the tree region)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def empty(cls, config: Qwen2Config, slots: int, dtype: torch.dtype) -> KVCache:
        shape = (config.kv_heads, slots, config.head_dim)
        return cls([torch.zeros(shape, dtype=dtype) for _ in range(config.layers)],
                   [torch.zeros(shape, dtype=dtype) for _ in range(config.layers)])

    @property
    def slots(self) -> int:
        return self.k[0].shape[1] if self.k else 0

    def move(self, sources: torch.Tensor, first: int) -> None:
        """Copy slots `sources` (i64[m]) to first .. first + m - 1 in every layer (a kept tree path moves down)."""
        for cache in (*self.k, *self.v):
            cache[:, first : first + len(sources)] = cache[:, sources]


ROPE_SLACK = 256  # positions past the context a tree node may take (committed + depth - 1)


class Qwen2:
    """The model: weights (gguf_weights.read_qwen2) and the forward over a KVCache it does not own."""

    def __init__(self, weights: Qwen2Weights):
        self.weights, self.config = weights, weights.config
        self.scale = self.config.head_dim ** -0.5
        # RoPE's cos/sin for every position the model takes, made once (layers.rope_table)
        self.cos, self.sin = F.rope_table(self.config.context_length + ROPE_SLACK, self.config.head_dim,
                                          self.config.rope_theta, self.config.rope_scale)

    def new_cache(self, slots: int, dtype: torch.dtype = torch.bfloat16) -> KVCache:
        return KVCache.empty(self.config, slots, dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, prefix: torch.Tensor,
                extra: torch.Tensor, cache: KVCache, keep: int | None = None,
                hidden_states: list[torch.Tensor] | None = None) -> torch.Tensor:
        """ids, positions, slots, prefix i64[n]; extra i64[n, E] (-1 padded) -> logits f32[keep, vocab] of the last
        keep rows (all by default). hidden_states, when given, receives each layer's residual stream f32[n, d]."""
        c, w = self.config, self.weights
        n = len(ids)
        residual = w.embedding(ids)
        h = F.rms_norm(residual, w.layers[0].attn_norm, c.eps)
        if int(positions.max()) >= len(self.cos):
            raise SpecdecError(f"position {int(positions.max())} is beyond the model's context of "
                               f"{self.config.context_length}")
        q_width = c.heads * c.head_dim
        for i, layer in enumerate(w.layers):
            k_cache, v_cache = cache.k[i], cache.v[i]
            q = F.qkv_rope_cache(layer.qkv(h), layer.qkv_bias, positions, self.cos, self.sin, k_cache, v_cache, slots,
                                 c.heads)
            attn = F.attention(q, k_cache, v_cache, prefix, extra, self.scale)
            h = F.add_rms_norm(layer.o(attn.reshape(n, q_width)), residual, layer.ffn_norm, c.eps)
            mlp = layer.down(F.silu_mul(layer.gate_up(h)))
            following = w.layers[i + 1].attn_norm if i + 1 < len(w.layers) else w.output_norm
            h = F.add_rms_norm(mlp, residual, following, c.eps)
            if hidden_states is not None:
                hidden_states.append(residual.clone())
        keep = n if keep is None else keep
        return w.output(h[n - keep :].contiguous())
