"""A dynamically int8-quantized Linear that peft can still wrap and probe, and LoRA can train through."""

from __future__ import annotations

import copy
import warnings

import torch

from specdec.hardware import compute_dtype
from specdec.models import w4a8


def _w8a8_weight(inner) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """fbgemm's int8 codes and per-channel scales packed for specdec's W8A8 kernel (w4a8.matmul8), where
    it runs here (AVX512-VNNI or AVX2, SPECDEC_W8A8 not 0) and tiles the layer. The same weights, read by int8
    dot products without fbgemm's per-call activation pass and row grouping: a cheaper draft step,
    most of all for the two-token sync that starts most drafts (docs/benchmarks.md, *W8A8*).
    None: fbgemm serves the layer."""
    weight = inner.weight()
    if not (w4a8.w8a8_enabled() and w4a8.tiles(*weight.shape)) or w4a8.load() is None:
        return None
    if weight.qscheme() != torch.per_channel_affine or bool(weight.q_per_channel_zero_points().any()):
        return None  # only symmetric per-channel codes map onto the kernel as they are
    bias = inner.bias()
    return (w4a8.pack8(weight.int_repr()), weight.q_per_channel_scales().float().contiguous(),
            None if bias is None else bias.detach().float())


class _Int8Matmul(torch.autograd.Function):
    """The int8 layer's exact forward; backward passes the gradient to the input through the
    dequantized weight (straight through the activation rounding), so LoRA layers before it train
    against the draft the server actually runs."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer, ctx.dtype = layer, x.dtype
        return layer.int8_matmul(x.float())

    @staticmethod
    def backward(ctx, grad):
        weight = ctx.layer.dequantized()
        return (grad.to(weight.dtype) @ weight).to(ctx.dtype), None


class Int8Linear(torch.nn.Module):
    """int8 weights scaled per output channel, activations quantized dynamically to int8 per
    group of rows of like magnitude (torch's dynamic quantization, fbgemm on x86).

    torch's quantized Linear exposes `weight` as a method; peft probes `base_layer.weight`
    for device and dtype when it adds an adapter, so this wrapper answers with an empty
    fp32 buffer and LoRA matrices stay fp32 beside the int8 base. The quantized layer is
    kept out of the module tree: peft's non-strict `load_state_dict` of adapter weights
    would otherwise reach it, and torch's quantized modules reject partial state dicts.
    The int8 base is never saved or moved (CPU only).
    """

    def __init__(self, linear: torch.nn.Linear, grad_dtype: torch.dtype | None = None):
        super().__init__()
        if linear.weight.dtype != torch.float32:  # quantize_dynamic takes fp32 weights (a bf16 draft in training)
            linear = copy.deepcopy(linear).float()  # a copy: the caller's layer stays as it was
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notice
            inner = torch.ao.quantization.quantize_dynamic(
                torch.nn.Sequential(linear), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
                dtype=torch.qint8)[0]
        object.__setattr__(self, "_inner", inner)  # not a registered submodule, see above
        object.__setattr__(self, "_dequantized", None)
        object.__setattr__(self, "_w8a8", _w8a8_weight(inner))  # None: fbgemm runs every call
        self.grad_dtype = grad_dtype or compute_dtype()  # backward's matmul: emulated bf16 would crawl
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.empty(0, dtype=torch.float32), persistent=False)

    def backward_through(self, weight: torch.Tensor) -> None:
        """Let backward read `weight`, the float weights this layer was quantized from (training keeps them to put
        back), instead of making and keeping a float copy of the int8 codes: the same straight-through gradient up
        to the codes' rounding, without a second float copy of the draft (2 GB for the 0.5B in fp32). Where W8A8
        computes every call, fbgemm's copy of the codes is then read by nothing and is dropped."""
        object.__setattr__(self, "_dequantized", weight.detach())
        if self._w8a8 is not None:
            object.__setattr__(self, "_inner", None)

    def dequantized(self) -> torch.Tensor:
        """The int8 weight as a float matrix, made on the first backward and kept (training only)."""
        if self._dequantized is None:
            object.__setattr__(self, "_dequantized", self._inner.weight().dequantize().to(self.grad_dtype))
        return self._dequantized

    def int8_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """W8A8 where it runs (see _w8a8_weight): every row quantized on its own, per group of 32.
        Otherwise fbgemm, which quantizes a call's activations with one scale. A prompt's first token carries
        activations far larger than any other's (Qwen's attention sink), which would round every
        other row of a prefill away; so rows are grouped by power-of-two magnitude and each group
        is quantized on its own. A one-token decode step is one group, one call."""
        rows = x.reshape(-1, x.shape[-1])
        if self._w8a8 is not None:
            packed, scale, bias = self._w8a8
            out = w4a8.matmul8(rows.contiguous(), packed, scale)
            return (out if bias is None else out + bias).reshape(*x.shape[:-1], self.out_features)
        if len(rows) <= 1:
            return self._inner(x)
        magnitude = rows.abs().amax(-1).clamp(min=1e-30).log2().floor()
        groups = magnitude.unique()
        if len(groups) == 1:
            return self._inner(x)
        out = rows.new_empty(len(rows), self.out_features)
        for group in groups:
            members = (magnitude == group).nonzero().flatten()
            out.index_copy_(0, members, self._inner(rows.index_select(0, members)))
        return out.reshape(*x.shape[:-1], self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return _Int8Matmul.apply(x, self)
        return self.int8_matmul(x if x.dtype == torch.float32 else x.float())  # fbgemm takes fp32 activations
