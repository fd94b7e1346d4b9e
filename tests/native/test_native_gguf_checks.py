"""A GGUF's metadata and tensor shapes checked before the native forward takes it (issue #52, items 8 and 9): a
hyper-parameter out of its bounds, a file that is not a GGUF, or a tensor whose shape contradicts the metadata is
a one-line refusal naming the file and the field, at the native check and at load, never a raw exception or a
model that loads as ready and fails every completion; RoPE's table is sized by the cache, not context_length;
and the first conversion warns nothing (item a)."""

import warnings

import numpy as np
import pytest
import torch
from native_models import hf_model, kernels_or_skip

from gguf_files import write_qwen2_gguf
from specdec.errors import SpecdecError
from specdec.native.gguf_weights import read_qwen2
from specdec.native.loading import choose, why_not_native
from specdec.native.lm import NativeModel
from specdec.native.qwen2 import Qwen2

TOKENS = list(range(30, 70))


def write(path, extra=None):
    write_qwen2_gguf(hf_model(layers=1), path, extra=extra)
    return path


def refused(path, *words: str) -> str:
    """The native check's reason and the load's error: one line each, naming the file and `words`."""
    reason, gguf = why_not_native(str(path))
    assert gguf is None and "\n" not in reason and path.name in reason, reason
    for word in words:
        assert word in reason, reason
    with pytest.raises(SpecdecError) as error:
        read_qwen2(path)
    assert "\n" not in str(error.value) and path.name in str(error.value)
    for word in words:
        assert word in str(error.value)
    return reason


@pytest.mark.parametrize("key,value,kind", [
    ("qwen2.attention.head_count", 0, "uint32"),  # was a ZeroDivisionError in the check itself
    ("qwen2.block_count", 0, "uint32"),  # was an IndexError at the first forward
    ("qwen2.embedding_length", 2**31 - 1, "uint32"),  # was "ValueError: mmap length..."
    ("qwen2.context_length", 2**32 - 1, "uint32"),  # was a 16.6 GB RoPE table
    ("qwen2.attention.head_count_kv", 3, "uint32"),  # 4 query heads do not share 3 kv heads
    ("qwen2.attention.layer_norm_rms_epsilon", float("nan"), "float32"),
    ("qwen2.rope.freq_base", -1.0, "float32"),
    ("qwen2.feed_forward_length", "wide", "string"),
])
def test_a_hyper_parameter_out_of_bounds_is_refused_in_one_line(tmp_path, key, value, kind):
    path = write(tmp_path / "odd.gguf", lambda w: getattr(w, f"add_{kind}")(key, value))
    refused(path, key.rsplit(".", 1)[-1])
    assert choose("auto", str(path)) is None
    with pytest.raises(SpecdecError, match="--forward native cannot run"):
        choose("native", str(path))


HEADER = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little")  # version 3, no tensors


@pytest.mark.parametrize("content", [b"", HEADER, HEADER + (1).to_bytes(8, "little"), bytes(range(256)) * 64])
def test_a_file_that_is_not_a_gguf_is_refused_in_one_line(tmp_path, content):
    """A header that promises a key and ends was an IndexError out of gguf's reader."""
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    assert "cannot read broken.gguf" in refused(path)


@pytest.mark.parametrize("key,value,tensor", [
    ("qwen2.attention.head_count_kv", 1, "blk.0.attn_k.weight is 128x256; its metadata says 64x256"),
    ("qwen2.feed_forward_length", 1024, "blk.0.ffn_gate.weight is 512x256; its metadata says 1024x256"),
    ("qwen2.attention.key_length", 32, "blk.0.attn_q.weight is 256x256; its metadata says 128x256"),
])
def test_tensors_that_contradict_the_metadata_are_refused_at_load(tmp_path, key, value, tensor):
    """Such a file loaded as `ready` and failed every completion at the kernels' own checks."""
    path = write(tmp_path / "contradicting.gguf", lambda w: w.add_uint32(key, value))
    refused(path, tensor, key)


def test_a_missing_layer_is_refused_at_load(tmp_path):
    path = write(tmp_path / "short.gguf", lambda w: w.add_uint32("qwen2.block_count", 2))
    refused(path, "lacks blk.1.attn_norm.weight")


def test_the_rope_table_is_sized_by_the_cache_not_the_context(tmp_path):
    """context_length 2^20: the table held 2^20 + 256 positions (256 MiB here, 16.6 GB at 2^32 - 1); now the
    cache's capacity, with the same bits at every position."""
    kernels_or_skip()
    long = write(tmp_path / "long.gguf", lambda w: w.add_uint32("qwen2.context_length", 2**20))
    usual = write(tmp_path / "usual.gguf")
    model = Qwen2(read_qwen2(long))
    assert model.config.context_length == 2**20
    logits = NativeModel(model, 128).new_cached_lm().extend(TOKENS)
    assert len(model.rope[0]) == len(model.rope[1]) == 128
    assert torch.equal(logits, NativeModel(Qwen2(read_qwen2(usual)), 128).new_cached_lm().extend(TOKENS))
    NativeModel(model, 256).new_cached_lm()  # a larger cache over the same weights: the table grows
    assert len(model.rope[0]) == 256
    assert torch.equal(NativeModel(model, 256).new_cached_lm().extend(TOKENS), logits)


def test_the_first_conversion_warns_nothing(tmp_path):
    """An F32 tensor dequantized to a view of the file's read-only map, which torch wrapped with 'The given NumPy
    array is not writable' on every first start's stderr."""
    kernels_or_skip()
    from gguf import GGUFReader

    from specdec.models.gguf_codes import GGUFTensor
    from specdec.native.weights_cache import read_qwen2_cached

    path = write(tmp_path / "tiny.gguf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_qwen2_cached(path)  # the first start: converts
        read_qwen2(path, dense=True)
        read_qwen2(path, int4=True)
    norm = next(t for t in GGUFReader(str(path)).tensors if t.name == "blk.0.attn_norm.weight")
    weight = GGUFTensor(norm.tensor_type.name, norm.data, (1, int(norm.n_elements))).dequantize()
    # torch warns once per process, so say it without the warning too: the weight is memory of its own
    assert not np.may_share_memory(weight.numpy(), norm.data)
    weight += 1  # writable


def test_the_server_says_a_malformed_gguf_in_one_line_and_stays_up(tmp_path):
    """The server's backend: a load that fails is a state with its one-line reason (it was 'ZeroDivisionError: ...'
    out of the check itself), and the next load of a good file works."""
    import tiny
    from lsp_server.settings import Settings

    from specdec.backends.local import LocalBackend

    path = tmp_path / "odd.gguf"
    write_qwen2_gguf(hf_model(layers=1), path, tokenizer=tiny.tokenizer(),
                     extra=lambda w: w.add_uint32("qwen2.attention.head_count", 0))
    settings = Settings().update({"target": str(path), "draft": "", "strategy": "lookup", "forward": "native",
                                  "adapters": False})
    backend = LocalBackend()
    try:
        backend.load(settings)
        assert backend.state == "failed" and "\n" not in backend.error
        assert "odd.gguf" in backend.error and "qwen2.attention.head_count is 0" in backend.error, backend.error
        if native_runs():
            good = tmp_path / "good.gguf"
            write_qwen2_gguf(hf_model(layers=1), good, tokenizer=tiny.tokenizer())
            backend.load(settings.update({"target": str(good)}))
            assert backend.ready, backend.error
    finally:
        backend.executor.shutdown()


def native_runs() -> bool:
    from specdec.models import w4a8
    from specdec.native.layers import ops_available

    return w4a8.load() is not None and ops_available()
