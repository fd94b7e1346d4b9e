"""Per-request LoRA adapters on the native draft: y = W x + (x A)(B·scale), a side matmul beside the packed base.

The base stays as its kernels read it (W4A8/W8A8, memory-mapped from the weights cache); an adapter is a pair of
small fp32 factors per Linear it covers, so switching adapters per request is setting another pair on each
Linear (layers.Linear.lora), never a reload or a repack. The transformers draft folds an adapter into its fp32
weights and requantizes (specdec.models.lora, FOLDING); the native draft has no float copy to fold into, and at
the ranks fine-tuning makes (8-16) the side matmul costs a few percent of a draft step.

Adapters are peft's, as `specdec finetune` saves them over the transformers draft: factors named
base_model.model.model.layers.N.{self_attn,mlp}.X_proj.lora_{A,B}.weight, checked by the same rule
(specdec.models.lora.check_adapter) against the native layers' shapes. Q, K and V run as one fused Linear (as do
gate and up) where they share a kernel: an adapter's factors for them become one A (their ranks side by side)
and one block-diagonal B over the fused columns, so a fused call adds one side matmul, not three.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.models.choices import LORA_MODULES
from specdec.native.gguf_weights import Concat
from specdec.native.layers import Linear

PEFT_LAYERS = "base_model.model.model.layers"  # how peft names a Qwen2 decoder layer in a saved adapter
# module -> (its block in peft's name, the fused weight it runs in, its index among that weight's parts)
MODULES = {"q_proj": ("self_attn", "qkv", 0), "k_proj": ("self_attn", "qkv", 1), "v_proj": ("self_attn", "qkv", 2),
           "o_proj": ("self_attn", "o", 0), "gate_proj": ("mlp", "gate_up", 0), "up_proj": ("mlp", "gate_up", 1),
           "down_proj": ("mlp", "down", 0)}


@dataclass(frozen=True)
class Place:
    """Where a LoRA module's output columns sit: columns offset .. offset + out_features - 1 of `linear`."""

    linear: Linear
    offset: int
    in_features: int
    out_features: int


def places(model) -> dict[str, Place]:
    """Every LoRA module of the native model (specdec.native.qwen2.Qwen2), by the name peft gives its factors."""
    c = model.config
    widths = {"qkv": [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim],
              "o": [c.hidden], "gate_up": [c.intermediate, c.intermediate], "down": [c.hidden]}
    found = {}
    for i, layer in enumerate(model.weights.layers):
        for module, (block, field, index) in MODULES.items():
            fused = getattr(layer, field)
            parts = fused.parts if isinstance(fused, Concat) else [fused]
            start, offset = sum(widths[field][:index]), 0
            for part in parts:
                if start < offset + part.out_features:
                    break
                offset += part.out_features
            found[f"{PEFT_LAYERS}.{i}.{block}.{module}"] = Place(part, start - offset, part.in_features,
                                                                 widths[field][index])
    return found


def _pattern(patterns: dict, module: str, default):
    """peft's rank_pattern/alpha_pattern lookup: the first key that names the module or ends its dotted name."""
    name = module.removeprefix("base_model.model.")
    for key, value in (patterns or {}).items():
        if key == name or re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def read_adapter(path: Path, where: dict[str, Place]) -> dict[Linear, tuple[torch.Tensor, torch.Tensor]]:
    """A peft adapter folder as side factors per Linear: (A f32[in, R], B f32[R, out]) with the scaling in B and
    the fused neighbours' factors side by side (module docstring). A one-line SpecdecError for anything that
    would not adapt the draft as peft would (specdec.models.lora.check_adapter, DoRA, LoRA biases)."""
    from safetensors.torch import load_file

    from specdec.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, _LORA_KEY, check_adapter

    path = Path(path)
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"unreadable adapter at {path}: {exc}") from None
    wanted = config.get("target_modules") if isinstance(config, dict) else None
    wanted = [wanted] if isinstance(wanted, str) else list(wanted or [])
    extra = [m for m in wanted if m not in LORA_MODULES]
    if extra:
        raise SpecdecError(f"adapter at {path} targets {extra}, which this draft cannot switch "
                           f"(supported: {', '.join(LORA_MODULES)})")
    if config.get("use_dora") or config.get("lora_bias"):
        raise SpecdecError(f"adapter at {path} is a {'DoRA' if config.get('use_dora') else 'LoRA-with-bias'} "
                           f"adapter; the native draft serves plain LoRA factors")
    check_adapter(path, {name: (p.in_features, p.out_features) for name, p in where.items()})
    weights = load_file(str(path / ADAPTER_WEIGHTS))
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        match = _LORA_KEY.fullmatch(key)
        factors.setdefault(match["module"], {})[match["factor"]] = tensor.float()
    per_linear: dict[Linear, list[tuple[Place, torch.Tensor, torch.Tensor]]] = {}
    for module, pair in factors.items():
        place = where[module]
        rank = pair["A"].shape[0]
        alpha = _pattern(config.get("alpha_pattern"), module, config.get("lora_alpha", 8))
        scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        per_linear.setdefault(place.linear, []).append((place, pair["A"], pair["B"] * scaling))
    out = {}
    for linear, entries in per_linear.items():
        a = torch.cat([factor_a.t() for _, factor_a, _ in entries], 1).contiguous()  # [in, R]
        b = torch.zeros(a.shape[1], linear.out_features)
        row = 0
        for place, factor_a, factor_b in entries:
            rank = factor_a.shape[0]
            b[row : row + rank, place.offset : place.offset + place.out_features] = factor_b.t()
            row += rank
        out[linear] = (a, b)
    return out


class NativeAdapters:
    """The native draft with per-request adapters, as specdec.models.lora.SwitchableDraft is the transformers
    one (the same face to the server: `model`, `activate`, `unload`, `active`): adapters are read once and kept
    (a few MB each at the ranks fine-tuning makes); activating one sets its factors on the Linears it covers and
    clears the others'."""

    def __init__(self, model):
        self.model = model  # specdec.native.lm.NativeModel: what the drafters run
        self.places = places(model.model)
        self.lora_shapes = {name: (p.in_features, p.out_features) for name, p in self.places.items()}
        self.linears = list({id(p.linear): p.linear for p in self.places.values()}.values())
        self.adapters: dict[str, dict[Linear, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.loaded: dict[str, str] = {}  # adapter name -> path
        self.active: str | None = None

    def activate(self, name: str | None, path: Path | None = None) -> bool:
        """Use adapter `name` (read from `path` the first time), or the base draft for None. True when the active
        adapter changed (the draft's KV cache is then stale). A bad adapter raises and leaves the draft as it was."""
        if name == self.active:
            return False
        factors = {}
        if name is not None:
            if name not in self.adapters:
                if path is None:
                    raise SpecdecError(f"adapter {name} is not loaded and no path was given")
                self.adapters[name] = read_adapter(Path(path), self.places)
                self.loaded[name] = str(path)
            factors = self.adapters[name]
        for linear in self.linears:
            linear.lora = factors.get(linear)
        self.active = name
        return True

    def unload(self, name: str) -> bool:
        """Forget a loaded adapter that is not active. False if it was not loaded."""
        if name == self.active:
            raise SpecdecError(f"adapter {name} is in use; activate another before unloading it")
        self.loaded.pop(name, None)
        return self.adapters.pop(name, None) is not None
