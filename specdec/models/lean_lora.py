"""A lean inference forward for peft's LoRA layers, because a draft step is short: overhead shows.

peft's LoRA forward serves every case (mixed-adapter batches, variants, dtype casts,
dropout), and that bookkeeping, paid by every LoRA layer of the draft for each drafted
token, made a draft step with an adapter beside the int8 base markedly slower (figures in
docs/finetuning.md, *Serving an adapter*). Here each layer keeps its active adapters'
factors transposed, with the scaling folded in, and computes base(x) + (x @ A) @ B. peft
still owns the weights and the switching (load_adapter, set_adapter,
disable_adapter_layers): call `use_lean_lora` again after any of them. Inference only: in
training mode, or for anything unusual, a layer falls back to peft's own forward.
"""

from __future__ import annotations

import types


def use_lean_lora(model, folded=frozenset()) -> int:
    """Give every LoRA layer of `model` the lean forward for its current adapter state (just the
    base for the layers in `folded`, whose base already has the adapter folded in); returns how
    many layers got it (the others keep peft's forward)."""
    from peft.tuners.lora.layer import LoraLayer

    lean = 0
    for layer in model.modules():
        if isinstance(layer, LoraLayer):
            layer.__dict__.pop("forward", None)  # back to peft's forward unless the lean one applies
            factors = [] if layer in folded else _factors(layer)
            if factors is not None:
                layer._lean_factors = factors
                layer.forward = types.MethodType(_lean_forward, layer)  # a bound method deep-copies with its layer
                lean += 1
    return lean


def _factors(layer) -> list | None:
    """(A^T, scaling * B^T) per active adapter, or None where only peft's forward will do."""
    if layer.merged:
        return None
    factors = []
    for name in [] if layer.disable_adapters else layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if name in layer.lora_variant or layer.lora_bias.get(name):
            return None  # DoRA and friends, or a bias on B: peft's forward knows them, this one does not
        a = layer.lora_A[name].weight.detach().t()
        b = (layer.lora_B[name].weight.detach() * layer.scaling[name]).t().contiguous()
        factors.append((a, b))
    return factors


def _lean_forward(layer, x, *args, **kwargs):
    if layer.training or kwargs.get("adapter_names") is not None:
        return type(layer).forward(layer, x, *args, **kwargs)
    out = layer.base_layer(x, *args, **kwargs)  # looked up per call: quantize_draft may swap it
    for a, b in layer._lean_factors:
        out = out + ((x.to(a.dtype) @ a) @ b).to(out.dtype)
    return out
