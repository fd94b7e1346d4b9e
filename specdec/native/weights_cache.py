"""The native weights kept on disk as their kernels read them, so a start maps them instead of converting the GGUF.

Converting is most of a native start (a minute for the 1.5B on a busy 2-core machine: unpacking and repacking
the Q4_K codes, dequantizing and rounding the Q6_K tensors to int8). The result depends only on the GGUF's
content (specdec.models.file_digest), the kernels' packed layouts, this format and torch; those make the key
stored in the file, and a file whose key differs is stale and rebuilt in place. Files are written aside and
renamed into place; a file that does not read back, or whose content differs from its checksum
(specdec.models.checksum: a flipped byte), is a warning and a rebuild, a cache that cannot be written a log line:
never a failed load. Tensors are memory-mapped (torch.load with mmap), so the page cache shares them
between processes. The token embedding is not stored: it stays in the GGUF (gguf_weights.Embedding).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from specdec.file_lock import turn
from specdec.models import w4a8
from specdec.models.checksum import state_checksum
from specdec.models.file_digest import content_digest
from specdec.native.gguf_weights import Concat, Embedding, LayerWeights, Qwen2Config, Qwen2Weights, read_qwen2
from specdec.native.layers import Linear
from specdec.paths import quantized_dir

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # bump when what a stored entry means changes (2: a checksum of the content)
INT4_ROUNDING = "int4_groups v1"  # what an int4 file's rounding is (gguf_codes.int4_groups): in its key


def cache_key(gguf: Path, int4: bool = False) -> dict:
    key = {"format": CACHE_FORMAT, "layout": f"{w4a8.PACK_LAYOUT}; {w4a8.PACK8_LAYOUT}", "torch": torch.__version__,
           "gguf": {"size": gguf.stat().st_size, "sha256": content_digest(gguf)}}
    return {**key, "int4": INT4_ROUNDING} if int4 else key


def cache_path(gguf: Path, int4: bool = False) -> Path:
    """One file per GGUF path and form (int8 or int4 beside the Q4_K codes): a changed GGUF overwrites its file
    instead of adding one. native-<GGUF stem>-<hash>.pt either way, as specdec.models.cache_inventory reads it."""
    name = hashlib.sha256(f"{gguf.resolve()}{':int4' if int4 else ''}".encode()).hexdigest()[:12]
    return quantized_dir() / f"native-{gguf.stem}-{name}.pt"


def read_qwen2_cached(gguf: Path | str, int4: bool = False) -> Qwen2Weights:
    """gguf_weights.read_qwen2, from the cache when it holds this GGUF's conversion (int4: read_qwen2's int4
    form, a file of its own)."""
    gguf = Path(gguf)
    key = json.dumps(cache_key(gguf, int4), sort_keys=True)
    try:
        path = cache_path(gguf, int4)
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("specdec: cannot use the native weights cache folder (%s); converting the GGUF", _first_line(exc))
        return read_qwen2(gguf, int4=int4)
    seen = _stamp(path)
    weights = _stored(path, key, gguf, say=True)
    if weights is not None:
        return weights
    with turn(path):  # one conversion at a time: a process that waited here maps the file the other one wrote
        if _stamp(path) != seen:
            weights = _stored(path, key, gguf, say=False)
            if weights is not None:
                return weights
        weights = read_qwen2(gguf, int4=int4)
        try:
            save(weights, path, key)
        except Exception as exc:  # noqa: BLE001 - a full disk, a read-only folder...
            log.warning("specdec: cannot write the native weights cache %s (%s); the next start converts again", path,
                        _first_line(exc))
    return weights


def _stored(path: Path, key: str, gguf: Path, say: bool) -> Qwen2Weights | None:
    """The file's weights; None where there is no file, it is stale, or it does not read back (a warning, if say)."""
    if not path.is_file():
        return None
    try:
        return load(path, key, gguf)
    except Exception as exc:  # noqa: BLE001 - anything at all: a cache must never fail a load
        if say:
            warnings.warn(f"specdec: native weights cache {path} is unreadable ({type(exc).__name__}: "
                          f"{_first_line(exc)}); rebuilding it", RuntimeWarning, stacklevel=3)
        return None


