"""The server serves each workspace's adapter, hot-swaps new ones and falls back from broken ones."""

from types import SimpleNamespace

import pytest

import tiny
from specdec_adapters.registry import AdapterMeta, Registry, repo_identity
from specdec.errors import SpecdecError
from adapter_files import random_adapter, spoil
from repos import make_repo


@pytest.mark.parametrize("how", ["nan", "shape", "garbage"])
def test_a_broken_adapter_falls_back_to_the_base_draft_with_a_warning(tmp_path, how):
    """Issue #30.13: after a broken adapter was loaded every completion in its repository came back empty."""
    import torch

    from lsp_server.service import ModelHost
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
        host._use_adapter(str(repo))  # the request goes on with the base draft
        assert host.adapter == "" and draft.active is None
    assert host.adapter_error.startswith(meta.name) and len(warnings) == 1 and meta.name in warnings[0]
    assert host.adapter_for(str(repo)) is None  # its requests and cache hits are the base draft's
    assert torch.equal(draft.model(ids).logits, base)


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
