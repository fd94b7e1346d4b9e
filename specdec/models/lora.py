"""A draft model whose per-repository LoRA adapters switch per request, base weights loaded once.

The fp32 draft is wrapped by peft with an empty placeholder adapter on the usual target
modules *before* its base layers are int8-quantized, so later `load_adapter` calls find
LoRA layers to extend and `set_adapter` switches between them. With no adapter active the
LoRA layers are disabled and the draft is the plain base model. The layers run
specdec.lean_lora's forward, not peft's slower general one.

FOLDING: on an int8 base, an adapter is served folded into the fp32 weights and requantized
(int8(W + BA), built once per adapter and kept), not beside the int8 base (int8(W) + BA).
Folded, a draft step costs what the base's does, and for an adapter trained over the int8
base it also agrees with the target more than the same adapter beside the base. That is
worth the memory of keeping the fp32 weights of the quantized layers (figures in
docs/finetuning.md, *Serving an adapter* and *Int8 and adapters*).
"""

from __future__ import annotations

import copy
import json
import math
import re
import warnings
from collections import OrderedDict
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.models.choices import LORA_MODULES
from specdec.models.lean_lora import use_lean_lora

PLACEHOLDER = "specdec-base"
TARGET_MODULES = LORA_MODULES
FOLDED_KEPT = 3  # adapters whose folded int8 layers stay built: each is a full copy of the int8 layers
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_LORA_KEY = re.compile(r"(?P<module>[\w.]+)\.lora_(?P<factor>[AB])\.weight")  # as peft saves them
MAX_RANK = 1024
# The largest entry of an adapter's update scaling * B @ A. A trained adapter's stay well under 1 (the draft's
# weights are O(0.1)); finite factors of 1e30 fold into int8 rows that are the update alone, and the draft's
# activations then overflow: every draft pass fails (fbgemm: "min should be less than or equal to max").
MAX_UPDATE = 1e3


def check_adapter(folder: Path, modules: dict[str, tuple[int, int]] | None = None) -> None:
    """Refuse, with a one-line SpecdecError, an adapter that would break the draft rather than adapt it.

    Its config must name a rank, a finite lora_alpha and target modules; its safetensors must hold only
    LoRA A/B factors of those modules, in pairs, 2-D, of that rank, finite, and each pair's update
    scaling * B @ A within MAX_UPDATE (what folding into int8 survives). With `modules` (LoRA layer
    name -> (in, out) features of the loaded draft) each pair must fit its layer; without it
    (on import, no draft loaded) each kind of module must have one shape throughout. A NaN or
    mis-shaped factor loaded into the draft makes every draft token wrong, or every request
    fail, silently for the user: hence checked on import and again on load.
    """
    import torch
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"unreadable adapter config in {folder}: {exc}") from None
    if not isinstance(config, dict):
        raise SpecdecError(f"{folder}/{ADAPTER_CONFIG} is not a JSON object")
    ranks = {config.get("r"), *(config.get("rank_pattern") or {}).values()}
    if not all(type(r) is int and 0 < r <= MAX_RANK for r in ranks):
        raise SpecdecError(f"adapter at {folder} has an unusable rank {config.get('r')!r}")
    alphas = [config.get("lora_alpha", 8), *(config.get("alpha_pattern") or {}).values()]
    if not all(type(a) in (int, float) and math.isfinite(a) and a >= 0 for a in alphas):
        raise SpecdecError(f"adapter at {folder} has an unusable lora_alpha {config.get('lora_alpha')!r}")
    targets = config.get("target_modules")
    targets = [targets] if isinstance(targets, str) else targets
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise SpecdecError(f"adapter at {folder} names no target modules")
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    factors_of: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(folder / ADAPTER_WEIGHTS), framework="pt") as weights:
            for key in weights.keys():
                match = _LORA_KEY.fullmatch(key)
                if not match or match["module"].rsplit(".", 1)[-1] not in targets:
                    raise SpecdecError(f"adapter at {folder} holds {key!r}, which is no LoRA factor of its "
                                       f"target modules ({', '.join(targets)})")
                tensor = weights.get_tensor(key)
                if not tensor.is_floating_point() or tensor.dim() != 2:
                    raise SpecdecError(f"adapter at {folder}: {key} is not a 2-D float matrix")
                if not bool(torch.isfinite(tensor).all()):
                    raise SpecdecError(f"adapter at {folder}: {key} has NaN or infinite values")
                shapes.setdefault(match["module"], {})[match["factor"]] = tuple(tensor.shape)
                factors_of.setdefault(match["module"], {})[match["factor"]] = tensor
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise SpecdecError(f"unreadable adapter weights in {folder}: {str(exc).splitlines()[0]}") from None
    if not shapes:
        raise SpecdecError(f"adapter at {folder} holds no LoRA weights")
    by_kind: dict[str, tuple[int, int]] = {}
    for module, factors in shapes.items():
        if set(factors) != {"A", "B"}:
            raise SpecdecError(f"adapter at {folder}: {module} has lora_{''.join(factors)} without its pair")
        (rank_a, fan_in), (fan_out, rank_b) = factors["A"], factors["B"]
        if rank_a != rank_b or rank_a not in ranks:
            raise SpecdecError(f"adapter at {folder}: {module} has rank {rank_a}x{rank_b}, config says "
                               f"{config.get('r')}")
        if modules is not None and modules.get(module) != (fan_in, fan_out):
            fits = modules.get(module)
            raise SpecdecError(f"adapter at {folder}: {module} is {fan_in}->{fan_out}, " + (
                f"the draft's layer is {fits[0]}->{fits[1]}" if fits else "no switchable layer of this draft"))
        kind = module.rsplit(".", 1)[-1]
        if by_kind.setdefault(kind, (fan_in, fan_out)) != (fan_in, fan_out):
            raise SpecdecError(f"adapter at {folder}: {kind} layers disagree on their shape")
        scaling = max(alphas) / (math.sqrt(rank_a) if config.get("use_rslora") else rank_a)  # the largest it may be
        peak = update_peak(factors_of[module]["A"], factors_of[module]["B"], scaling)
        if peak > MAX_UPDATE:
            raise SpecdecError(f"adapter at {folder}: {module}'s update reaches {peak:.3g}, beyond what folding "
                               f"into the int8 draft survives (at most {MAX_UPDATE:g})")


