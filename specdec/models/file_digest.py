"""A weights file (GGUF, safetensors) told apart by its content, cheaply: what a cache of its conversion is keyed by.

Path, size and mtime are not enough: `cp -p`, `rsync -a` and `tar -x` put another file of the same size
in place with the old mtime kept. Hashing a whole 1 GB GGUF would cost a second of every start, so the
digest covers what tells two model files apart, at a few MB read whatever the file's size:
- the header: every tensor's name, type, shape and offset and the metadata (a GGUF's key/value section
  and tensor infos, a safetensors' JSON header), read whole;
- the first MB of tensor data;
- SAMPLES blocks of SAMPLE_BYTES spread evenly over the rest, the last byte included (a fine-tune of the
  same model changes its layers throughout, not only at the front);
- the size.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from pathlib import Path

DATA_HEAD_BYTES = 1 << 20  # tensor data hashed whole from its start
SAMPLES = 64
SAMPLE_BYTES = 4096
FALLBACK_HEADER_BYTES = 16 << 20  # a file whose header cannot be parsed: its first 16 MB stand for the header

_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4


def content_digest(path: Path) -> str:
    """sha256 (hex) of the file's header, first MB of data, sampled blocks of the rest and size."""
    path = Path(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size == 0:
            return hashlib.sha256(b"size 0").hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            header_end = data_offset(data)
            if header_end is None or header_end > size:
                header_end = min(size, FALLBACK_HEADER_BYTES)
            digest = hashlib.sha256(f"size {size}\n".encode())
            head_end = min(size, header_end + DATA_HEAD_BYTES)
            digest.update(data[:head_end])
            rest = size - head_end
            block = min(SAMPLE_BYTES, rest)
            for i in range(SAMPLES if rest > 0 else 0):  # the first at head_end, the last ending at the file's end
                start = head_end + (rest - block) * i // (SAMPLES - 1)
                digest.update(data[start:start + block])
            return digest.hexdigest()


def data_offset(data) -> int | None:
    """Where the tensor data starts in a GGUF or safetensors file (bytes-like), or None for neither / damaged."""
    try:
        if data[:4] == b"GGUF":
            return _gguf_data_offset(data)
        if len(data) >= 8:
            (length,) = struct.unpack_from("<Q", data, 0)
            if 0 < length <= len(data) - 8 and data[8:9] == b"{":
                return 8 + length
    except (struct.error, ValueError, IndexError, RecursionError):
        pass
    return None


def _gguf_data_offset(data) -> int | None:
    """GGUF v2/v3: magic, version, tensor count, key/value count, key/values, tensor infos, padding to alignment."""
    version, tensors, kvs = struct.unpack_from("<IQQ", data, 4)
    if version < 2:
        return None
    pos, alignment = 24, 32
    for _ in range(kvs):
        key, pos = _string(data, pos)
        (kind,), pos = struct.unpack_from("<I", data, pos), pos + 4
        if key == b"general.alignment" and kind == _GGUF_UINT32:
            (alignment,) = struct.unpack_from("<I", data, pos)
        pos = _skip_value(data, pos, kind)
    for _ in range(tensors):
        _, pos = _string(data, pos)
        (dims,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * dims + 4 + 8  # dims, type, offset
    if pos > len(data) or alignment <= 0:
        return None
    return (pos + alignment - 1) // alignment * alignment


def _string(data, pos: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", data, pos)
    end = pos + 8 + length
    if end > len(data):
        raise ValueError("string past the end")
    return data[pos + 8:end], end


def _skip_value(data, pos: int, kind: int) -> int:
    if kind in _GGUF_SCALARS:
        return pos + _GGUF_SCALARS[kind]
    if kind == _GGUF_STRING:
        (length,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + length
    if kind != _GGUF_ARRAY:
        raise ValueError(f"unknown GGUF value type {kind}")
    item, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if item in _GGUF_SCALARS:
        return pos + count * _GGUF_SCALARS[item]
    if item == _GGUF_STRING:  # the vocabulary and merges: hundreds of thousands of strings
        unpack, end = struct.Struct("<Q").unpack_from, len(data)
        for _ in range(count):
            pos += 8 + unpack(data, pos)[0]
            if pos > end:
                raise ValueError("array past the end")
        return pos
    for _ in range(count):
        pos = _skip_value(data, pos, item)
    return pos