def _stamp(path: Path) -> tuple | None:
    """Which file is at path (None: none), to tell whether another process replaced it meanwhile."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def holds(gguf: Path | str, int4: bool | None = None) -> bool:
    """Whether the cache holds this GGUF's conversion (its key matches; int4 None: in either form): the GGUF was a
    model the native forward runs, so a start need not parse its metadata again (gguf's reader takes seconds over
    a 150k-token vocabulary)."""
    gguf = Path(gguf)
    if int4 is None:
        return holds(gguf, False) or holds(gguf, True)
    try:
        path = cache_path(gguf, int4)
        if not path.is_file():
            return False
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        return saved.get("key") == json.dumps(cache_key(gguf, int4), sort_keys=True)
    except Exception:  # noqa: BLE001 - an unreadable cache holds nothing
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _linear(linear: Linear) -> dict:
    return {"kernel": linear.kernel, "out": linear.out_features, "in": linear.in_features, "packed": linear.packed,
            "scale": linear.scale, "weight": linear.weight, "bias": linear.bias}


def _unlinear(entry: dict) -> Linear:
    kernel, out, inp = entry["kernel"], entry["out"], entry["in"]
    expected = {"w4a8": w4a8.packed_bytes(out, inp), "w8a8": out * inp}.get(kernel)
    if expected is None or not isinstance(entry["packed"], torch.Tensor) or entry["packed"].numel() != expected:
        raise ValueError(f"a stored {kernel} {out}x{inp} weight does not match its kernel's layout")
    return Linear(kernel, out, inp, packed=entry["packed"], scale=entry["scale"], bias=entry["bias"])


def save(weights: Qwen2Weights, path: Path, key: str) -> None:
    """Every matrix as packed, every vector, the embedding's place in the GGUF, with the key; atomically."""
    e = weights.embedding
    state = {
        "key": key, "config": asdict(weights.config),
        "embedding": {"offset": e.offset, "qtype": e.qtype.name, "rows": e.rows, "width": e.width},
        "layers": [{"attn_norm": layer.attn_norm, "ffn_norm": layer.ffn_norm, "qkv_bias": layer.qkv_bias,
                    "qkv": [_linear(p) for p in layer.qkv.parts], "o": _linear(layer.o),
                    "gate_up": [_linear(p) for p in layer.gate_up.parts], "down": _linear(layer.down)}
                   for layer in weights.layers],
        "output_norm": weights.output_norm, "output": _linear(weights.output)}
    state["checksum"] = state_checksum(state)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path, key: str, gguf: Path) -> Qwen2Weights | None:
    """The stored weights, or None when the file is stale (another key). Raises on a file that does not read back
    or whose content is not what was written (its checksum)."""
    saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    if saved.get("key") != key:
        return None
    if saved.get("checksum") != state_checksum({name: v for name, v in saved.items() if name != "checksum"}):
        raise ValueError("its content does not match its checksum: damaged on disk")
    config = Qwen2Config(**saved["config"])
    if len(saved["layers"]) != config.layers:
        raise ValueError(f"holds {len(saved['layers'])} layers, the config says {config.layers}")
    layers = [LayerWeights(attn_norm=entry["attn_norm"], qkv=Concat([_unlinear(p) for p in entry["qkv"]]),
                           qkv_bias=entry["qkv_bias"], o=_unlinear(entry["o"]), ffn_norm=entry["ffn_norm"],
                           gate_up=Concat([_unlinear(p) for p in entry["gate_up"]]), down=_unlinear(entry["down"]))
              for entry in saved["layers"]]
    e = saved["embedding"]
    embedding = Embedding(gguf, e["offset"], e["qtype"], e["rows"], e["width"])
    return Qwen2Weights(config, embedding, layers, saved["output_norm"], _unlinear(saved["output"]), gguf)