def update_peak(a, b, scaling: float) -> float:
    """max |scaling * B @ A| in float64 (factors of 1e30 overflow fp32), A [r, in], B [out, r], or a bound of it
    within MAX_UPDATE: max row norm of B * max column norm of A (Cauchy-Schwarz), no product unless past it."""
    a, b = a.double(), b.double()
    bound = scaling * float(b.norm(dim=1).max()) * float(a.norm(dim=0).max())
    if bound <= MAX_UPDATE:
        return bound
    return scaling * float((b @ a).abs().max())


def ignore_peft_checkpointing_notice() -> None:
    """Call before peft wraps a model. peft (0.21) reads transformers' deprecated `is_gradient_checkpointing` in
    every PeftModel it builds, and transformers (5.24) warns there: peft's own access, which no argument of ours
    avoids. Only that warning is ignored (idempotent: the filter replaces its twin)."""
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                            module=r"transformers\.modeling_utils")


class SwitchableDraft:
    def __init__(self, draft_model, quant: str = "int8", rank: int = 1):
        from peft import LoraConfig, get_peft_model

        from specdec.models.quantize import quantize_draft

        present = {name.rsplit(".", 1)[-1] for name, _ in draft_model.named_modules()}
        self.target_modules = tuple(m for m in TARGET_MODULES if m in present)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(self.target_modules), task_type="CAUSAL_LM")
        swapped: list = []
        ignore_peft_checkpointing_notice()
        self.model = quantize_draft(get_peft_model(draft_model, config, adapter_name=PLACEHOLDER), quant, swapped)
        # LoRA layer -> (its int8 base, the fp32 layer that was quantized): the layers adapters fold into
        self.int8_bases = {parent: (getattr(parent, name), original) for parent, name, original in swapped
                           if name == "base_layer"}
        self.folded: OrderedDict[str, dict] = OrderedDict()  # adapter name -> LoRA layer -> folded int8 base
        self.loaded: dict[str, str] = {}  # adapter name -> path
        self.active: str | None = None
        self.model.base_model.disable_adapter_layers()
        use_lean_lora(self.model)
        from peft.tuners.lora.layer import LoraLayer

        # LoRA layer name -> (in, out) features, as adapter weights name them: what check_adapter fits them to
        self.lora_shapes = {n: (m.in_features, m.out_features) for n, m in self.model.named_modules()
                            if isinstance(m, LoraLayer)}

    def activate(self, name: str | None, path: Path | None = None) -> bool:
        """Use adapter `name` (loading it from `path` the first time), or the base draft for None.

        Returns True when the active adapter changed (the draft's KV cache is then stale).
        """
        if name == self.active:
            return False
        if name is None:
            self.model.base_model.disable_adapter_layers()
            bases = {layer: int8 for layer, (int8, _) in self.int8_bases.items()}
        else:
            if name not in self.loaded:
                if path is None:
                    raise SpecdecError(f"adapter {name} is not loaded and no path was given")
                self._check_modules(path)
                check_adapter(path, self.lora_shapes)
                try:
                    self.model.load_adapter(str(path), adapter_name=name)
                except Exception as exc:  # peft may have added part of it: leave no half-loaded adapter
                    if name in self.model.peft_config:
                        self.model.delete_adapter(name)
                    raise SpecdecError(f"cannot load adapter at {path}: {str(exc).splitlines()[0]}") from None
                self.loaded[name] = str(path)
            try:
                bases = self._folded(name)
            except Exception as exc:  # the draft stays as it was; the adapter is forgotten
                self.unload(name)
                if isinstance(exc, SpecdecError):
                    raise
                raise SpecdecError(f"cannot fold adapter {name} into the int8 draft: "
                                   f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
            self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(name)
        for layer, base in bases.items():
            layer.base_layer = base
        use_lean_lora(self.model, folded=set(bases))  # LoRA factors only where the base has no adapter folded in
        self.active = name
        return True

    def unload(self, name: str) -> bool:
        """Forget a loaded adapter that is not active (its LoRA factors and folded layers): an adapter replaced by a
        newer version, as online adaptation replaces them, would otherwise stay in memory. False if not loaded."""
        if name == self.active:
            raise SpecdecError(f"adapter {name} is in use; activate another before unloading it")
        self.folded.pop(name, None)
        if self.loaded.pop(name, None) is None:
            return False
        self.model.delete_adapter(name)
        return True

    def _folded(self, name: str) -> dict:
        """int8(W + BA) for each int8 layer, built on first use; the least recently used are dropped."""
        import torch

        from specdec.models.int8 import Int8Linear

        if name not in self.folded:
            folded = {}
            for layer, (int8, original) in self.int8_bases.items():
                if name not in layer.lora_A:  # a module this adapter leaves alone
                    folded[layer] = int8
                    continue
                linear = copy.deepcopy(original)
                with torch.no_grad():
                    linear.weight += layer.get_delta_weight(name).to(linear.weight.dtype)
                if not bool(torch.isfinite(linear.weight).all()):
                    raise SpecdecError(f"adapter {name} makes non-finite weights when folded into the int8 draft")
                folded[layer] = Int8Linear(linear)
            self.folded[name] = folded
        self.folded.move_to_end(name)
        while len(self.folded) > FOLDED_KEPT:
            self.folded.popitem(last=False)
        return self.folded[name]

    def _check_modules(self, path: Path) -> None:
        try:
            wanted = json.loads((Path(path) / "adapter_config.json").read_text()).get("target_modules") or []
        except (OSError, ValueError) as exc:
            raise SpecdecError(f"unreadable adapter at {path}: {exc}") from None
        wanted = [wanted] if isinstance(wanted, str) else list(wanted)
        extra = [m for m in wanted if m not in self.target_modules]
        if extra:
            raise SpecdecError(f"adapter at {path} targets {extra}, which this draft cannot switch "
                               f"(supported: {', '.join(self.target_modules)})")


def apply_adapter(model, adapter_dir: str):
    """A peft LoRA adapter folded into the draft's full-precision weights, before any quantization,
    as the server serves it (specdec.models.lora): see FOLDING there for why folded beats beside."""
    from peft import PeftModel

    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        raise SpecdecError(f"{adapter_dir} is not a LoRA adapter (no adapter_config.json)")
    ignore_peft_checkpointing_notice()
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
