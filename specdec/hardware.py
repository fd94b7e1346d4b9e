"""Which device runs the models (`--device`), and which float type it computes fastest in: bf16 only
where the hardware has it.

CUDA GPUs and CPUs with AVX512-BF16 or AMX run bf16 matmuls natively. On CPUs without them
(AVX2-only machines: most laptops and many cloud cores) PyTorch emulates bf16, and a
multi-token pass -- a prefill, a verify of k drafts -- runs several times slower than in fp32.
Only single-token steps, which just stream the weights, are faster in bf16 there. The
measurements are in docs/benchmarks.md (*Precision*).
"""

from __future__ import annotations

from functools import cache

from specdec.errors import SpecdecError

DTYPES = ("auto", "bf16", "fp32")  # auto: bf16 where the device computes it natively, else fp32


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


DEVICES = ("auto", "cpu", "cuda")  # and cuda:N; auto: CUDA where there is a GPU, else the CPU


def is_device(value: str) -> bool:
    """Whether value names a device we run on (checked without torch: the CLI validates before loading)."""
    return value in DEVICES or (value.startswith("cuda:") and value[5:].isdigit())


def torch_device(value: str | None = None) -> str:
    """The device a `--device` value means here (None or auto: CUDA if there is one, else the CPU). A CUDA
    device this machine lacks is refused in one line, not by torch's assertion mid-load."""
    import torch

    if value is None or value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not is_device(value):
        raise SpecdecError(f"unknown device {value!r}; use one of {', '.join(DEVICES)} or cuda:N")
    if value.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(value[5:]) if ":" in value else 0
        if index >= count:
            raise SpecdecError(f"device {value}: this machine has {count} CUDA device(s) "
                               f"(torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none'})")
    return value
