"""The target in 4 bits on CPU: weight-only int4 (group 32) and int8 (per channel) Linear layers.

int8 layers run PyTorch's own CPU kernel (`_weight_int8pack_mm`) on bf16 activations, or W8A8
(specdec.models.w4a8.matmul8) beside W4A8 int4 layers (int8_kernel_for). int4 runs one
of two kernels, chosen once per model (TargetQuantConfig.kernel): ATen's
(`_weight_int4pack_mm_for_cpu`, bf16 activations, exact int4 weights) or W4A8
(specdec.models.w4a8: int8 activations and int8 dot products, on AVX512-VNNI or AVX2),
whose cost grows far more slowly with the rows of a verify pass. "auto" takes W4A8 where it
loads. A decode step or a verify pass streams every weight once per call, so fewer weight
bytes make it faster; a long prefill is compute-bound, where these kernels lose to a plain
bf16 matmul, so past `DENSE_ROWS` rows an Int4Linear uses a bf16 copy of the same dequantized
weight instead.

Exactness: greedy speculative output equals plain greedy only if a token's logits do not
depend on how many rows share the call. Every kernel here is row-independent on CPU
(tests/models/test_int4.py, test_w4a8.py); the dense copy is not bit-equal to them, nor are the
two int4 kernels to each other. So every call a decode step or a verify pass makes (1 to
max_draft + 1 rows) must take one and the same int4 kernel: DENSE_ROWS must be at least
max_draft + 1, and a layer's kernel never changes with the row count. Prefill chunks above it
take the dense route, identically for plain and speculative decoding, since both prefill the
same prompt the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.engine.limits import MAX_DRAFT
from specdec.errors import SpecdecError
from specdec.models import w4a8
from specdec.models.choices import INT4_KERNELS, TARGET_MODES
from specdec.models.gguf_codes import (
    GROUP,
    QK_K,
    Int4Codes,
    Int8Codes,
    int8_per_channel,
    q4k_codes,
    quantize_q4k,
    read_qwen2_linears,
)

# Rows per call above which Int4Linear switches to its dense bf16 copy. int4 beats bf16 up to
# 4-8 rows (`specdec bench --kernels`, docs/benchmarks.md), but exactness decides (see above):
# every verify pass the engine can make, up to MAX_DRAFT + 1 rows, must run the kernel a 1-row
# decode step runs. Prefill chunks (PREFILL_CHUNK rows) take the dense copy.
DENSE_ROWS = MAX_DRAFT + 1

OTHER = ("int8", "bf16")  # what the tensors that are not Q4_K become in int4 mode


@dataclass
class TargetQuantConfig:
    mode: str = "none"  # one of TARGET_MODES
    dense_rows: int = DENSE_ROWS  # Int4Linear: above this many rows, the bf16 copy (0: never keep one)
    # int4 mode: Q6_K & co. (lm_head among them) as int8 per channel, or dequantized bf16. bf16 is
    # closer to the GGUF but not lossless-safe: torch's bf16 matmul computes a 1-row call
    # differently from the same row in a multi-row call, so a verify pass may disagree with
    # a decode step in the last bits; int8 per channel is row-independent, hence the default.
    other: str = "int8"
    # int4 layers' kernel, one of INT4_KERNELS: auto = w4a8 where it loads here, else aten
    kernel: str = "auto"


INT8_KERNELS = ("aten", "w8a8")


def int8_kernel_for(int4_kernel: str) -> str:
    """The kernel an int4 target's int8 layers run beside its resolved int4 kernel: w8a8 beside w4a8 (the
    same compiled module, the same activation codes), aten beside aten, and aten under SPECDEC_W8A8=0
    (w4a8.w8a8_enabled)."""
    return "w8a8" if int4_kernel == "w4a8" and w4a8.w8a8_enabled() else "aten"


def int8_kernel_fitting(kernel: str, out_features: int, in_features: int) -> str:
    """kernel where it tiles the layer (w4a8.tiles), else aten."""
    return kernel if kernel == "aten" or w4a8.tiles(out_features, in_features) else "aten"


def resolve_kernel(choice: str) -> str:
    """The int4 kernel a model runs: "aten" or "w4a8". One answer per model (see the module's exactness note).

    auto takes w4a8 where it loads here; asking for w4a8 where it cannot run is an error, not a fallback."""
    if choice not in INT4_KERNELS:
        raise ValueError(f"unknown int4 kernel {choice!r}; use one of {', '.join(INT4_KERNELS)}")
    if choice == "aten":
        return "aten"
    if w4a8.load() is not None:
        return "w4a8"
    if choice == "w4a8":
        raise SpecdecError(f"int4 kernel w4a8 cannot run here ({w4a8.unavailable_reason()}); "
                           f"use auto or aten")
    return "aten"


class Int4Linear(torch.nn.Module):
    """y = x @ W.T + b with W in int4 groups of 32 (asymmetric: (q - 8) * scale + zero).

    kernel: "aten" (packed: ATen's int4 layout, scales_and_zeros [groups, out, 2]) or "w4a8" (packed:
    w4a8.pack's blocks, scales and zeros inside). Only that kernel's weight is kept."""

    def __init__(self, codes: Int4Codes, bias: torch.Tensor | None = None, dense_rows: int = DENSE_ROWS,
                 dtype: torch.dtype = torch.bfloat16, kernel: str = "aten"):
        super().__init__()
        out_features, in_features = codes.codes.shape
        if out_features % 16 or in_features % GROUP:
            raise ValueError(f"int4 needs out % 16 == 0 and in % {GROUP} == 0, got {out_features}x{in_features}")
        kernel = resolve_kernel(kernel)
        if kernel == "w4a8":
            packed, sz = w4a8.pack(codes.codes, codes.scale, codes.zero), None
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.to(torch.int32).contiguous(), 1)
            # [groups, out, 2] in the activations' dtype: the kernel's layout; rounded to bf16 first,
            # so an fp32 run computes with the very weights a bf16 run does
            sz = torch.stack([codes.scale, codes.zero], -1).to(torch.bfloat16).transpose(0, 1).contiguous().to(dtype)
        dense = None
        if dense_rows > 0:  # the kernel's own weights, rounded to the activations' dtype
            dense = codes.dequantize(torch.bfloat16).to(dtype)
        self._install(in_features, out_features, dense_rows, dtype, kernel, packed, sz,
                      None if bias is None else bias.detach().to(dtype).clone(), dense)

    def _install(self, in_features: int, out_features: int, dense_rows: int, dtype: torch.dtype, kernel: str,
                 packed: torch.Tensor, scales_and_zeros: torch.Tensor | None, bias: torch.Tensor | None,
                 dense: torch.Tensor | None) -> None:
        self.in_features, self.out_features, self.dense_rows, self.dtype = in_features, out_features, dense_rows, dtype
        self.kernel = kernel
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)
        self.register_buffer("dense", dense)
        self.register_buffer("weight", torch.empty(0, dtype=dtype), persistent=False)  # for dtype/device probes

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], in_features: int, out_features: int, dense_rows: int,
                   dtype: torch.dtype, kernel: str) -> Int4Linear:
        """The layer from its own state_dict (specdec.models.int4_cache): no repacking, bit for bit the same.

        kernel: the one the state was packed for ("aten": packed + scales_and_zeros; "w4a8": packed alone)."""
        if kernel not in ("aten", "w4a8"):
            raise ValueError(f"unknown resolved int4 kernel {kernel!r}")
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._install(in_features, out_features, dense_rows, dtype, kernel, state["packed"],
                       state.get("scales_and_zeros") if kernel == "aten" else None, state.get("bias"),
                       state.get("dense"))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(self.dtype)
        if self.dense is not None and len(rows) > self.dense_rows:  # the same call as a bf16 nn.Linear
            out = torch.nn.functional.linear(rows, self.dense, self.bias)
        else:
            if self.kernel == "w4a8":
                out = w4a8.matmul(rows, self.packed, self.out_features)
            else:
                out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.contiguous(), self.packed, GROUP,
                                                                  self.scales_and_zeros)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, group={GROUP}, kernel={self.kernel}, "
                f"dense_rows={self.dense_rows}")


class Int8ChannelLinear(torch.nn.Module):
    """y = x @ (codes * scale).T + b, weight-only int8 per output channel.

    kernel: "aten" (`_weight_int8pack_mm`, float activations; codes [out, in]) or "w8a8" (w4a8.matmul8:
    activations int8 per row and group of 32, as the W4A8 int4 layers beside it; packed: w4a8.pack8).
    Either keeps only its own weight; scale is the same values in both (x's dtype; fp32 for w8a8)."""

    def __init__(self, codes: Int8Codes, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                 kernel: str = "aten"):
        super().__init__()
        out_features, in_features = codes.codes.shape
        scale = codes.scale.to(dtype)  # the kernel takes scales in x's dtype
        if kernel == "w8a8":
            weight, scale = w4a8.pack8(codes.codes), scale.float()
        else:
            weight = codes.codes.contiguous()
        self._install(in_features, out_features, dtype, kernel, weight, scale,
                      None if bias is None else bias.detach().to(dtype).clone())

    def _install(self, in_features: int, out_features: int, dtype: torch.dtype, kernel: str, weight: torch.Tensor,
                 scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        if kernel not in INT8_KERNELS:
            raise ValueError(f"unknown int8 kernel {kernel!r}")
        self.out_features, self.in_features, self.dtype, self.kernel = out_features, in_features, dtype, kernel
        self.register_buffer("packed" if kernel == "w8a8" else "codes", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.register_buffer("weight", torch.empty(0, dtype=dtype), persistent=False)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], in_features: int, out_features: int,
                   dtype: torch.dtype, kernel: str = "aten") -> Int8ChannelLinear:
        """The layer from its own state_dict (specdec.models.int4_cache), bit for bit the same."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._install(in_features, out_features, dtype, kernel, state["packed" if kernel == "w8a8" else "codes"],
                       state["scale"], state.get("bias"))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
        if self.kernel == "w8a8":
            out = w4a8.matmul8(rows, self.packed, self.scale)
        else:
            out = torch.ops.aten._weight_int8pack_mm(rows, self.codes, self.scale)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, kernel={self.kernel}"


def kernels_in_use(model) -> str:
    """Every quantized-layer kernel the target runs, e.g. "w4a8+w8a8": what a verify pass's cost depends on."""
    kernels = {m.kernel for m in model.modules() if isinstance(m, (Int4Linear, Int8ChannelLinear))}
    return "+".join(sorted(kernels))


def int4_kernel_in_use(model) -> str:
    """The kernel a quantized target's int4 layers run: "aten", "w4a8", or "" when it has none."""
    return next((m.kernel for m in model.modules() if isinstance(m, Int4Linear)), "")


def _bias(linear: torch.nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def quantize_target(model, config: TargetQuantConfig, gguf: Path | str | None = None,
                    dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Swap the target's Linear layers in place; returns how many became what.

    int4: each Linear whose GGUF tensor is Q4_K takes its codes unchanged; the rest (Q6_K
    and the like, lm_head among them) go int8 per channel (or stay dequantized, config.other).
    Without a GGUF the weights are first quantized to Q4_K blocks in-process (quantize_q4k).
    Every int4 layer runs the kernel resolve_kernel(config.kernel) picks, once for the model.
    int8: every Linear int8 per channel from the loaded weights. Everything else (norms,
    the embedding, attention) runs in `dtype`.
    """
    if config.mode not in TARGET_MODES:
        raise ValueError(f"unknown target quantization {config.mode!r}; use one of {', '.join(TARGET_MODES)}")
    if config.other not in OTHER:
        raise ValueError(f"unknown treatment {config.other!r} for non-Q4_K tensors; use one of {', '.join(OTHER)}")
    if config.kernel not in INT4_KERNELS:
        raise ValueError(f"unknown int4 kernel {config.kernel!r}; use one of {', '.join(INT4_KERNELS)}")
    counts: dict[str, int] = {}
    if config.mode == "none":
        return counts
    kernel = resolve_kernel(config.kernel) if config.mode == "int4" else "aten"  # one kernel for every layer
    int8_kernel = int8_kernel_for(kernel)  # aten in int8 mode, whose kernel is aten
    model.to(dtype)
    tensors = read_qwen2_linears(gguf) if (gguf is not None and config.mode == "int4") else {}
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            full = f"{path}.{name}" if path else name
            tensor = tensors.get(full)
            if tensor is not None and tensor.shape != tuple(child.weight.shape):
                raise ValueError(f"GGUF tensor for {full} is {tensor.shape}, "
                                 f"the model's is {tuple(child.weight.shape)}")
            if config.mode == "int8":
                layer, kind = Int8ChannelLinear(int8_per_channel(child.weight), _bias(child), dtype, "aten"), "int8"
            elif tensor is not None and tensor.qtype == "Q4_K":
                layer = Int4Linear(q4k_codes(tensor.data, tensor.shape[1]), _bias(child), config.dense_rows, dtype,
                                   kernel)
                kind = "int4"
            elif tensor is None and not gguf and child.in_features % QK_K == 0 and child.out_features % 16 == 0:
                codes = q4k_codes(quantize_q4k(child.weight), child.in_features)
                layer, kind = Int4Linear(codes, _bias(child), config.dense_rows, dtype, kernel), "int4"
            else:
                weight = tensor.dequantize() if tensor is not None else child.weight.float()
                if config.other == "bf16":
                    child.weight.data = weight.to(dtype)
                    counts["dense"] = counts.get("dense", 0) + 1
                    continue
                layer = Int8ChannelLinear(int8_per_channel(weight), _bias(child), dtype,
                                          int8_kernel_fitting(int8_kernel, child.out_features, child.in_features))
                kind = "int8"
            setattr(parent, name, layer)
            counts[kind] = counts.get(kind, 0) + 1
    return counts
