"""The training precision per device: CPU exactly as before (bf16 autocast where native, the base held in bf16
only where exact, the int8 base the server runs), CUDA with a bf16 frozen base and no int8; LoRA in fp32. No
GPU needed: the choice is a function of the device string and of whether the device computes bf16."""

import pytest
import torch

import tiny
from repos import training_samples
from specdec.errors import SpecdecError
from specdec_finetune.precision import PRECISIONS, train_precision


def old_cpu_rule(choice: str, native: bool) -> str:
    """finetune/train.py's _mixed_precision on a machine without CUDA, before the choice was per device."""
    if choice == "fp32":
        return "no"
    if choice == "bf16":
        return "bf16"
    return "bf16" if native else "no"


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("choice", PRECISIONS)
@pytest.mark.parametrize("quant", ["int8", "int8-down-fp32", "none"])
def test_cpu_keeps_its_rule(choice, native, quant):
    plan = train_precision("cpu", choice, quant, bf16=native)
    assert plan.mixed_precision == old_cpu_rule(choice, native) and not plan.on_cuda
    assert plan.base_dtype == (torch.bfloat16 if plan.mixed_precision == "bf16" else None)
    assert plan.exact_only  # the base is held in bf16 only where the round trip is exact, as before
    assert plan.quant == quant and plan.lora_dtype == torch.float32


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_holds_a_bf16_base_and_trains_no_int8(device):
    plan = train_precision(device, "auto", "int8", bf16=True)
    assert plan.on_cuda and plan.device == device
    assert (plan.mixed_precision, plan.base_dtype, plan.exact_only) == ("bf16", torch.bfloat16, False)
    assert plan.quant == "none" and plan.lora_dtype == torch.float32  # a GPU serves the draft unquantized
    assert train_precision(device, "bf16", "none", bf16=False).base_dtype == torch.bfloat16  # asked for
    old = train_precision(device, "auto", "int8", bf16=False)  # a GPU without bf16 (before Ampere)
    assert (old.mixed_precision, old.base_dtype, old.quant) == ("no", None, "none")
    full = train_precision(device, "fp32", "int8", bf16=True)
    assert (full.mixed_precision, full.base_dtype) == ("no", None)


def test_the_hardware_is_asked_when_not_told(monkeypatch):
    import specdec_finetune.precision as precision

    asked = []
    monkeypatch.setattr(precision, "native_bf16", lambda device: asked.append(device) or device == "cuda")
    assert train_precision("cuda").mixed_precision == "bf16" and train_precision("cpu").mixed_precision == "no"
    assert asked == ["cuda", "cpu"]


@pytest.mark.parametrize("device", ["mps", "cuda:x", "gpu", ""])
def test_unknown_devices_and_precisions_are_refused(device):
    with pytest.raises(SpecdecError, match="cpu or cuda"):
        train_precision(device, bf16=True)
    with pytest.raises(SpecdecError, match="precision must be"):
        train_precision("cpu", "fp16", bf16=True)


def base_weights(model) -> dict:
    return {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in model.state_dict().items() if "lora_" not in k}


def train_watching_the_base(tmp_path, tok, draft, plan=None, monkeypatch=None, precision="bf16"):
    """Train 2 steps; returns (model, the base weights' dtype seen during training, the LoRA weights' dtypes)."""
    from specdec_finetune import train as training

    if plan is not None:
        monkeypatch.setattr(training, "train_precision", lambda *a, **k: plan)
    seen = []
    config = training.TrainConfig(objective="lm", precision=precision, max_steps=2, batch_size=2)
    samples = training_samples(tmp_path, tok, files=3, count=4)
    model, result = training.train(draft, None, tok, samples, config, tmp_path / "run", progress=False,
                                   on_step=lambda step, loss: seen.append(draft.lm_head.weight.dtype), device="cpu")
    assert result.steps == 2
    return model, set(seen), {p.dtype for n, p in model.named_parameters() if "lora_" in n}


def test_cpu_leaves_an_inexact_base_in_fp32(tmp_path, tok):
    """Unchanged CPU path: a base whose weights bf16 cannot hold is not cast, and comes back untouched."""
    draft = tiny.model(seed=2)  # random fp32 weights: not bf16-representable
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    model, during, lora = train_watching_the_base(tmp_path, tok, draft)
    assert during == {torch.float32} and lora == {torch.float32}
    assert all(torch.equal(base_weights(model)[k], v) for k, v in before.items())


def test_the_cuda_plan_holds_an_inexact_base_in_bf16_and_puts_it_back_exactly(tmp_path, tok, monkeypatch):
    """CUDA's plan, exercised on the CPU: the base is bf16 while training, the adapter fp32, and afterwards the
    caller's fp32 weights are back bit for bit (kept aside, since the bf16 round trip loses bits)."""
    from dataclasses import replace

    draft = tiny.model(seed=2)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    plan = replace(train_precision("cuda", "bf16", "int8", bf16=True), device="cpu")
    model, during, lora = train_watching_the_base(tmp_path, tok, draft, plan, monkeypatch)
    assert during == {torch.bfloat16} and lora == {torch.float32}
    after = base_weights(model)
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items())
