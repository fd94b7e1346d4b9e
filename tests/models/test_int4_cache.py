"""The int4 target's cache: the second start loads the converted layers instead of converting, the
model it gives is bit for bit the converted one, a damaged or stale file is rebuilt, and each int4
kernel (aten, w4a8) has its own file that the other is never served."""

import errno
import json
import os
import warnings
from pathlib import Path

import pytest
import tiny
import torch
from gguf_files import write_tiny_gguf

from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import make_session
from specdec.models import int4_cache, w4a8
from specdec.models.int4 import Int4Linear, Int8ChannelLinear, TargetQuantConfig
from specdec.models.loading import load_pair
from specdec.paths import quantized_dir

HIDDEN = 256  # Q4_K's super-block width
VOCAB = 384  # lm_head rows W8A8 tiles (16 a tile): beside W4A8 the Q8_0 lm_head is a W8A8 layer
PROMPT = "import os\nimport sys\n\ndef main():\n    pass\n\nfunction add(a, b) {\n  return"  # > DENSE_ROWS tokens


@pytest.fixture
def model_dir(tmp_path):
    """A tiny model directory that names its GGUF as a conversion from one does (specdec.json)."""
    path = tiny.save(tmp_path, seed=1, hidden=HIDDEN, vocab_size=VOCAB)
    gguf = tmp_path / "tiny-q4_k_m.gguf"
    write_tiny_gguf(tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB), gguf)
    (path / "specdec.json").write_text(json.dumps({"gguf": str(gguf)}))
    return path, gguf


@pytest.fixture
def conversions(monkeypatch):
    """How many times the int4 conversion itself ran."""
    calls = []
    convert = int4_cache.quantize_target

    def counting(*args, **kwargs):
        calls.append(args[1])
        return convert(*args, **kwargs)

    monkeypatch.setattr(int4_cache, "quantize_target", counting)
    return calls


def load(path):
    return load_pair(str(path), None, dtype="bf16", target_quant="int4").target


def logits(target) -> torch.Tensor:
    ids = torch.tensor([target.tokenizer.encode(PROMPT)])
    assert ids.shape[1] > 9  # long enough for the dense prefill route as well as the int4 kernel
    with torch.inference_mode():
        prefill = target.model(ids).logits
        step = target.model(ids[:, :4]).logits  # <= DENSE_ROWS rows: the int4 kernel
    return torch.cat([prefill[0], step[0]])


def buffers(model) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in model.state_dict().items()}


def test_second_load_uses_the_cache_and_is_bit_identical(model_dir, conversions):
    path, _ = model_dir
    first = load(path)
    assert len(conversions) == 1 and conversions[0].mode == "int4"
    files = list(quantized_dir().glob("*.pt"))
    assert len(files) == 1 and not list(quantized_dir().glob("*.partial"))
    second = load(path)
    assert len(conversions) == 1, "the second load converted again"
    layer = second.model.model.layers[1].mlp.down_proj
    assert isinstance(layer, Int4Linear) and isinstance(second.model.lm_head, Int8ChannelLinear)
    assert layer.dense is not None and layer.dense_rows == first.model.model.layers[1].mlp.down_proj.dense_rows
    want, got = buffers(first.model), buffers(second.model)
    assert want.keys() == got.keys()
    for name in want:
        assert want[name].dtype == got[name].dtype and torch.equal(want[name], got[name]), name
    assert torch.equal(logits(first), logits(second))
    tokens = [make_session(t.model, t.tokenizer, "plain").generate(t.tokenizer.encode(PROMPT), GenerationConfig(12))
              .tokens for t in (first, second)]
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("other", ["int8", "bf16"])
def test_cached_layers_equal_converted_ones_for_each_treatment_of_the_rest(model_dir, conversions, other):
    path, gguf = model_dir
    config = TargetQuantConfig("int4", other=other)
    weights = list(path.glob("*.safetensors"))
    models = []
    for _ in range(2):
        model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB)
        counts = int4_cache.quantize_target_cached(model, config, gguf, torch.bfloat16, weights)
        assert counts == ({"int4": 14, "int8": 1} if other == "int8" else {"int4": 14, "dense": 1})
        models.append(model)
    assert len(conversions) == 1
    ids = torch.tensor([tiny.tokenizer().encode(PROMPT)])
    with torch.inference_mode():
        assert torch.equal(models[0](ids).logits, models[1](ids).logits)


