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
    for how, match in (("shape", "rank 5x4"), ("nan", "NaN")):
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
