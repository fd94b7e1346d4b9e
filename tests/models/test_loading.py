"""Loading: the dtype `auto` resolves to, and refusing a draft with another tokenizer."""

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.models.loading import check_same_tokenizer


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_is_bf16_only_where_the_hardware_computes_it(monkeypatch, tmp_path, native):
    """Emulated bf16 (AVX2-only CPUs) makes a prefill several times slower than fp32: `auto`, the
    default, loads the target in bf16 only where it is native, and int8 training's backward follows."""
    import tiny

    from specdec import hardware
    from specdec.models.int8 import Int8Linear
    from specdec.hardware import torch_dtype
    from specdec.models.loading import load

    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": native)
    expected = torch.bfloat16 if native else torch.float32
    assert torch_dtype("auto") is expected
    assert (torch_dtype("bf16"), torch_dtype("fp32")) == (torch.bfloat16, torch.float32)  # explicit choices stand
    assert next(load(str(tiny.save(tmp_path))).model.parameters()).dtype is expected
    assert Int8Linear(torch.nn.Linear(16, 8)).grad_dtype is expected
    with pytest.raises(SpecdecError, match="unknown dtype 'fp16'; use one of auto, bf16, fp32"):
        torch_dtype("fp16")


def test_mismatched_tokenizers_refused(tok):
    import tiny

    other = tiny.tokenizer(vocab_size=300)
    with pytest.raises(SpecdecError, match="do not share a tokenizer"):
        check_same_tokenizer(tok, other)
    check_same_tokenizer(tok, tiny.tokenizer())
