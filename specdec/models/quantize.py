"""Swapping a loaded model's Linear layers for quantized ones: the draft's int8, the target's int4/int8."""

from __future__ import annotations

from specdec.errors import SpecdecError
from specdec.models.choices import DRAFT_QUANT, INT4_KERNELS, KEPT_FP32, TARGET_QUANT
from specdec.models.store import made_from_gguf, target_gguf


def quantize_draft(model, mode: str = "int8", originals: list | None = None):
    """int8 dynamic quantization of the draft's Linear layers (CPU), LoRA layers excepted.

    Only the draft: it may be anything, since the acceptance rule makes the output the
    target's; what it buys is a faster draft step, what it costs is agreement (see KEPT_FP32).
    LoRA A/B matrices stay fp32, so a peft-wrapped draft keeps loading and switching adapters.
    `originals`, if given, receives swap_int8's (parent, name, fp32 layer) for each swapped layer.
    """
    if mode not in DRAFT_QUANT:
        raise SpecdecError(f"unknown draft quantization {mode!r}; use one of {', '.join(DRAFT_QUANT)}")
    if mode == "none" or next(model.parameters()).device.type != "cpu":
        return model
    swapped = swap_int8(model.float(), mode)
    if originals is not None:
        originals.extend(swapped)
    return model


def swap_int8(model, mode: str = "int8") -> list[tuple[object, str, object]]:
    """Replace the Linear layers `mode` quantizes by Int8Linear in place (LoRA layers and
    KEPT_FP32[mode] excepted); returns (parent, name, original) for each, so training can put
    the originals back after fitting an adapter over the int8 base."""
    import torch

    from specdec.models.int8 import Int8Linear

    swapped = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            parts = f"{path}.{name}".split(".")  # peft puts the base under <module>.base_layer
            if type(child) is torch.nn.Linear and not any(p.startswith("lora_") or p in KEPT_FP32[mode] for p in parts):
                setattr(parent, name, Int8Linear(child))
                swapped.append((parent, name, child))
    return swapped


def resolve_target_quant(mode: str, target) -> str:
    """The TARGET_MODES entry `mode` means for this loaded target. auto is int4 where the target
    has published Q4_K codes (a catalog model's Q4_K_M, a .gguf, a conversion that remembers
    its GGUF) and runs on CPU: the served target is then the model people download, and its step
    reads a third of bf16's bytes. Anywhere else auto is none: PyTorch's int4 kernels are CPU
    ones, and re-rounding someone's float checkpoint is a quality change they did not ask for."""
    if mode not in TARGET_QUANT:
        raise SpecdecError(f"unknown target quantization {mode!r}; use one of {', '.join(TARGET_QUANT)}")
    if mode != "auto":
        return mode
    on_cpu = next(target.model.parameters()).device.type == "cpu"
    return "int4" if on_cpu and made_from_gguf(target.spec, target.path) else "none"


def quantize_target(target, mode: str, dtype: str = "auto", int4_kernel: str = "auto") -> str:
    """Swap a loaded target's (specdec.models.loading.LoadedModel) Linear layers for int4/int8 ones in place
    (CPU); `none` leaves it as loaded, `auto` is resolve_target_quant's choice. int4_kernel: one of
    INT4_KERNELS (specdec.models.int4.resolve_kernel). An int4 target's layers come from the cache (one file
    per resolved kernel) after the first start. Returns the mode applied (one of TARGET_MODES)."""
    mode = resolve_target_quant(mode, target)
    if int4_kernel not in INT4_KERNELS:
        raise SpecdecError(f"unknown int4 kernel {int4_kernel!r}; use one of {', '.join(INT4_KERNELS)}")
    if mode == "none":
        return mode
    if next(target.model.parameters()).device.type != "cpu":
        raise SpecdecError(f"--target-quant {mode} runs PyTorch's CPU kernels; use none on {target.model.device}")
    from specdec.hardware import torch_dtype
    from specdec.models.int4 import TargetQuantConfig
    from specdec.models.int4_cache import quantize_target_cached

    gguf = target_gguf(target.spec) if mode == "int4" else None
    weights = list(target.path.resolve().glob("*.safetensors"))  # a Linear the GGUF lacks comes from these
    quantize_target_cached(target.model, TargetQuantConfig(mode, kernel=int4_kernel), gguf, torch_dtype(dtype),
                           weights)
    return mode
