"""The int8 draft: row groups and per-channel scales keep a prefill's ordinary rows."""

import pytest
import torch

from specdec.errors import SpecdecError


def test_int8_prefill_keeps_ordinary_rows_beside_a_massive_one():
    """One scale per call would let a prompt's attention-sink token round the other rows away;
    rows of unlike magnitude are quantized apart, and a decode step's single row is exact as before."""
    import warnings

    from specdec.models.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 64)
    with torch.no_grad():
        linear.weight[0] *= 100  # one output channel far larger: per-channel weight scales keep the rest
    hidden = torch.randn(1, 8, 128)
    hidden[0, 0] *= 300
    layer = Int8Linear(linear)
    reference = linear(hidden)

    def error(out):
        return ((out - reference)[0, 1:, 1:].norm() / reference[0, 1:, 1:].norm()).item()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_scale = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                           dtype=torch.qint8)[0]
    assert error(one_scale(hidden)) > 0.3
    assert error(layer(hidden)) < 0.03
    assert layer(hidden[:, :0]).shape == (1, 0, 64)


def test_int8_down_fp32_draft_survives_activation_outliers():
    """Per-tensor dynamic int8 of an outlier-heavy down_proj input rounds the other channels away."""
    import tiny
    from peft import LoraConfig, get_peft_model

    from specdec.models.int8 import Int8Linear
    from specdec.models.quantize import quantize_draft

    torch.manual_seed(0)
    hidden = torch.randn(1, 8, 128)
    hidden[..., :2] *= 300  # Qwen-like: a few MLP channels far larger than the rest
    fp32 = tiny.model(seed=3).model.layers[0].mlp.down_proj
    reference, ordinary = fp32(hidden), fp32(torch.cat([torch.zeros(1, 8, 2), hidden[..., 2:]], -1))
    errors = {}
    for mode in ("int8-down-fp32", "int8"):
        mlp = quantize_draft(tiny.model(seed=3), mode).model.layers[0].mlp
        assert type(mlp.up_proj) is Int8Linear
        assert (type(mlp.down_proj) is Int8Linear) == (mode == "int8")
        errors[mode] = ((mlp.down_proj(hidden) - reference).norm() / ordinary.norm()).item()
    assert errors["int8-down-fp32"] == 0 and errors["int8"] > 0.3  # the ordinary channels' share is lost
    assert quantize_draft(tiny.model(), "none").model.layers[0].mlp.up_proj.__class__ is torch.nn.Linear
    with pytest.raises(SpecdecError, match="unknown draft quantization"):
        quantize_draft(tiny.model(), "int4")
    lora = LoraConfig(r=2, target_modules=["q_proj", "down_proj"])
    wrapped = quantize_draft(get_peft_model(tiny.model(), lora), "int8-down-fp32")
    layer = wrapped.base_model.model.model.layers[0]
    assert type(layer.self_attn.q_proj.base_layer) is Int8Linear
    assert type(layer.mlp.down_proj.base_layer) is torch.nn.Linear  # kept fp32 under peft's wrapper too
    assert type(layer.mlp.down_proj.lora_A["default"]) is torch.nn.Linear
