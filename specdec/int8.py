"""A dynamically int8-quantized Linear that peft can still wrap and probe."""

from __future__ import annotations

import warnings

import torch


class Int8Linear(torch.nn.Module):
    """int8 weights, fp32 activations (torch's dynamic quantization, fbgemm on x86).

    torch's quantized Linear exposes `weight` as a method; peft probes `base_layer.weight`
    for device and dtype when it adds an adapter, so this wrapper answers with an empty
    fp32 buffer and LoRA matrices stay fp32 beside the int8 base. The quantized layer is
    kept out of the module tree: peft's non-strict `load_state_dict` of adapter weights
    would otherwise reach it, and torch's quantized modules reject partial state dicts.
    The int8 base is never saved or moved (CPU only).
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notice
            inner = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                           dtype=torch.qint8)[0]
        object.__setattr__(self, "_inner", inner)  # not a registered submodule, see above
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.empty(0, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._inner(x)
