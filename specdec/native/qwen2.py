"""Qwen2 and Llama (DeepSeek-Coder, CodeLlama) as a forward of our own, in gpt-fast's style: explicit positions, a
preallocated KV cache, a few ops a layer, every one of them row-exact (layers.py), so a row's logits do not
depend on the pass it came in. The two are one decoder: Llama lacks Qwen2's QKV bias (the weights hold None)
and may scale RoPE linearly (the config's rope_scale); gguf_weights puts a llama GGUF's permuted Q/K rows back
in HF order, so both rotate NeoX-style here.

A pass takes n rows: token ids, their positions (RoPE), the cache slots their K/V are written to, and what each
row attends to: slots 0 .. prefix-1, then `extra` slots in order (a tree node's ancestors by depth, then
itself). Which rows share a pass, and in which slots the keys sit, changes no bit of a row's result.

Per layer: x -> RMSNorm -> QKV -> bias (Qwen2), RoPE (NeoX: halves rotated), K/V into the cache (one op) -> attention ->
O -> residual add + RMSNorm -> gate|up -> SiLU * up -> down -> residual add + the next RMSNorm. Where the
matmuls reading a norm are all W4A8/W8A8, the norm rounds its rows to their int8 codes in the same C++ pass.
"""

from __future__ import annotations

from collections.abc import Callable
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


class Qwen2:
    """The model: weights (gguf_weights.read_qwen2) and the forward over a KVCache it does not own."""

    def __init__(self, weights: Qwen2Weights):
        self.weights, self.config = weights, weights.config
        self.scale = self.config.head_dim ** -0.5
        # RoPE's cos/sin (layers.rope_table) for the positions the caches over this model use (cover), not the
        # file's context_length: a corrupt or 10M-token one must not size a table nobody reads
        self.rope = F.rope_table(0, self.config.head_dim, self.config.rope_theta, self.config.rope_scale)
        # the norms hand their rows to the matmuls already rounded to int8 where every reader takes them so
        # (layers.add_rms_norm_int8: the same bits, one rounding instead of one per matmul)
        self.norm_readers = [p for layer in weights.layers for p in (*layer.qkv.parts, *layer.gate_up.parts)]
        self.norm_readers.append(weights.output)
        self.int8_norms = F.int8_norms(self.norm_readers)

    def norm(self, x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, int8: bool):
        """residual += x (x None: nothing added), then RMSNorm: f32[n, d], or int8 rows when int8."""
        if int8:
            return F.add_rms_norm_int8(x, residual, weight, self.config.eps)
        if x is None:
            return F.rms_norm(residual, weight, self.config.eps)
        return F.add_rms_norm(x, residual, weight, self.config.eps)

    def cover(self, positions: int) -> None:
        """RoPE's tables hold positions 0 .. positions-1 (a cache's capacity: NativeLM), at most the context. A
        position's entry does not depend on the table's length, so a longer table changes no bit."""
        positions = min(positions, self.config.context_length)
        if positions > len(self.rope[0]):
            self.rope = F.rope_table(positions, self.config.head_dim, self.config.rope_theta, self.config.rope_scale)

    def new_cache(self, slots: int, dtype: torch.dtype = torch.bfloat16) -> KVCache:
        return KVCache.empty(self.config, slots, dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, prefix: torch.Tensor,
                extra: torch.Tensor, cache: KVCache, keep: int | None = None,
                hidden_states: list[torch.Tensor] | None = None, head=None,
                between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """ids, positions, slots, prefix i64[n]; extra i64[n, E] (-1 padded) -> logits f32[keep, vocab] of the last
        keep rows (all by default). hidden_states, when given, receives each layer's residual stream f32[n, d].
        head: the output layer to use instead of the model's (a draft's shortlist, specdec.native.shortlist).
        between_layers: called before each layer; what it raises ends the pass (a cancelled prefill stops within one
        layer, not one chunk). The cache slots the pass wrote are then the caller's to forget."""
        c, w = self.config, self.weights
        n = len(ids)
        residual = w.embedding(ids)
        # a LoRA side matmul (a draft's adapter, Linear.lora) reads fp32 rows: with one set, the norms give fp32
        int8 = self.int8_norms and F.int8_norms_now(self.norm_readers)
        h = self.norm(None, residual, w.layers[0].attn_norm, int8)
        cos, sin = self.rope
        if int(positions.max()) >= len(cos):
            raise SpecdecError(f"position {int(positions.max())} is beyond the {len(cos)} positions this model "
                               f"was prepared for (context {self.config.context_length}; Qwen2.cover)")
        q_width = c.heads * c.head_dim
        for i, layer in enumerate(w.layers):
            if between_layers is not None:
                between_layers()
            k_cache, v_cache = cache.k[i], cache.v[i]
            q = F.qkv_rope_cache(layer.qkv(h), layer.qkv_bias, positions, cos, sin, k_cache, v_cache, slots,
                                 c.heads)
            attn = F.attention(q, k_cache, v_cache, prefix, extra, self.scale)
            h = self.norm(layer.o(attn.reshape(n, q_width)), residual, layer.ffn_norm, int8)
            mlp = layer.down(F.silu_mul(layer.gate_up(h)))
            following = w.layers[i + 1].attn_norm if i + 1 < len(w.layers) else w.output_norm
            h = self.norm(mlp, residual, following, int8)
            if hidden_states is not None:
                hidden_states.append(residual.clone())
        keep = n if keep is None else keep
        return (head or w.output)(F.last_rows(h, keep))
