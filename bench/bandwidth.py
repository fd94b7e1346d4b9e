"""Memory bandwidth: what this machine can read, and what a decoding run reads of its weights.

Decoding one token reads every weight once, so on a CPU tokens/s is bounded by memory bandwidth
over the weights' size. gpt-fast prints "bandwidth achieved" as weight bytes x tokens/s; the
engine benchmark does the same per strategy (for speculative rows that is an effective figure:
several tokens per read of the weights) beside the bandwidth measured here, on this machine,
at the start of the run.
"""

from __future__ import annotations

import time
from pathlib import Path


def machine_bandwidth(megabytes: int = 256, repeats: int = 5) -> dict:
    """Best of `repeats`: a sum over a `megabytes` buffer (read GB/s) and a copy of it (read + write GB/s)."""
    import torch

    n = megabytes * (1 << 20) // 4
    source = torch.ones(n, dtype=torch.float32)
    target = torch.empty_like(source)
    read = copy = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        source.sum().item()
        read = min(read, time.perf_counter() - start)
        start = time.perf_counter()
        target.copy_(source)
        copy = min(copy, time.perf_counter() - start)
    size = n * 4
    return {"megabytes": megabytes, "repeats": repeats, "read_gbps": size / read / 1e9,
            "copy_gbps": 2 * size / copy / 1e9, "threads": torch.get_num_threads()}


def weight_bytes(model) -> int:
    """Bytes of weights one decoding step reads: every parameter and buffer once (tied ones once), except
    the int4 layers' dense copies, which only a long prefill uses. A native model counts its own."""
    if callable(getattr(model, "nbytes", None)):
        return model.nbytes()
    from specdec.models.int4 import Int4Linear

    skip = {id(m.dense) for m in model.modules() if isinstance(m, Int4Linear) and m.dense is not None}
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in skip or tensor.numel() == 0:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.numel())
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def file_bytes(path: Path) -> int:
    """A GGUF's size: what llama.cpp reads per token, near enough (its metadata is small)."""
    return Path(path).stat().st_size
