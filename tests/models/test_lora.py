"""LoRA adapters over the draft: switching folded adapters on an int8 base, the lean forward."""

import json

import pytest

import tiny
from specdec.errors import SpecdecError
from adapter_files import random_adapter


def test_switchable_draft_swaps_adapters_on_an_int8_base(tmp_path, monkeypatch):
    import torch

    import specdec.models.lora as lora
    from specdec.models.lora import SwitchableDraft

    paths = {name: random_adapter(tmp_path / name, seed) for name, seed in (("a", 1), ("b", 2))}
    draft = SwitchableDraft(tiny.model(seed=2))
    ids = torch.tensor([[10, 11, 12, 13]])
    base = draft.model(ids).logits
    assert draft.activate("a", paths["a"]) and not draft.activate("a")
    out_a = draft.model(ids).logits
    draft.activate("b", paths["b"])
    out_b = draft.model(ids).logits
    draft.activate(None)
    assert torch.equal(draft.model(ids).logits, base)
    assert not torch.allclose(out_a, base) and not torch.allclose(out_a, out_b)
    rebuilt = [layer for layer, base in draft.folded["a"].items() if base is not draft.int8_bases[layer][0]]
    assert len(rebuilt) == 4  # q_proj and down_proj of two layers; the other modules share the base's int8
    monkeypatch.setattr(lora, "FOLDED_KEPT", 1)
    draft.activate("b")  # "a" dropped
    draft.activate("a")  # and rebuilt the same
    assert list(draft.folded) == ["a"] and torch.equal(draft.model(ids).logits, out_a)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"target_modules": ["embed_tokens"]}))
    with pytest.raises(SpecdecError, match="cannot switch"):
        draft.activate("bad", bad)


def test_wrapping_a_draft_in_peft_warns_nothing(tmp_path):
    """Issue #40 item 4: peft's PeftModel reads transformers' deprecated `is_gradient_checkpointing`, which printed
    a FutureWarning wherever an adapter was served or trained."""
    import warnings

    from specdec.models.lora import SwitchableDraft, apply_adapter

    path = random_adapter(tmp_path / "a", 1)
    base = tiny.model(seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SwitchableDraft(tiny.model(seed=2)).activate("a", path)
        apply_adapter(base, str(path))
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


def test_an_unloaded_adapter_leaves_memory_and_the_active_one_untouched(tmp_path):
    """Online adaptation replaces an adapter every few minutes: the replaced one must not stay loaded."""
    import torch

    from specdec.models.lora import SwitchableDraft

    draft = SwitchableDraft(tiny.model(seed=2))
    ids = torch.tensor([[10, 11, 12, 13]])
    draft.activate("old", random_adapter(tmp_path / "old", 1))
    with pytest.raises(SpecdecError, match="in use"):
        draft.unload("old")
    draft.activate("new", random_adapter(tmp_path / "new", 2))
    served = draft.model(ids).logits
    assert draft.unload("old") and not draft.unload("old")
    assert "old" not in draft.loaded and "old" not in draft.folded and "old" not in draft.model.peft_config
    assert torch.equal(draft.model(ids).logits, served)
    draft.activate(None)
    draft.activate("new")  # still switchable, still the same
    assert torch.equal(draft.model(ids).logits, served)


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_lean_lora_forward_computes_what_pefts_does(tmp_path, quant):
    import copy

    import torch

    from peft import PeftModel

    from specdec.models.lean_lora import use_lean_lora
    from specdec.models.quantize import quantize_draft

    model = PeftModel.from_pretrained(tiny.model(seed=2), random_adapter(tmp_path / "a", 1, lora_dropout=0.5))
    use_lean_lora(model)
    model = quantize_draft(model, quant).eval()
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    lean = model(ids).logits
    layers = [m for m in model.modules() if "forward" in m.__dict__]
    assert len(layers) == 4  # q_proj and down_proj in each of the two layers
    for layer in layers:
        del layer.forward
    peft_out = model(ids).logits
    assert torch.allclose(lean, peft_out, atol=1e-5) and not torch.allclose(lean, tiny.model(seed=2)(ids).logits)
    assert use_lean_lora(model) == 4
    model.train()  # dropout: peft's own forward, draw for draw
    torch.manual_seed(0)
    trained = model(ids).logits
    torch.manual_seed(0)
    for layer in layers:
        del layer.forward
    assert torch.equal(trained, model(ids).logits)
    use_lean_lora(model)
    clone = copy.deepcopy(model.eval())
    clone_layers = [m for m in clone.modules() if "forward" in m.__dict__]
    assert [m.forward.__self__ for m in clone_layers] == clone_layers  # not the original's layers
    assert torch.allclose(clone(ids).logits, lean, atol=1e-5)
