"""A draft model whose per-repository LoRA adapters switch per request, base weights loaded once.

The fp32 draft is wrapped by peft with an empty placeholder adapter on the usual target
modules *before* its base layers are int8-quantized, so later `load_adapter` calls find
LoRA layers to extend and `set_adapter` switches between them. With no adapter active the
LoRA layers are disabled and the draft is the plain base model. The layers run
specdec.lean_lora's forward, not peft's slower general one.

FOLDING: on an int8 base, an adapter is served folded into the fp32 weights and requantized
(int8(W + BA), built once per adapter and kept), not beside the int8 base (int8(W) + BA). On
this CPU that is both faster and closer to the target, for an adapter trained over the int8
base: on the 99-hole pygments screen (fixed k = 4, teacher-forced) base 0.425, beside 0.554,
folded 0.574; a draft step after a 300-token prompt 35 ms base or folded, 42 ms beside. So
the fp32 weights of the quantized layers are kept (1.4 GB for the 0.5B draft).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.lean_lora import use_lean_lora

PLACEHOLDER = "specdec-base"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FOLDED_KEPT = 3  # adapters whose folded int8 layers stay built (about 360 MB each for the 0.5B draft)


class SwitchableDraft:
    def __init__(self, draft_model, quant: str = "int8", rank: int = 1):
        from peft import LoraConfig, get_peft_model

        from specdec.models import quantize_draft

        present = {name.rsplit(".", 1)[-1] for name, _ in draft_model.named_modules()}
        self.target_modules = tuple(m for m in TARGET_MODULES if m in present)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(self.target_modules), task_type="CAUSAL_LM")
        swapped: list = []
        self.model = quantize_draft(get_peft_model(draft_model, config, adapter_name=PLACEHOLDER), quant, swapped)
        # LoRA layer -> (its int8 base, the fp32 layer that was quantized): the layers adapters fold into
        self.int8_bases = {parent: (getattr(parent, name), original) for parent, name, original in swapped
                           if name == "base_layer"}
        self.folded: OrderedDict[str, dict] = OrderedDict()  # adapter name -> LoRA layer -> folded int8 base
        self.loaded: dict[str, str] = {}  # adapter name -> path
        self.active: str | None = None
        self.model.base_model.disable_adapter_layers()
        use_lean_lora(self.model)

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
                self.model.load_adapter(str(path), adapter_name=name)
                self.loaded[name] = str(path)
            self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(name)
            bases = self._folded(name)
        for layer, base in bases.items():
            layer.base_layer = base
        use_lean_lora(self.model, folded=set(bases))  # LoRA factors only where the base has no adapter folded in
        self.active = name
        return True

    def _folded(self, name: str) -> dict:
        """int8(W + BA) for each int8 layer, built on first use; the least recently used are dropped."""
        import torch

        from specdec.int8 import Int8Linear

        if name not in self.folded:
            folded = {}
            for layer, (int8, original) in self.int8_bases.items():
                if name not in layer.lora_A:  # a module this adapter leaves alone
                    folded[layer] = int8
                    continue
                linear = copy.deepcopy(original)
                with torch.no_grad():
                    linear.weight += layer.get_delta_weight(name).to(linear.weight.dtype)
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
