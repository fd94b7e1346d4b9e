"""The server serves each workspace's adapter, hot-swaps new ones and falls back from broken ones."""

import os
from types import SimpleNamespace

import pytest

import tiny
from specdec_adapters.registry import AdapterMeta, Registry, repo_identity
from specdec.errors import SpecdecError
from adapter_files import random_adapter, spoil
from repos import make_repo


@pytest.mark.parametrize("how", ["nan", "shape", "garbage", "huge"])
def test_a_broken_adapter_falls_back_to_the_base_draft_with_a_warning(tmp_path, how):
    """Issue #30.13: after a broken adapter was loaded every completion in its repository came back empty;
    #40.13: so did one of finite but huge factors (1e30), imported before import refused them."""
    import torch

    from lsp_server.hosts import ModelHost
    from specdec.models.lora import SwitchableDraft

    draft = SwitchableDraft(tiny.model(seed=2))
    ids = torch.tensor([[10, 11, 12, 13]])
    base = draft.model(ids).logits
    with pytest.raises(SpecdecError):
        draft.activate("broken", spoil(random_adapter(tmp_path / "broken", 1), how))
    assert draft.active is None and "broken" not in draft.model.peft_config
    assert torch.equal(draft.model(ids).logits, base)

    repo = tmp_path / "repo"
    repo.mkdir()
    registry = Registry()
    meta = registry.register(random_adapter(tmp_path / "adapter", 1), AdapterMeta(
        repo_key=repo_identity(repo)[0], version="", repo_root=str(repo), git_remote="", git_commit="",
        base_draft="d", base_draft_hash="h", target="t"))
    spoil(registry.path(meta), how)  # broken after it was registered (a disk error, a hand edit)
    host, warnings = ModelHost(), []
    host.switchable, host.draft_hash, host.on_warning = draft, "h", warnings.append
    host.completer = SimpleNamespace(session=SimpleNamespace(drafter=None))
    assert host.adapter_for(str(repo)).name == meta.name
    for _ in range(2):
        host.use_adapter(str(repo))  # the request goes on with the base draft
        assert host.adapter == "" and draft.active is None
    assert host.adapter_error.startswith(meta.name) and len(warnings) == 1 and meta.name in warnings[0]
    assert host.adapter_for(str(repo)) is None  # its requests and cache hits are the base draft's
    assert torch.equal(draft.model(ids).logits, base)


def test_folding_into_non_finite_weights_leaves_the_draft_as_it_was(tmp_path, monkeypatch):
    """The fold's own check, behind check_adapter's bound: a non-finite folded weight is refused, never served."""
    import torch

    from specdec.models import lora
    from specdec.models.lora import SwitchableDraft

    draft = SwitchableDraft(tiny.model(seed=2))
    ids = torch.tensor([[10, 11, 12, 13]])
    base = draft.model(ids).logits
    monkeypatch.setattr(lora, "MAX_UPDATE", float("inf"))  # past import's bound, as an adapter of older code
    with pytest.raises(SpecdecError, match="non-finite weights when folded"):
        draft.activate("huge", spoil(random_adapter(tmp_path / "huge", 1), "huge"))
    assert draft.active is None and "huge" not in draft.model.peft_config and not draft.folded
    assert torch.equal(draft.model(ids).logits, base)
    assert draft.activate("good", random_adapter(tmp_path / "good", 1)) and draft.active == "good"


def register_for(repo, adapter, base_hash: str = "h"):
    return Registry().register(adapter, AdapterMeta(
        repo_key=repo_identity(repo)[0], version="", repo_root=str(repo), git_remote="", git_commit="",
        base_draft="d", base_draft_hash=base_hash, target="t"))