def test_a_corrupted_cache_warns_and_is_rebuilt(model_dir, conversions):
    path, _ = model_dir
    reference = logits(load(path))
    (cached,) = quantized_dir().glob("*.pt")
    data = cached.read_bytes()
    cached.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.warns(RuntimeWarning, match="unreadable"):
        rebuilt = load(path)
    assert len(conversions) == 2
    assert torch.equal(logits(rebuilt), reference)
    assert cached.stat().st_size == len(data)  # rewritten whole
    cached.write_bytes(b"not a file of ours")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        load(path)
    assert len(conversions) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(logits(load(path)), reference)
    assert len(conversions) == 3


@pytest.mark.parametrize("where,width", [(0.5, 64), (0.7, 1)])
def test_flipped_bytes_warn_and_are_rebuilt(model_dir, conversions, where, width):
    """Issue #52 item 7: flipped bytes read back as other weights, silently; the file's checksum now tells."""
    path, _ = model_dir
    reference = logits(load(path))
    (cached,) = quantized_dir().glob("*.pt")
    data = bytearray(cached.read_bytes())
    at = int(len(data) * where)
    data[at : at + width] = bytes(b ^ (0xFF if width > 1 else 0x04) for b in data[at : at + width])
    cached.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="checksum"):
        rebuilt = load(path)
    assert len(conversions) == 2 and torch.equal(logits(rebuilt), reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(logits(load(path)), reference)
    assert len(conversions) == 2


def test_a_touched_gguf_is_still_served_from_the_cache(model_dir, conversions):
    """The key is the GGUF's content: a new mtime alone (a `touch`, a fresh checkout) converts nothing."""
    path, gguf = model_dir
    reference = logits(load(path))
    stamp = gguf.stat().st_mtime_ns + 10**9
    os.utime(gguf, ns=(stamp, stamp))
    assert torch.equal(logits(load(path)), reference)
    assert len(conversions) == 1


def test_another_gguf_of_the_same_size_and_mtime_is_not_served_the_old_cache(model_dir, conversions, tmp_path):
    """Issue #40.15: `cp -p`, `rsync -a`, `tar -x` put another GGUF of the same size in place with the mtime kept."""
    path, gguf = model_dir
    old = load(path)
    other = tmp_path / "other.gguf"
    write_tiny_gguf(tiny.model(seed=3, hidden=HIDDEN, vocab_size=VOCAB), other)
    assert other.stat().st_size == gguf.stat().st_size and other.read_bytes() != gguf.read_bytes()
    stamp = gguf.stat()
    config, weights = TargetQuantConfig("int4"), list(path.glob("*.safetensors"))
    before = int4_cache.cache_key(gguf, weights, config, torch.bfloat16)
    gguf.write_bytes(other.read_bytes())  # copied over, its mtime kept
    os.utime(gguf, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert gguf.stat().st_mtime_ns == stamp.st_mtime_ns and gguf.stat().st_size == stamp.st_size
    assert int4_cache.cache_key(gguf, weights, config, torch.bfloat16) != before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stale is not damage: no warning
        new = load(path)
    assert len(conversions) == 2
    assert len(list(quantized_dir().glob("*.pt"))) == 1  # overwritten, not added
    layer = "model.layers.0.mlp.up_proj.packed"
    assert not torch.equal(buffers(old.model)[layer], buffers(new.model)[layer])  # the new GGUF's codes
    fresh = tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB)  # converted from the new GGUF, no cache
    int4_cache.quantize_target(fresh, config, gguf, torch.bfloat16)
    assert torch.equal(buffers(fresh)[layer], buffers(new.model)[layer])
    load(path)
    assert len(conversions) == 3  # the two loads and the fresh conversion: the third load was the cache's


def test_a_file_cached_under_the_old_path_size_mtime_key_is_stale(model_dir, conversions):
    path, gguf = model_dir
    config, weights = TargetQuantConfig("int4"), list(path.glob("*.safetensors"))
    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB)
    counts = int4_cache.quantize_target(model, config, gguf, torch.bfloat16)
    key = int4_cache.cache_key(gguf, weights, config, torch.bfloat16)
    stat = gguf.stat()
    key["gguf"] = {"path": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}  # before #40.15
    int4_cache.save_layers(model, int4_cache.cache_path(gguf, config, torch.bfloat16), key, counts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(path)
    assert len(conversions) == 2  # the old file was not served (nor an error): converted and rewritten
    load(path)
    assert len(conversions) == 2


def test_a_cache_that_does_not_fit_the_model_leaves_it_untouched(model_dir, tmp_path):
    path, gguf = model_dir
    config = TargetQuantConfig("int4")
    weights = list(path.glob("*.safetensors"))
    key = int4_cache.cache_key(gguf, weights, config, torch.bfloat16)
    other = tiny.model(seed=1, hidden=HIDDEN, layers=1)  # the same key over another model's layers
    counts = int4_cache.quantize_target(other, config, None, torch.bfloat16)
    int4_cache.save_layers(other, tmp_path / "foreign.pt", key, counts)
    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="does not match"):
        int4_cache.load_layers(model, tmp_path / "foreign.pt", key, torch.bfloat16)
    assert all(type(m) is not Int4Linear for m in model.modules())
    assert model.dtype == torch.float32
    stale = dict(key, torch="0.0")
    assert int4_cache.load_layers(model, tmp_path / "foreign.pt", stale, torch.bfloat16) is None


