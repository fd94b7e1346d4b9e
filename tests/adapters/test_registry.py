"""The adapter registry: round trip, repository keys, the CLI, and refusing hostile archives."""

import json
import tarfile
from pathlib import Path

import pytest

import specdec_adapters.registry

import tiny
from specdec_adapters.registry import AdapterMeta, Registry, check_base, repo_identity
from specdec.errors import SpecdecError
from adapter_files import random_adapter, spoil, tar_gz


def test_registry_round_trip_and_refusals(tmp_path, pair):
    from peft import LoraConfig, get_peft_model

    adapter = tmp_path / "adapter"
    get_peft_model(tiny.model(seed=2), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    registry = Registry()
    meta = AdapterMeta(repo_key="../../evil name", version="", repo_root="/r", git_remote="", git_commit="",
                       base_draft="draft", base_draft_hash="abc", target="t")
    with pytest.raises(SpecdecError):
        registry.register(tmp_path, meta)  # not an adapter folder
    meta.repo_key = "demo-1234"
    first = registry.register(adapter, meta)
    second = registry.register(adapter, meta)
    assert [m.version for m in registry.versions("demo-1234")] == ["v1", "v2"] and second.version == "v2"
    archive = registry.export("demo-1234", "v1", tmp_path / "demo.tar.gz")
    assert registry.remove("demo-1234") == ["demo-1234@v1", "demo-1234@v2"] and registry.list() == []
    with pytest.raises(SpecdecError, match="another base draft"):
        registry.import_archive(archive, expected_base_hash="other")
    imported = registry.import_archive(archive, expected_base_hash="abc")
    assert imported.name == "demo-1234@v1" and (registry.path(imported) / "adapter_config.json").is_file()
    check_base(imported, "abc")
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        tf.add(adapter / "adapter_config.json", arcname="../../etc/adapter_config.json")
    with pytest.raises(SpecdecError, match="unsafe path"):
        registry.import_archive(evil)
    assert [m.name for m in registry.list()] == ["demo-1234@v1"]
    assert first.repo_key == "demo-1234"


def test_repository_identity_is_a_usable_adapter_key_for_any_folder_name(tmp_path):
    """Issue #30.10: a folder name with no [A-Za-z0-9._-] character (or the root, from file:///) made every
    completion in it fail with "is not a usable adapter name"."""
    from specdec_adapters.registry import sanitize

    adapter = random_adapter(tmp_path / "adapter", 1)
    registry = Registry()
    folders = [tmp_path / "проект", tmp_path / "プロジェクト", tmp_path / "x" / "プロジェクト", tmp_path / ("long" * 40)]
    keys = []
    for folder in folders:
        folder.mkdir(parents=True)
        keys.append(repo_identity(folder)[0])
    keys.append(repo_identity(Path("/"))[0])
    assert len(set(keys)) == len(keys)  # the hash of the path keeps same-named folders apart
    for key in keys:
        assert sanitize(key) == key  # never cut into the hash, never refused
        registry.register(adapter, AdapterMeta(repo_key=key, version="", repo_root="/r", git_remote="",
                                               git_commit="", base_draft="d", base_draft_hash="h", target="t"))
        assert registry.latest(key).name == f"{key}@v1"


def test_adapters_cli(tmp_path, capsys):
    from specdec.cli import main

    assert main(["adapters", "list"]) == 0 and "no adapters" in capsys.readouterr().out
    assert main(["adapters", "show", "nope"]) == 2
    assert "no adapter nope" in capsys.readouterr().err


def test_import_refuses_duplicate_members_bombs_and_broken_weights_and_export_errors_in_one_line(
        tmp_path, monkeypatch, capsys):
    """Issue #30.13: a second (hostile) meta.json won, a gzip bomb had no limit, garbage / wrong-shape / NaN
    weights were imported; `adapters export` to a missing folder printed a traceback."""
    from specdec.cli import main

    adapter = random_adapter(tmp_path / "adapter", 1)
    meta = AdapterMeta(repo_key="demo-1234", version="", repo_root="/r", git_remote="", git_commit="",
                       base_draft="d", base_draft_hash="h", target="t")
    good = {name: (adapter / name).read_bytes() for name in ("adapter_config.json", "adapter_model.safetensors")}
    good["meta.json"] = json.dumps(vars(meta)).encode()
    hostile = json.dumps({**vars(meta), "repo_key": "someone-elses-repo"}).encode()

    def archive(name: str, extra=(), **replace) -> Path:
        files = {**good, **replace}
        return tar_gz(tmp_path / f"{name}.tar.gz", [(f"demo/{n}", data) for n, data in files.items()] + list(extra))

    registry = Registry()
    monkeypatch.setattr(specdec_adapters.registry, "MAX_UNPACKED", 2 * 2**20, raising=False)
    refusals = {
        "duplicate": (archive("duplicate", [("demo/meta.json", hostile)]), "appears twice"),
        "bomb": (archive("bomb", **{"adapter_model.safetensors": bytes(16 * 2**20)}), "unpacks to more"),
        "link": (tar_gz(tmp_path / "link.tar.gz", [], link="demo/meta.json"), "unsafe path or type"),
        "garbage": (archive("garbage", **{"adapter_model.safetensors": b"\x00" * 64}), "unreadable adapter weights"),
    }
    for how, match in (("shape", "rank 5x4"), ("nan", "NaN"), ("huge", "update reaches")):
        spoilt = spoil(random_adapter(tmp_path / how, 1), how)
        refusals[how] = (archive(how, **{"adapter_model.safetensors":
                                         (spoilt / "adapter_model.safetensors").read_bytes()}), match)
    for name, (path, match) in refusals.items():
        with pytest.raises(SpecdecError, match=match):
            registry.import_archive(path)
        assert registry.list() == [], name
    assert registry.import_archive(archive("good")).name == "demo-1234@v1"

    assert main(["adapters", "export", "demo-1234", str(tmp_path / "missing" / "demo.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such directory" in err and "Traceback" not in err


def meta_for(key: str) -> AdapterMeta:
    return AdapterMeta(repo_key=key, version="", repo_root="/r", git_remote="", git_commit="", base_draft="d",
                       base_draft_hash="h", target="t")


def test_import_refuses_an_update_folding_cannot_survive_and_keeps_a_trained_one(tmp_path):
    """Issue #40.13: finite factors of 1e30 were imported, then every draft pass of the repository failed."""
    import torch
    from safetensors.torch import load_file, save_file

    from specdec.models.lora import MAX_UPDATE, check_adapter, update_peak

    registry = Registry()
    with pytest.raises(SpecdecError, match="beyond what folding into the int8 draft survives"):
        registry.register(spoil(random_adapter(tmp_path / "huge", 1), "huge"), meta_for("demo-1234"))
    loud = random_adapter(tmp_path / "loud", 1, lora_alpha=1e30)  # sane factors, an absurd scaling
    with pytest.raises(SpecdecError, match="update reaches"):
        check_adapter(loud)
    adapter = random_adapter(tmp_path / "adapter", 1)
    check_adapter(adapter)  # a trained-looking one is far inside the bound
    weights = load_file(adapter / "adapter_model.safetensors")
    a_key = sorted(k for k in weights if "lora_A" in k)[0]
    a, b = weights[a_key], weights[a_key.replace("lora_A", "lora_B")]
    exact = float((b.double() @ a.double()).abs().max())
    assert exact <= update_peak(a, b, 1.0) <= MAX_UPDATE  # the cheap bound never understates
    scale = (2 * MAX_UPDATE / exact) ** 0.5  # past the bound, the exact peak decides
    weights[a_key], weights[a_key.replace("lora_A", "lora_B")] = a * scale, b * scale
    save_file(weights, adapter / "adapter_model.safetensors")
    assert update_peak(a * scale, b * scale, 1.0) == pytest.approx(2 * MAX_UPDATE)
    with pytest.raises(SpecdecError, match="down_proj's update reaches 4e\\+03"):  # x lora_alpha / r = 8 / 4
        check_adapter(adapter)
    assert registry.list() == []


def test_a_broken_registry_entry_is_skipped_said_and_removable(tmp_path):
    """Issue #40.13: a meta.json that does not parse, or a version that is not v<int>, made every completion of
    its repository a -32603 error."""
    registry = Registry()
    adapter = random_adapter(tmp_path / "adapter", 1)
    for _ in range(4):
        registry.register(adapter, meta_for("demo-1234"))
    folder = registry.root / "demo-1234"
    (folder / "v2" / "meta.json").write_text("{not json")
    hand_edited = json.loads((folder / "v3" / "meta.json").read_text())
    (folder / "v3" / "meta.json").write_text(json.dumps({**hand_edited, "version": "vX"}))
    (folder / "v4" / "meta.json").write_text(json.dumps({**hand_edited, "version": "v1"}))  # not its folder's
    fresh = Registry()
    assert [m.version for m in fresh.versions("demo-1234")] == ["v1"]
    assert fresh.latest("demo-1234").name == "demo-1234@v1"
    assert len(fresh.problems) == 3 and all("\n" not in p for p in fresh.problems)
    assert [p.split("demo-1234/")[1][:2] for p in fresh.problems] == ["v2", "v3", "v4"]
    assert all("specdec adapters remove demo-1234@v" in p for p in fresh.problems)
    assert registry.register(adapter, meta_for("demo-1234")).version == "v5"  # past the broken ones too
    assert registry.remove("demo-1234", "v2") == ["demo-1234@v2"]
    assert registry.remove("demo-1234") == ["demo-1234@v1", "demo-1234@v3", "demo-1234@v4", "demo-1234@v5"]
    assert not folder.exists()


def test_adapters_list_says_a_broken_entry_in_one_line(tmp_path, capsys):
    from specdec.cli import main

    registry = Registry()
    meta = registry.register(random_adapter(tmp_path / "adapter", 1), meta_for("demo-1234"))
    (registry.path(meta) / "meta.json").write_text("{not json")
    assert main(["adapters", "list"]) == 0
    out, err = capsys.readouterr()
    assert "no adapters" in out and err.count("\n") == 1 and "corrupt adapter metadata" in err
