"""The native weights cache: a second start maps the stored weights instead of converting the GGUF and computes
the same bits; a damaged file is a warning and a rebuild; another GGUF's content makes the file stale; a cache
that cannot be written costs nothing but the next start's conversion."""

import pytest
import torch
from native_models import LLAMA_SCALE, hf_model, kernels_or_skip, write

from gguf_files import write_qwen2_gguf
from specdec.native import gguf_weights, weights_cache
from specdec.native.lm import NativeModel
from specdec.native.qwen2 import Qwen2

TOKENS = list(range(30, 70))


def logits(weights) -> torch.Tensor:
    return NativeModel(Qwen2(weights), 128).new_cached_lm().extend(TOKENS)


@pytest.fixture
def gguf(tmp_path):
    kernels_or_skip()
    path = tmp_path / "tiny.gguf"
    write_qwen2_gguf(hf_model(), path, types={"blk.1.attn_v": "Q8_0"}, tied=True)
    return path


def test_a_llama_comes_back_from_the_cache_as_it_was_converted(tmp_path, monkeypatch):
    """The stored config keeps the architecture and the RoPE factor; the Q/K rows are stored unpermuted."""
    kernels_or_skip()
    path = write(tmp_path / "tiny-llama.gguf", arch="llama", layers=1)
    calls = conversions(monkeypatch)
    first = weights_cache.read_qwen2_cached(path)
    again = weights_cache.read_qwen2_cached(path)
    assert len(calls) == 1 and again.config == first.config and again.config.architecture == "llama"
    assert again.config.rope_scale == LLAMA_SCALE
    assert torch.equal(logits(again), logits(first))


def conversions(monkeypatch) -> list:
    calls = []
    real = weights_cache.read_qwen2
    monkeypatch.setattr(weights_cache, "read_qwen2",
                        lambda path, int4=False: calls.append(path) or real(path, int4=int4))
    return calls


def test_a_second_start_maps_the_stored_weights(gguf, monkeypatch):
    calls = conversions(monkeypatch)
    first = logits(weights_cache.read_qwen2_cached(gguf))
    assert len(calls) == 1 and weights_cache.cache_path(gguf).is_file()
    again = weights_cache.read_qwen2_cached(gguf)
    assert len(calls) == 1  # nothing converted
    assert torch.equal(logits(again), first)
    assert torch.equal(first, logits(gguf_weights.read_qwen2(gguf)))


def test_a_damaged_file_is_a_warning_and_a_rebuild(gguf, monkeypatch):
    calls = conversions(monkeypatch)
    first = logits(weights_cache.read_qwen2_cached(gguf))
    path = weights_cache.cache_path(gguf)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.warns(RuntimeWarning, match="unreadable"):
        rebuilt = weights_cache.read_qwen2_cached(gguf)
    assert len(calls) == 2 and torch.equal(logits(rebuilt), first)
    assert torch.equal(logits(weights_cache.read_qwen2_cached(gguf)), first) and len(calls) == 2


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7, 0.9, "one bit"])
def test_flipped_bytes_are_a_warning_and_a_rebuild(gguf, monkeypatch, where):
    """Issue #52 item 7: 64 bytes flipped at 30/50/70/90% of the file, or one bit, gave different logits on every
    later load, with no warning, and the file was never rebuilt. Its checksum now tells."""
    calls = conversions(monkeypatch)
    first = logits(weights_cache.read_qwen2_cached(gguf))
    path = weights_cache.cache_path(gguf)
    data = bytearray(path.read_bytes())
    if where == "one bit":
        data[len(data) // 2] ^= 0x08
    else:
        at = int(len(data) * where)
        data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
    path.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="checksum") as said:
        rebuilt = weights_cache.read_qwen2_cached(gguf)
    assert len(said) == 1 and "\n" not in str(said[0].message)
    assert len(calls) == 2 and torch.equal(logits(rebuilt), first)
    assert torch.equal(logits(weights_cache.read_qwen2_cached(gguf)), first) and len(calls) == 2  # rebuilt whole


def test_another_gguf_at_the_same_path_makes_the_file_stale(gguf, monkeypatch):
    calls = conversions(monkeypatch)
    weights_cache.read_qwen2_cached(gguf)
    write_qwen2_gguf(hf_model(seed=5), gguf, types={"blk.1.attn_v": "Q8_0"}, tied=True)
    fresh = weights_cache.read_qwen2_cached(gguf)
    assert len(calls) == 2 and torch.equal(logits(fresh), logits(gguf_weights.read_qwen2(gguf)))


def test_a_cache_that_cannot_be_written_costs_only_time(gguf, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(weights_cache.torch, "save", refuse)
    weights = weights_cache.read_qwen2_cached(gguf)
    assert "cannot write the native weights cache" in caplog.text
    assert torch.equal(logits(weights), logits(gguf_weights.read_qwen2(gguf)))


def test_a_converted_gguf_is_known_without_parsing_it_again(gguf):
    assert not weights_cache.holds(gguf)
    weights_cache.read_qwen2_cached(gguf)
    assert weights_cache.holds(gguf)
    write_qwen2_gguf(hf_model(seed=5), gguf, types={"blk.1.attn_v": "Q8_0"}, tied=True)
    assert not weights_cache.holds(gguf)  # another content: checked again