def unwritable_folder(tmp_path) -> Path:
    """A folder this process cannot create files in: read-only by its mode, or sysfs where the tests run as root."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / "probe").touch()
        except OSError:
            return candidate
        (candidate / "probe").unlink()
    pytest.skip("no folder here refuses this process's writes")


@pytest.mark.parametrize("failure", ["full disk on rename", "full disk in torch.save", "read-only folder",
                                     "no folder"])
def test_an_unwritable_cache_warns_once_and_the_load_goes_on(model_dir, conversions, monkeypatch, caplog, tmp_path,
                                                             failure):
    """Issue #40.9: a full disk failed the load with torch's `[enforce fail at inline_container.cc:672]`."""
    path, _ = model_dir
    folder = quantized_dir()
    if failure == "full disk on rename":
        def full_disk(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(int4_cache.os, "replace", full_disk)
    elif failure == "full disk in torch.save":
        def half_written(obj, file, *args, **kwargs):  # what PyTorch's zip writer does when the disk fills up
            Path(file).write_bytes(b"PK\x03\x04" + bytes(1000))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1064 vs 1000")

        monkeypatch.setattr(int4_cache.torch, "save", half_written)
    elif failure == "read-only folder":
        folder = unwritable_folder(tmp_path)
        monkeypatch.setattr(int4_cache, "quantized_dir", lambda: folder)
    else:
        def no_folder():
            raise OSError(errno.EROFS, "Read-only file system", str(folder))

        monkeypatch.setattr(int4_cache, "quantized_dir", no_folder)
    before = set(folder.iterdir())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said through the log, once, not as a Python warning
        target = load(path)
    assert isinstance(target.model.model.layers[0].mlp.up_proj, Int4Linear)
    said = [r.getMessage() for r in caplog.records if "int4 cache" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "serving without" in said[0], said
    assert str(folder) in said[0]  # where
    assert set(folder.iterdir()) == before  # no file, no leftover partial one
    assert torch.equal(logits(target), logits(load(path)))  # the next start converts again, to the same model


@pytest.fixture
def both_kernels():
    """Skips where the W4A8 kernel cannot run (tests/models/test_w4a8.py decides whether that is a failure)."""
    if w4a8.load() is None:
        pytest.skip(f"the W4A8 kernel cannot run here: {w4a8.unavailable_reason()}")


def kernels_of(target) -> set[str]:
    return {m.kernel for m in target.model.modules() if isinstance(m, Int4Linear)}


def test_each_kernel_has_its_own_cache_and_is_never_served_the_other(model_dir, conversions, both_kernels,
                                                                     monkeypatch):
    path, _ = model_dir

    def load_with(kernel):
        return load_pair(str(path), None, dtype="bf16", target_quant="int4", int4_kernel=kernel).target

    fresh = {kernel: load_with(kernel) for kernel in ("aten", "w4a8")}
    assert [c.kernel for c in conversions] == ["aten", "w4a8"]  # the second kernel did not take the first's file
    assert len(list(quantized_dir().glob("*.pt"))) == 2
    assert {k: kernels_of(t) for k, t in fresh.items()} == {"aten": {"aten"}, "w4a8": {"w4a8"}}
    assert {k: t.model.lm_head.kernel for k, t in fresh.items()} == {"aten": "aten", "w4a8": "w8a8"}
    for kernel in ("w4a8", "aten"):
        cached = load_with(kernel)
        assert kernels_of(cached) == {kernel} and cached.model.lm_head.kernel == fresh[kernel].model.lm_head.kernel
        want, got = buffers(fresh[kernel].model), buffers(cached.model)
        assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
        assert torch.equal(logits(cached), logits(fresh[kernel]))
    assert not torch.equal(logits(fresh["aten"]), logits(fresh["w4a8"]))  # the two kernels do differ
    assert len(conversions) == 2
    cached = load_with("auto")  # auto is the kernel it resolves to, here w4a8: that file, no conversion
    assert kernels_of(cached) == {"w4a8"} and len(conversions) == 2
    monkeypatch.setattr(w4a8, "_state", {})  # auto resolves again, now where the kernel cannot run
    monkeypatch.setenv("SPECDEC_W4A8", "0")
    cached = load_with("auto")
    assert kernels_of(cached) == {"aten"} and len(conversions) == 2  # the aten file, not the w4a8 one
    assert torch.equal(logits(cached), logits(fresh["aten"]))


def test_a_file_packed_for_the_other_kernel_is_refused(model_dir, both_kernels, tmp_path):
    _, gguf = model_dir
    weights = []
    aten, other = TargetQuantConfig("int4", kernel="aten"), TargetQuantConfig("int4", kernel="w4a8")
    model = tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB)
    counts = int4_cache.quantize_target(model, other, gguf, torch.bfloat16)
    key = int4_cache.cache_key(gguf, weights, aten, torch.bfloat16)
    assert key["config"]["kernel"] == "aten" and key != int4_cache.cache_key(gguf, weights, other, torch.bfloat16)
    int4_cache.save_layers(model, tmp_path / "forged.pt", key, counts)  # w4a8's layers under aten's key
    fresh = tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="packed for the 'w4a8' kernel"):
        int4_cache.load_layers(fresh, tmp_path / "forged.pt", key, torch.bfloat16)
    assert all(type(m) is not Int4Linear for m in fresh.modules())


