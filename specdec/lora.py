"""A draft model whose per-repository LoRA adapters switch per request, base weights loaded once.

The fp32 draft is wrapped by peft with an empty placeholder adapter on the usual target
modules *before* its base layers are int8-quantized, so later `load_adapter` calls find
LoRA layers to extend and `set_adapter` switches in microseconds. With no adapter active
the LoRA layers are disabled and the draft is the plain base model.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.errors import SpecdecError

PLACEHOLDER = "specdec-base"
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class SwitchableDraft:
    def __init__(self, draft_model, quant: str = "int8", rank: int = 1):
        from peft import LoraConfig, get_peft_model

        from specdec.models import quantize_draft

        present = {name.rsplit(".", 1)[-1] for name, _ in draft_model.named_modules()}
        self.target_modules = tuple(m for m in TARGET_MODULES if m in present)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(self.target_modules), task_type="CAUSAL_LM")
        self.model = quantize_draft(get_peft_model(draft_model, config, adapter_name=PLACEHOLDER), quant)
        self.loaded: dict[str, str] = {}  # adapter name -> path
        self.active: str | None = None
        self.model.base_model.disable_adapter_layers()

    def activate(self, name: str | None, path: Path | None = None) -> bool:
        """Use adapter `name` (loading it from `path` the first time), or the base draft for None.

        Returns True when the active adapter changed (the draft's KV cache is then stale).
        """
        if name == self.active:
            return False
        if name is None:
            self.model.base_model.disable_adapter_layers()
        else:
            if name not in self.loaded:
                if path is None:
                    raise SpecdecError(f"adapter {name} is not loaded and no path was given")
                self._check_modules(path)
                self.model.load_adapter(str(path), adapter_name=name)
                self.loaded[name] = str(path)
            self.model.base_model.enable_adapter_layers()
            self.model.set_adapter(name)
        self.active = name
        return True

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