def test_a_broken_registry_entry_falls_back_with_one_warning(tmp_path):
    """Issue #40.13: a meta.json that does not parse, or a version that is not v<int>, made every completion of
    its repository a -32603 error. The entry is skipped: the repository's other versions, else the base draft."""
    from lsp_server.hosts import ModelHost
    from specdec.models.lora import SwitchableDraft

    only, older = tmp_path / "only", tmp_path / "older"
    for repo in (only, older):
        repo.mkdir()
    registry = Registry()
    broken = register_for(only, random_adapter(tmp_path / "a", 1))
    (registry.path(broken) / "meta.json").write_text("{not json")
    kept = register_for(older, random_adapter(tmp_path / "b", 2))
    renamed = register_for(older, random_adapter(tmp_path / "c", 3))
    meta_file = registry.path(renamed) / "meta.json"
    meta_file.write_text(meta_file.read_text().replace('"v2"', '"2"'))
    host, warnings = ModelHost(), []
    host.switchable, host.draft_hash, host.on_warning = SwitchableDraft(tiny.model(seed=2)), "h", warnings.append
    host.completer = SimpleNamespace(session=SimpleNamespace(drafter=None))
    for _ in range(3):
        assert host.adapter_for(str(only)) is None
        assert host.adapter_for(str(older)).name == kept.name
        host.use_adapter(str(only))
        assert host.adapter == "" and host.switchable.active is None
        host.use_adapter(str(older))
        assert host.adapter == kept.name
    assert len(warnings) == 2 and all("\n" not in w for w in warnings)
    assert "corrupt adapter metadata" in warnings[0] and broken.name.replace("@", "/") in warnings[0]
    assert "version '2' is not its folder's v<number>" in warnings[1]
    assert host.adapter_error


def by_adapter(rows: list[dict]) -> dict:
    return {(r["workspace"], r["adapter"]): r for r in rows}


async def test_server_uses_each_workspaces_adapter_and_hot_swaps_a_new_one(tmp_path, pair):
    """Repo A has an adapter, repo B none; fine-tuning B from the editor makes B's next request use B's."""
    import asyncio

    from lsprotocol import types

    import lsp_client as lc
    from specdec.models.loading import LoadedModel
    from specdec.models.store import resolve

    target, draft = pair
    repo_a, repo_b = make_repo(tmp_path / "a", files=4), make_repo(tmp_path / "b", files=4)
    adapter = tmp_path / "adapter"
    from peft import LoraConfig, get_peft_model

    get_peft_model(tiny.model(seed=2), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(adapter)
    env = {"SPECDEC_DATA_DIR": str(tmp_path / "data")}
    base_hash = LoadedModel(str(draft), resolve(str(draft)), None, None).weight_hash
    import os

    os.environ["SPECDEC_DATA_DIR"] = env["SPECDEC_DATA_DIR"]
    key_a = repo_identity(repo_a)[0]
    Registry().register(adapter, AdapterMeta(repo_key=key_a, version="", repo_root=str(repo_a), git_remote="",
                                             git_commit="", base_draft=str(draft), base_draft_hash=base_hash,
                                             target=str(target)))
    client = await lc.start(tmp_path, {"target": str(target), "draft": str(draft), "dtype": "fp32",
                                       "debounceMs": 0, "maxNewTokens": 8, "strategy": "draft"},
                            env=env, workspace=repo_a, folders=[repo_a, repo_b])
    try:
        await lc.wait_ready(client)
        for repo in (repo_a, repo_b):
            uri = (repo / "mod_1.py").as_uri()
            lc.open_doc(client, uri, (repo / "mod_1.py").read_text())
            await lc.inline(client, uri, 4, 4, invoked=True)
        adapters = by_adapter((await lc.stats(client))["adapters"])
        assert adapters[(str(repo_a), f"{key_a}@v1")]["model_requests"] == 1
        assert adapters[(str(repo_b), "base")]["model_requests"] == 1

        started = await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="specdec.finetune", arguments=[repo_b.as_uri(), {"max_steps": 3, "force": True}]))
        assert lc.plain(started)["started"] is True
        for _ in range(600):
            finetune = (await lc.stats(client))["finetune"]
            if finetune:
                break
            await asyncio.sleep(0.2)
        assert finetune["returncode"] == 0 and finetune["registered"], finetune
        assert any("registered" in m.message for m in client.messages)
        kinds = [p.kind for token, reports in client.progress_reports.items() if "finetune" in str(token)
                 for p in reports]
        assert kinds[0] == "begin" and "report" in kinds and kinds[-1] == "end"
        uri_b = (repo_b / "mod_2.py").as_uri()
        lc.open_doc(client, uri_b, (repo_b / "mod_2.py").read_text())
        await lc.inline(client, uri_b, 4, 4, invoked=True)
        adapters = by_adapter((await lc.stats(client))["adapters"])
        assert adapters[(str(repo_b), finetune["registered"])]["model_requests"] == 1
        assert adapters[(str(repo_a), f"{key_a}@v1")]["model_requests"] == 1  # A untouched
    finally:
        await client.shutdown_session()
        await client.stop()