def test_auto_serves_the_gguf_codes_where_the_target_has_them_and_the_loaded_weights_otherwise(model_dir, tmp_path):
    from specdec.errors import SpecdecError
    from specdec.models.loading import LoadedModel
    from specdec.models.quantize import resolve_target_quant

    path, gguf = model_dir
    pair = load_pair(str(path), None, dtype="bf16", target_quant="auto")  # the CLI's and the server's default
    assert pair.target_quant == "int4" and kernels_of(pair.target)  # a conversion that remembers its GGUF
    assert pair.target_identity()["quantization"] in ("int4:aten", "int4:w4a8+w8a8")  # a cost curve per kernel
    plain_dir = tiny.save(tmp_path, seed=1, name="float", hidden=HIDDEN)  # a float checkpoint with no GGUF
    pair = load_pair(str(plain_dir), None, dtype="bf16", target_quant="auto")
    assert pair.target_quant == "none" and pair.target_identity()["quantization"] == "none"
    assert all(type(m) is not Int4Linear and type(m) is not Int8ChannelLinear for m in pair.target.model.modules())
    on_meta = LoadedModel(str(gguf), path, tiny.model(seed=1, hidden=HIDDEN, vocab_size=VOCAB).to("meta"), None)
    assert resolve_target_quant("auto", on_meta) == "none"  # not on CPU: PyTorch's int4 kernels are CPU ones
    assert resolve_target_quant("int8", on_meta) == "int8"  # an explicit choice is kept as asked
    with pytest.raises(SpecdecError, match="unknown target quantization 'int3'"):
        resolve_target_quant("int3", on_meta)


def test_the_w8a8_switch_has_a_cache_file_of_its_own(model_dir, both_kernels, monkeypatch):
    """SPECDEC_W8A8=0 (W4A8 int4 layers beside ATen int8 ones) never reads or overwrites the default file."""
    _, gguf = model_dir
    w4a8_config, aten_config = TargetQuantConfig("int4", kernel="w4a8"), TargetQuantConfig("int4", kernel="aten")
    default = int4_cache.cache_path(gguf, w4a8_config, torch.bfloat16)
    default_key = int4_cache.cache_key(gguf, [], w4a8_config, torch.bfloat16)
    aten = int4_cache.cache_path(gguf, aten_config, torch.bfloat16)
    monkeypatch.setenv("SPECDEC_W8A8", "0")
    assert int4_cache.cache_path(gguf, w4a8_config, torch.bfloat16) not in (default, aten)
    assert int4_cache.cache_key(gguf, [], w4a8_config, torch.bfloat16)["layout"] != default_key["layout"]
    assert int4_cache.cache_path(gguf, aten_config, torch.bfloat16) == aten  # ATen's int4 has ATen's int8 anyway
