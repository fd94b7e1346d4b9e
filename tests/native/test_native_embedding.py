"""The token embedding's kept rows (gguf_weights.Embedding): a lookup gives the file's rows whether they were kept
or read, in the order asked, and what is kept stays within its bound."""

import pytest
import torch
from native_models import _cached_gguf

from specdec.errors import SpecdecError
from specdec.native.gguf_weights import read_qwen2


@pytest.fixture()
def embedding():
    return read_qwen2(_cached_gguf(0, 2, False)).embedding


def test_kept_rows_are_the_files_rows_in_the_order_asked(embedding):
    ids = torch.tensor([5, 3, 5, 200, 3, 0])
    first = embedding(ids)  # reads every row from the file
    assert torch.equal(first, embedding.dequantize(ids.numpy()))
    again = embedding(torch.tensor([3, 200, 5]))  # kept rows only
    assert torch.equal(again, embedding.dequantize(torch.tensor([3, 200, 5]).numpy()))
    assert set(embedding._kept) == {0, 3, 5, 200}


def test_a_caller_changing_its_rows_does_not_change_what_is_kept(embedding):
    rows = embedding(torch.tensor([7]))
    rows.add_(1.0)  # the forward adds into the residual it was handed
    assert torch.equal(embedding(torch.tensor([7])), embedding.dequantize(torch.tensor([7]).numpy()))


def test_the_least_recently_used_rows_go_first(embedding, monkeypatch):
    monkeypatch.setattr(type(embedding), "ROWS_KEPT", 3)
    embedding(torch.tensor([1, 2, 3]))
    embedding(torch.tensor([1]))  # 1 used again: 2 is now the oldest
    embedding(torch.tensor([4]))
    assert list(embedding._kept) == [3, 1, 4]
    assert torch.equal(embedding(torch.tensor([2, 4])), embedding.dequantize(torch.tensor([2, 4]).numpy()))


def test_an_id_outside_the_vocabulary_is_refused(embedding):
    with pytest.raises(SpecdecError, match="outside the model's vocabulary"):
        embedding(torch.tensor([embedding.rows]))
