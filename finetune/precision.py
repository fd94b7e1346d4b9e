"""How a LoRA run holds and computes the draft, chosen per device: CPU and CUDA want different things.

CPU (as it always was): bf16 autocast where the CPU computes bf16 natively (AVX512-BF16, AMX; `auto`),
the frozen base held in bf16 only where the round trip is exact (the cached bf16 checkpoints), and
the base quantized as the server runs it (`--draft-quant`: PyTorch's int8 kernels are CPU-only).
CUDA: bf16 autocast and a bf16 frozen base wherever the GPU computes bf16 (Ampere on; `auto`), exact
or not, since the base only feeds activations; training puts the caller's weights back exactly. No
int8: the server quantizes no draft on a GPU (specdec.models.quantize.quantize_draft), so the adapter
is fitted over the base it serves.
LoRA weights stay fp32 on both: a rank-16 adapter is a few MB, and AdamW's small updates would round
away in bf16 weights; autocast computes with them in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError
from specdec.hardware import native_bf16

PRECISIONS = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class TrainPrecision:
    device: str  # "cpu" or "cuda[:n]"
    mixed_precision: str  # accelerate's: "bf16" (autocast) or "no"
    base_dtype: torch.dtype | None  # the frozen base weights' dtype while training; None: as loaded
    exact_only: bool  # hold the base in base_dtype only where casting there and back loses nothing
    lora_dtype: torch.dtype  # the adapter's weights (and so AdamW's state)
    quant: str  # the base's quantization while training ("none": the float base)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


def train_precision(device: str, precision: str = "auto", quant: str = "none",
                    bf16: bool | None = None) -> TrainPrecision:
    """The precision a LoRA run uses on `device` ("cpu", "cuda", "cuda:N"). precision: the user's choice
    (auto: bf16 where the device computes it natively); quant: the draft quantization the server runs;
    bf16: whether the device computes bf16 natively (None: ask the hardware)."""
    if precision not in PRECISIONS:
        raise SpecdecError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise SpecdecError(f"fine-tuning runs on cpu or cuda[:N], not {device!r}")
    if bf16 is None:
        bf16 = native_bf16(device)
    mixed = precision == "bf16" or (precision == "auto" and bf16)
    cuda = device.startswith("cuda")
    return TrainPrecision(device=device, mixed_precision="bf16" if mixed else "no",
                          base_dtype=torch.bfloat16 if mixed else None, exact_only=not cuda,
                          lora_dtype=torch.float32, quant="none" if cuda else quant)
