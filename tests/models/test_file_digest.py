"""A weights file's content digest (the int4 cache's key): where a GGUF's data starts, and what changes the digest."""

import mmap
import os

import tiny
from gguf_files import write_tiny_gguf

from specdec.models import file_digest
from specdec.models.file_digest import content_digest, data_offset


def test_the_gguf_data_offset_is_the_one_gguf_reads(tmp_path):
    from gguf import GGUFReader

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(tiny.model(seed=1, hidden=256, vocab_size=384), path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        assert data_offset(data) == GGUFReader(str(path)).data_offset
    assert data_offset(b"GGUF\x03\x00\x00\x00" + bytes(4)) is None  # truncated: no offset, no exception
    assert data_offset(b"not a model file") is None


def test_the_digest_sees_the_header_the_first_mb_the_samples_and_the_size(tmp_path):
    header = b'{"w":{"dtype":"U8","shape":[8388608],"data_offsets":[0,8388608]}}'
    original = len(header).to_bytes(8, "little") + header + os.urandom(8 * 2**20)  # a safetensors file's layout
    size, data_start = len(original), 8 + len(header)
    assert data_offset(original) == data_start
    path = tmp_path / "weights.safetensors"
    path.write_bytes(original)
    digest = content_digest(path)
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert content_digest(path) == digest  # mtime is not content

    def changed_at(offset: int) -> str:
        data = bytearray(original)
        data[offset] ^= 0xFF
        path.write_bytes(bytes(data))
        return content_digest(path)

    for offset in (10, data_start, data_start + file_digest.DATA_HEAD_BYTES - 1,  # header, first MB of data
                   data_start + file_digest.DATA_HEAD_BYTES,  # the first sample
                   size - 1):  # the last sample ends at the file's end
        assert changed_at(offset) != digest, offset
    path.write_bytes(original + b"\x00")
    assert content_digest(path) != digest
    path.write_bytes(original)
    assert content_digest(path) == digest


def test_a_safetensors_header_and_data_start(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(4, 4), "b": torch.ones(2)}, str(path))
    raw = path.read_bytes()
    offset = data_offset(raw)
    assert offset == 8 + int.from_bytes(raw[:8], "little") and raw[8:9] == b"{"
    assert len(raw) - offset == (16 + 2) * 4


def test_a_gguf_copied_over_with_its_mtime_kept_gets_a_conversion_of_its_own(tmp_path):
    """The bf16 conversion of a GGUF (specdec.models.store) is keyed by content as the int4 cache is."""
    from specdec.models.store import _gguf_cache_dir

    gguf, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    write_tiny_gguf(tiny.model(seed=1, hidden=256, vocab_size=384), gguf)
    write_tiny_gguf(tiny.model(seed=3, hidden=256, vocab_size=384), other)
    before, stat = _gguf_cache_dir(gguf), gguf.stat()
    assert other.stat().st_size == stat.st_size
    gguf.write_bytes(other.read_bytes())
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    replaced = _gguf_cache_dir(gguf)
    assert replaced != before
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert _gguf_cache_dir(gguf) == replaced  # a touch alone converts nothing again
