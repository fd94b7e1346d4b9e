"""Online adaptation in the server (lsp_server/online.py): when a refresh runs, how it pauses, the swap, the record."""

import asyncio
import threading
import time

import pytest

import tiny
import torch
from adapter_files import random_adapter
from lsp_server.metrics import MetricsStore
from lsp_server.service import CompletionService, EditorRequest
from lsp_server.settings import Settings, SettingsError
from repos import make_repo


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny.save(root, seed=1, name="target"), tiny.save(root, seed=2, name="draft")  # adapter_files' shape


def loaded_host(models, **options):
    from lsp_server.hosts import ModelHost

    host = ModelHost()
    settings = Settings().update({"target": str(models[0]), "draft": str(models[1]), "dtype": "fp32",
                                  "strategy": "draft", "debounceMs": 0, **options})
    host.load(settings)
    assert host.state == "ready" and host.switchable is not None, host.error
    return host, settings


def hole(repo, i: int) -> tuple[str, str]:
    text = (repo / f"mod_{i}.py").read_text()
    cut = text.index("\n", text.index("wibble=6")) + 5
    return text[:cut], text[cut:]


def test_online_settings_are_off_by_default_and_bounded():
    s = Settings()
    defaults = (s.online_adaptation, s.online_every_accepted, s.online_steps, s.online_idle_seconds)
    assert defaults == (False, 20, 8, 10)
    on = s.update({"onlineAdaptation": True, "onlineEveryAccepted": 5, "onlineSteps": 3, "onlineIdleSeconds": 2.5})
    assert (on.online_adaptation, on.online_every_accepted, on.online_steps, on.online_idle_seconds) == \
        (True, 5, 3, 2.5)
    assert not on.models_differ(s) and on.output_key() == s.output_key()  # no reload, cached suggestions stay
    for bad, key in (({"onlineAdaptation": "yes"}, "onlineAdaptation"), ({"onlineEveryAccepted": 1}, "onlineEvery"),
                     ({"onlineEveryAccepted": 5000}, "onlineEvery"), ({"onlineSteps": 0}, "onlineSteps"),
                     ({"onlineSteps": 2.5}, "onlineSteps"), ({"onlineIdleSeconds": 0.1}, "onlineIdleSeconds"),
                     ({"onlineIdleSeconds": float("inf")}, "onlineIdleSeconds")):
        with pytest.raises(SettingsError, match=key):
            s.update(bad)