async def test_broken_entries_still_complete_from_the_base_draft_with_one_warning_each(tmp_path, pair):
    """Issue #40.13 over the real server: repository A's entry has a meta.json that does not parse, B's adapter
    finite factors of 1e30 (imported before import refused them). Every completion is answered, on the base
    draft, and each entry is said once (window/showMessage), however many requests follow."""
    from lsprotocol import types

    import lsp_client as lc
    from specdec.models.loading import LoadedModel
    from specdec.models.store import resolve

    target, draft = pair
    repo_a, repo_b = make_repo(tmp_path / "a", files=4), make_repo(tmp_path / "b", files=4)
    env = {"SPECDEC_DATA_DIR": str(tmp_path / "data")}
    os.environ["SPECDEC_DATA_DIR"] = env["SPECDEC_DATA_DIR"]
    base_hash = LoadedModel(str(draft), resolve(str(draft)), None, None).weight_hash
    registry = Registry()
    meta_a = register_for(repo_a, random_adapter(tmp_path / "adapter_a", 1), base_hash)
    (registry.path(meta_a) / "meta.json").write_text("{not json")
    meta_b = register_for(repo_b, random_adapter(tmp_path / "adapter_b", 2), base_hash)
    spoil(registry.path(meta_b), "huge")
    client = await lc.start(tmp_path, {"target": str(target), "draft": str(draft), "dtype": "fp32",
                                       "debounceMs": 0, "maxNewTokens": 8, "strategy": "draft"},
                            env=env, workspace=repo_a, folders=[repo_a, repo_b])
    try:
        assert (await lc.wait_ready(client))["model"]["state"] == "ready"
        for line in (4, 5, 6):
            for repo in (repo_a, repo_b):
                uri = (repo / "mod_1.py").as_uri()
                if line == 4:
                    lc.open_doc(client, uri, (repo / "mod_1.py").read_text())
                await lc.inline(client, uri, line, 0, invoked=True)  # an error reply would raise here
        stats = await lc.stats(client)
        assert stats["model"]["adapter"] == "" and stats["model"]["adapter_error"]
        rows = by_adapter(stats["adapters"])
        assert rows[(str(repo_a), "base")]["requests"] == 3 and rows[(str(repo_a), "base")]["model_requests"] >= 1
        assert rows[(str(repo_b), meta_b.name)]["model_requests"] == 1  # asked for with B's adapter, run on the base
        assert rows[(str(repo_b), "base")]["requests"] == 2  # after it (the model, or typeahead on its text)
        said = [m.message for m in client.messages if m.type == types.MessageType.Warning]
        assert len([m for m in said if "corrupt adapter metadata" in m]) == 1, said
        assert len([m for m in said if meta_b.name in m and "update reaches" in m]) == 1, said
        assert len(said) == 2, said
    finally:
        await client.shutdown_session()
        await client.stop()
