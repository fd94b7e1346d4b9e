"""The int4 target's converted layers kept on disk, so a start loads them instead of converting again.

Converting is most of an int4 start: parsing the GGUF's metadata, unpacking the Q4_K codes,
repacking them into the int4 kernel's layout, dequantizing the dense prefill copy, rounding the
Q6_K tensors to int8. Its result depends only on the GGUF, the loaded weights (a Linear the GGUF
lacks is quantized from them; both files told apart by content), the TargetQuantConfig with its
kernel resolved ("auto" becomes "aten" or "w4a8": each kernel has its own packed layout and its own file, so a cache written for
one is never served to the other), the dtype, torch (which owns ATen's layout), the kernel's
layout and this code's format; those make the key stored in the file. Each kernel's packed weight
is stored as it runs, not the kernel-neutral codes: a start then maps the file and packs nothing. A file whose key differs
is stale and rebuilt in place. Files are written aside and renamed into place, so a reader never
sees half of one; a file that does not read back (truncated, damaged, not ours) or whose content differs from
its checksum (specdec.models.checksum: a flipped byte) is a warning and a rebuild, never a failed load; one that cannot be written (a full disk, a read-only folder) is
one line in the log and a start served without it. The layers' buffers are memory-mapped from the file (torch.load
with mmap), so a start copies nothing and the page cache shares them between processes; torch's
format aligns every tensor to 64 bytes, which ATen's int8 kernel needs (safetensors packs tensors
back to back, and a misaligned int8 weight crashes `_weight_int8pack_mm`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specdec.models import w4a8
from specdec.models.checksum import state_checksum
from specdec.models.file_digest import content_digest
from specdec.models.gguf_codes import GROUP
from specdec.models.int4 import (
    Int4Linear,
    Int8ChannelLinear,
    TargetQuantConfig,
    int8_kernel_fitting,
    int8_kernel_for,
    quantize_target,
    resolve_kernel,
)
from specdec.paths import quantized_dir

log = logging.getLogger("specdec.models")

CACHE_FORMAT = 4  # bump when what a cached layer's buffers mean changes (2: per int4 kernel, 3: int8 kernels,
# 4: a checksum of the content)
INT8_LAYOUTS = {  # what an int8 layer's buffers are, per int8 kernel (int8_kernel_for the int4 one)
    "aten": "aten._weight_int8pack_mm codes [out,in] scale [out]",
    "w8a8": f"specdec.models.w4a8.pack8 {w4a8.PACK8_LAYOUT}",
}
INT4_LAYOUTS = {  # what an int4 layer's packed buffers are, per resolved kernel
    "aten": f"aten._convert_weight_to_int4pack_for_cpu innerKTiles=1 group={GROUP}, scales_and_zeros [groups,out,2]",
    "w4a8": f"specdec.models.w4a8.pack {w4a8.PACK_LAYOUT}",
}


def file_identity(path: Path) -> dict:
    """Which file, by its content (specdec.models.file_digest: header, first MB of data, samples, size), not its
    path and mtime: a GGUF of the same size copied over with its mtime kept (`cp -p`) is another file. A file
    cached under the old path/size/mtime key is simply stale."""
    return {"size": path.stat().st_size, "sha256": content_digest(path)}


def _resolved(config: TargetQuantConfig) -> TargetQuantConfig:
    """The config with the kernel the layers will run: "auto" never names a cache file."""
    return replace(config, kernel=resolve_kernel(config.kernel))


def cache_key(gguf: Path, weights: list[Path], config: TargetQuantConfig, dtype: torch.dtype) -> dict:
    config = _resolved(config)
    layout = f"{INT4_LAYOUTS[config.kernel]}; {INT8_LAYOUTS[int8_kernel_for(config.kernel)]}"
    return {"format": CACHE_FORMAT, "layout": layout, "torch": torch.__version__, "gguf": file_identity(gguf),
            "weights": [file_identity(w) for w in sorted(weights)], "config": asdict(config), "dtype": str(dtype)}


def cache_path(gguf: Path, config: TargetQuantConfig, dtype: torch.dtype) -> Path:
    """One file per (GGUF, config with its kernels resolved, dtype): a new torch or a changed GGUF overwrites
    it instead of adding one; the two int4 kernels (and the int8 kernel beside each) have a file each."""
    config = _resolved(config)
    parts = [str(gguf.resolve()), asdict(config), str(dtype)]
    if config.kernel == "w4a8" and int8_kernel_for(config.kernel) == "aten":  # SPECDEC_W8A8=0: a file of its own
        parts.append("int8:aten")
    name = json.dumps(parts, sort_keys=True)
    return quantized_dir() / f"{gguf.stem}-{hashlib.sha256(name.encode()).hexdigest()[:12]}.pt"


def quantize_target_cached(model, config: TargetQuantConfig, gguf: Path | str | None,
                           dtype: torch.dtype = torch.bfloat16, weights: list[Path] = ()) -> dict[str, int]:
    """int4.quantize_target, loading its result from the cache when the cache holds it for this key.

    weights: the files the model was loaded from (their identity joins the key). Only int4 with
    a GGUF is cached: the other modes convert in seconds.
    """
    if config.mode != "int4" or gguf is None:
        return quantize_target(model, config, gguf, dtype)
    gguf = Path(gguf)
    config = _resolved(config)  # one kernel decides the key, the file and the conversion
    key = cache_key(gguf, list(weights), config, dtype)
    try:
        path = cache_path(gguf, config, dtype)
    except OSError as exc:  # the cache folder cannot even be made (a read-only or full cache dir)
        log.warning("specdec: cannot use the int4 cache folder (%s); serving without the cache", _first_line(exc))
        return quantize_target(model, config, gguf, dtype)
    if path.is_file():
        try:
            counts = load_layers(model, path, key, dtype)
        except Exception as exc:  # noqa: BLE001 - anything at all: a cache must never fail a load
            warnings.warn(f"specdec: int4 cache {path} is unreadable ({type(exc).__name__}: "
                          f"{_first_line(exc)}); rebuilding it", RuntimeWarning, stacklevel=2)
            counts = None
        if counts is not None:
            return counts
    counts = quantize_target(model, config, gguf, dtype)
    try:
        save_layers(model, path, key, counts)
    except Exception as exc:  # noqa: BLE001 - a full disk (torch.save raises RuntimeError), a read-only folder...
        log.warning("specdec: cannot write the int4 cache %s (%s); serving without it, the next start converts "
                    "again", path, _first_line(exc))
    return counts


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _layers(model) -> dict[str, torch.nn.Module]:
    """Every layer quantize_target decides on: its int4/int8 layers and the Linear layers it left dense."""
    kinds = (Int4Linear, Int8ChannelLinear, torch.nn.Linear)
    return {name: module for name, module in model.named_modules() if type(module) in kinds}


def _kind(module) -> str:
    return {Int4Linear: "int4", Int8ChannelLinear: "int8", torch.nn.Linear: "dense"}[type(module)]


def save_layers(model, path: Path, key: dict, counts: dict[str, int]) -> None:
    """Write every quantized layer's buffers (and the dense layers' weights) with the key, atomically."""
    tensors, layers = {}, {}
    for name, module in _layers(model).items():
        kind = _kind(module)
        layers[name] = {"kind": kind, "in": module.in_features, "out": module.out_features}
        if kind in ("int4", "int8"):
            layers[name]["kernel"] = module.kernel
        state = {"weight": module.weight.detach()} if kind == "dense" else module.state_dict()
        if kind == "dense" and module.bias is not None:
            state["bias"] = module.bias.detach()
        for buffer, tensor in state.items():
            tensors[f"{name}.{buffer}"] = tensor.contiguous()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        state = {"key": json.dumps(key, sort_keys=True), "layers": layers, "counts": counts, "tensors": tensors}
        torch.save({**state, "checksum": state_checksum(state)}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _take(stored: dict, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    found = stored.get(name)
    if not isinstance(found, torch.Tensor) or tuple(found.shape) != shape or found.dtype != dtype:
        what = f"{tuple(found.shape)} {found.dtype}" if isinstance(found, torch.Tensor) else "missing"
        raise ValueError(f"{name}: {what}, expected {shape} {dtype}")
    return found


def load_layers(model, path: Path, key: dict, dtype: torch.dtype) -> dict[str, int] | None:
    """Swap the model's Linear layers for the cached ones; None (model untouched) if the file is stale.

    Every layer is read and checked against the model before the first swap, so a file that
    fails halfway leaves the model as it was loaded. Raises on a file that does not read back.
    """
    saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    if saved.get("key") != json.dumps(key, sort_keys=True):
        return None
    if saved.get("checksum") != state_checksum({name: v for name, v in saved.items() if name != "checksum"}):
        raise ValueError("its content does not match its checksum: damaged on disk")
    layers, counts, stored = saved["layers"], saved["counts"], saved["tensors"]
    config = TargetQuantConfig(**key["config"])
    current = _layers(model)
    if set(current) != set(layers):
        raise ValueError(f"holds layers {sorted(set(layers) ^ set(current))[:3]}... the model does not match")
    built = {}
    for name, module in current.items():
        entry = layers[name]
        out, inp = module.out_features, module.in_features
        if type(module) is not torch.nn.Linear or (entry["out"], entry["in"]) != (out, inp):
            raise ValueError(f"{name}: cached as {entry}, the model has {type(module).__name__} {out}x{inp}")
        bias = None if module.bias is None else _take(stored, f"{name}.bias", (out,), dtype)
        if entry["kind"] == "int4":
            if entry.get("kernel") != config.kernel:
                raise ValueError(f"{name}: packed for the {entry.get('kernel')!r} kernel, the key says {config.kernel!r}")
            if config.kernel == "w4a8":
                state = {"packed": _take(stored, f"{name}.packed", (w4a8.packed_bytes(out, inp),), torch.uint8)}
            else:
                state = {"packed": _take(stored, f"{name}.packed", (out, inp // 2), torch.uint8),
                         "scales_and_zeros": _take(stored, f"{name}.scales_and_zeros", (inp // GROUP, out, 2), dtype)}
            state.update(bias=bias, dense=None)
            if config.dense_rows > 0:
                state["dense"] = _take(stored, f"{name}.dense", (out, inp), dtype)
            built[name] = Int4Linear.from_state(state, inp, out, config.dense_rows, dtype, config.kernel)
        elif entry["kind"] == "int8":
            kernel = int8_kernel_fitting(int8_kernel_for(config.kernel), out, inp)
            if entry.get("kernel") != kernel:
                raise ValueError(f"{name}: stored for the {entry.get('kernel')!r} int8 kernel, the key says {kernel!r}")
            if kernel == "w8a8":
                state = {"packed": _take(stored, f"{name}.packed", (out * inp,), torch.uint8),
                         "scale": _take(stored, f"{name}.scale", (out,), torch.float32)}
            else:
                state = {"codes": _take(stored, f"{name}.codes", (out, inp), torch.int8),
                         "scale": _take(stored, f"{name}.scale", (out,), dtype)}
            built[name] = Int8ChannelLinear.from_state({**state, "bias": bias}, inp, out, dtype, kernel)
        elif entry["kind"] == "dense":
            built[name] = (_take(stored, f"{name}.weight", (out, inp), dtype), bias)
        else:
            raise ValueError(f"{name}: unknown kind {entry['kind']!r}")
    model.to(dtype)  # what quantize_target does first: norms, embeddings, attention
    for name, layer in built.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        if isinstance(layer, tuple):  # left dense (config.other == "bf16"): the weight as quantize_target set it
            module = getattr(parent, child)
            module.weight.data = layer[0]
            if layer[1] is not None:
                module.bias.data = layer[1]
        else:
            setattr(parent, child, layer)
    return counts