def test_refresh_records_are_kept_apart_from_requests(tmp_path):
    """A refresh is a metrics record of its own kind: before/after acceptance in specdec/stats, no request counts."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = MetricsStore(tmp_path / "m.jsonl")
    store.serve_prometheus(port)
    row = {"kind": "online", "time": time.time(), "language": "", "workspace": "/w", "adapter": "w-1@v2",
           "previous": "w-1@v1", "kept": True, "acceptance_before": 0.5, "acceptance_after": 0.6, "heldout": 2,
           "accepted_samples": 6, "edited_samples": 8, "edited_files": 2, "dropped_files": 1, "steps": 8,
           "seconds": 90.0, "paused_seconds": 3.0, "cpu_seconds": 80.0, "skipped": "", "error": ""}
    store.add(row)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'specdec_online_refreshes_total{outcome="kept"} 1.0' in body
    store.add({**row, "kept": "maybe"})  # malformed: skipped, not fatal
    summary = store.summary()
    assert summary["online"] == [row] and summary["skipped_records"] == 1
    assert summary["total"]["requests"] == 0 and summary["workspaces"] == [] and summary["adapters"] == []
    assert MetricsStore(tmp_path / "m.jsonl").summary()["online"] == [row]  # it survives a restart


def test_the_hot_swap_changes_the_drafts_proposals_waits_for_the_generation_and_stays_lossless(models, tmp_path):
    from specdec.engine.sampling import SamplingConfig
    from specdec.engine.session import GenerationConfig, greedy_reference
    from specdec_adapters.registry import AdapterMeta, Registry, repo_identity

    host, settings = loaded_host(models)
    online = CompletionService(host, MetricsStore(tmp_path / "m.jsonl"), settings).online
    repo = make_repo(tmp_path / "ws", files=2)
    key, registry = repo_identity(repo)[0], Registry()

    def register(seed: int, made_online: bool = True):
        return registry.register(random_adapter(tmp_path / f"adapter{seed}", seed), AdapterMeta(
            repo_key=key, version="", repo_root=str(repo), git_remote="", git_commit="", base_draft=str(models[1]),
            base_draft_hash=host.draft_hash, target=str(models[0]), training={"online": made_online}))

    prefix, suffix = hole(repo, 0)
    prompt = host.completer.prompt(prefix, suffix).ids
    drafter = host.completer.session.drafter

    def proposals():
        def run():
            drafter.reset()
            return drafter.propose(prompt, 4, SamplingConfig()).tokens
        return host.executor.submit(run).result(10)

    def draft_logits():  # the draft's belief after the prompt: what an adapter changes, whatever its argmax
        def run():
            with torch.inference_mode():
                return host.switchable.model(torch.tensor([prompt])).logits[0, -1].float()
        return host.executor.submit(run).result(10)

    base = proposals()
    finetuned = register(0, made_online=False)  # what `specdec finetune` made: never removed
    host.executor.submit(online._swap, str(repo)).result(10)
    assert host.adapter == finetuned.name
    first = register(1)
    host.executor.submit(online._swap, str(repo)).result(10)
    drafted_first, first_logits = proposals(), draft_logits()
    assert host.adapter == first.name and drafted_first != base

    started, go = threading.Event(), threading.Event()

    def hold(text):  # runs in the worker between decode steps: hold the generation there
        started.set()
        go.wait(10)
        return None

    running = host.executor.submit(host.completer.complete, prefix, suffix, GenerationConfig(24), None, hold)
    assert started.wait(10)
    second = register(2)
    swap = host.executor.submit(online._swap, str(repo))
    time.sleep(0.2)
    assert not swap.done() and host.adapter == first.name and host.switchable.active == first.name
    go.set()
    assert running.result(10).stats.drafted > 0
    swap.result(10)
    assert host.adapter == second.name and first.name not in host.switchable.loaded
    assert [m.name for m in registry.versions(key)] == [finetuned.name, second.name]  # the replaced one is gone
    assert not torch.equal(draft_logits(), first_logits)  # the new adapter drafts (its argmax may agree)

    session = host.completer.session
    out = host.executor.submit(host.completer.complete, prefix, suffix, GenerationConfig(24)).result(10)
    assert out.stats.drafted > 0
    assert out.tokens == greedy_reference(session.target.model, prompt, 24, session.stop_token_ids)


async def test_a_refresh_runs_after_n_accepted_at_idle_and_is_stopped_while_a_completion_runs(models, tmp_path):
    import psutil

    host, settings = loaded_host(models)
    service = CompletionService(host, MetricsStore(tmp_path / "m.jsonl"), settings.update({
        "onlineAdaptation": True, "onlineEveryAccepted": 3, "onlineSteps": 2, "onlineIdleSeconds": 1}))
    online = service.online
    repo = make_repo(tmp_path / "ws", files=6)
    seen = []  # the refresh child's state as each generation runs, and the CPU time it used meanwhile
    generate = host.generate

    def observed(*args):
        if args[0].prefetch:  # the suggestion an accept prefetches (service._prefetch_after): not the user's
            return generate(*args)
        child = online.process and psutil.Process(online.process.pid)
        if not child:
            seen.append(None)
            return generate(*args)
        deadline = time.monotonic() + 2  # SIGSTOP takes effect when the kernel next schedules the child
        while child.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.001)
        state, cpu = child.status(), sum(child.cpu_times()[:2])
        try:
            return generate(*args)
        finally:
            seen.append((state, sum(child.cpu_times()[:2]) - cpu))

    host.generate = observed

    async def complete(i: int, accept: bool = True):
        prefix, suffix = hole(repo, i)
        suggestion = await service.complete(EditorRequest.at((repo / f"mod_{i}.py").as_uri(), "python", str(repo),
                                                              prefix, suffix, True, path=f"mod_{i}.py"))
        assert suggestion is not None and suggestion.source == "model"
        if accept:
            assert service.accept(suggestion.id)

    async def until(condition, timeout: float):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, online.status()
            await asyncio.sleep(0.05)

    for i in range(2):
        await complete(i)
    assert online.status()["state"] == "collecting" and online.status()["accepted_since_refresh"] == {str(repo): 2}
    await complete(2)
    assert online.status()["state"] == "waiting for idle" and online.process is None
    await asyncio.sleep(0.6)
    await complete(3, accept=False)  # the user is still at work: the idle clock starts again
    idle_since = time.monotonic()
    await until(lambda: online.process is not None, 10)
    assert time.monotonic() - idle_since >= 0.9 and seen == [None] * 4
    assert online.status()["state"] == "running"

    await complete(4, accept=False)  # arrives while the child works: stopped before the generation starts
    assert seen[-1] == (psutil.STATUS_STOPPED, 0) and online.status()["state"] == "paused"
    child = psutil.Process(online.process.pid)
    await until(lambda: online.status()["state"] == "running", 5)  # resumed once idle again
    assert child.status() != psutil.STATUS_STOPPED

    await until(lambda: online.history, 600)
    row = online.history[-1]
    assert row["error"] == "" and row["steps"] == 2 and row["paused_seconds"] > 0.5, row
    assert row["heldout"] == 1 and row["accepted_samples"] == 2 and row["edited_files"] >= 1
    assert row["acceptance_after"] >= row["acceptance_before"] if row["kept"] else \
        row["acceptance_after"] < row["acceptance_before"]
    assert row["cpu_seconds"] > 0 and online.status()["accepted_since_refresh"] == {str(repo): 0}
    assert service.metrics.summary()["online"] == [row]
    if row["kept"]:  # swapped in at idle, on the model worker
        await until(lambda: online.swaps, 5)
        await online.swaps[-1]
        assert host.adapter == row["adapter"]
        await complete(5, accept=False)
        assert service.metrics.summary()["adapters"][-1]["adapter"] == row["adapter"]


async def test_turning_it_off_stops_the_refresh_and_forgets_the_texts(models, tmp_path):
    host, settings = loaded_host(models)
    on = settings.update({"onlineAdaptation": True, "onlineEveryAccepted": 2, "onlineIdleSeconds": 1})
    service = CompletionService(host, MetricsStore(tmp_path / "m.jsonl"), on)
    repo = make_repo(tmp_path / "ws", files=3)
    for i in range(2):
        prefix, suffix = hole(repo, i)
        suggestion = await service.complete(EditorRequest.at((repo / f"mod_{i}.py").as_uri(), "python", str(repo),
                                                              prefix, suffix, True, path=f"mod_{i}.py"))
        service.accept(suggestion.id)
    online = service.online
    assert online.accepted[str(repo)] and online.edited[str(repo)]
    service.forget((repo / "mod_0.py").as_uri())  # didClose: its full text goes
    assert list(online.edited[str(repo)]) == [(repo / "mod_1.py").as_uri()]
    deadline = time.monotonic() + 10
    while online.process is None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    process, task = online.process, online._task
    service.settings = on.update({"onlineAdaptation": False})
    assert await asyncio.wait_for(process.wait(), 10) != 0
    assert not online.accepted and not online.edited and not online.pending and online.status()["state"] == "off"
    await asyncio.wait_for(task, 10)
    assert online.history[-1]["error"] and not online.history[-1]["kept"]


def test_both_trainers_are_told_the_forward_the_server_serves_with():
    """The online refresh's job and `specdec finetune`'s command line carry the server's `forward` (the target
    teaches on it, and a native one reads its GGUF's codes rather than a conversion); a job with an unknown one
    is refused in one line."""
    import json
    from types import SimpleNamespace

    from lsp_server.finetune_child import Finetuning
    from lsp_server.online import OnlineAdaptation
    from specdec.errors import SpecdecError
    from specdec.models.online_job import OnlineJob

    for forward in ("auto", "native", "transformers"):
        settings = Settings().update({"forward": forward})
        job = OnlineAdaptation(SimpleNamespace(draft_hash="abc"), None, settings).job("/w")
        assert OnlineJob.parse(json.loads(job.to_json())).forward == forward
        argv = Finetuning(SimpleNamespace(settings=settings)).argv("/w", {})
        assert argv[argv.index("--forward") + 1] == forward
    with pytest.raises(SpecdecError, match="forward must be one of"):
        OnlineJob.parse({"workspace": "/w", "draft": "d", "target": "t", "forward": "gpu"})
