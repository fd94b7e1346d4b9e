"""A stored state's checksum, what a cache's loader compares with what it read back (weights_cache, int4_cache).

Why: a cache file's tensors are memory-mapped and used as they are, so a flipped byte on disk was different logits
on every later start, silently; torch's zip reader checks no CRC. CRC-32 (zlib) over every tensor's dtype, shape
and bytes and every other value, in order: the fastest of the hashes measured over a 1.1 GB state (the 1.5B
target's native cache: docs/benchmarks.md, *The weights cache's checksum*); an accidental change of any size goes
unnoticed with probability 2^-32, one of 32 bits or fewer never.
"""

from __future__ import annotations

import zlib

import torch

CHUNK = 1 << 24  # bytes handed to zlib at a time (it lets the GIL go for each)


def state_checksum(state) -> str:
    """The checksum (8 hex digits) of a state: nested dicts, lists and tuples of tensors and plain values."""
    crc = 0

    def text(value: str) -> None:
        nonlocal crc
        data = value.encode()
        crc = zlib.crc32(data, zlib.crc32(f"{len(data)}:".encode(), crc))

    def walk(value) -> None:
        nonlocal crc
        if isinstance(value, torch.Tensor):
            text(f"tensor {value.dtype} {tuple(value.shape)}")
            raw = memoryview(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
            for start in range(0, len(raw), CHUNK):
                crc = zlib.crc32(raw[start : start + CHUNK], crc)
        elif isinstance(value, dict):
            text(f"dict {len(value)}")
            for key in sorted(value, key=str):
                walk(key)
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            text(f"{type(value).__name__} {len(value)}")
            for item in value:
                walk(item)
        else:
            text(f"{type(value).__name__} {value!r}")

    walk(state)
    return f"{crc:08x}"
