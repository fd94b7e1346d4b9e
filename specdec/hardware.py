"""Which float type this machine computes fastest in: bf16 only where the hardware has it.

CUDA GPUs and CPUs with AVX512-BF16 or AMX run bf16 matmuls natively. On CPUs without them
(AVX2-only machines: most laptops and many cloud cores) PyTorch emulates bf16, and a
multi-token pass -- a prefill, a verify of k drafts -- runs several times slower than in fp32.
Only single-token steps, which just stream the weights, are faster in bf16 there. The
measurements are in docs/benchmarks.md (*Precision*).
"""

from __future__ import annotations

from functools import cache

from specdec.errors import SpecdecError
from specdec.models.choices import DTYPES


@cache
def native_bf16(device: str = "cpu") -> bool:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def compute_dtype(device: str = "cpu"):
    """torch.bfloat16 where `device` computes it natively, else torch.float32."""
    import torch

    return torch.bfloat16 if native_bf16(device) else torch.float32


def torch_dtype(name: str, device: str = "cpu"):
    """The torch dtype a `--dtype` choice means on this device (`auto`: compute_dtype)."""
    import torch

    if name == "auto":
        return compute_dtype(device)
    try:
        return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
    except KeyError:
        raise SpecdecError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None
