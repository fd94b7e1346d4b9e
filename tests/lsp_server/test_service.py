"""Scheduling without a model: cache, type-ahead, debounce, supersession, cancellation, failures."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from lsp_server.metrics import MetricsStore
from lsp_server.service import CompletionService, EditorRequest
from lsp_server.settings import Settings, SettingsError
from specdec.backends import CompletionResult
from specdec.engine.session import GenerationStats


class FakeHost:
    """Generates `text` one 'step' (20 ms) per character, honouring the cancel token between steps."""

    def __init__(self, text="return a + b", step=0.02, fail=False):
        self.ready, self.state, self.error, self.adapter = True, "ready", "", ""
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.text, self.step, self.fail = text, step, fail
        self.calls, self.cancelled_at, self.traced = [], [], []
        self.steps = 0  # characters made, all generations together

    def adapter_for(self, workspace):
        return None

    def prefill(self, request, settings, cancel, closed=None):
        return not cancel.cancelled  # nothing to warm: the fake generates from nothing

    def generate(self, request, ctx, settings, cancel, progress=None):
        self.calls.append(request.completion.prefix)
        self.traced.append(request.completion.trace)
        if self.fail:
            raise RuntimeError("model exploded")
        out = ""
        for ch in self.text:
            if cancel.cancelled:
                self.cancelled_at.append(len(out))
                return out, CompletionResult(out, "cancelled", GenerationStats().as_dict())
            time.sleep(self.step)
            out += ch
            self.steps += 1
            if progress is not None:
                progress(out)
        stats = GenerationStats(new_tokens=len(out), produced=len(out) + 1, drafted=10, accepted=7, target_passes=4,
                                seconds=0.3)
        return out, CompletionResult(out, "eos", stats.as_dict())


def service(tmp_path, host=None, **settings):
    defaults = {"debounce_ms": 0}
    return CompletionService(host or FakeHost(), MetricsStore(tmp_path / "m.jsonl"),
                             Settings().update({**defaults, **settings}))


def request(prefix="def add(a, b):\n    ", suffix="\n", uri="file:///w/a.py", invoked=False):
    return EditorRequest.at(uri, "python", "/w", prefix, suffix, invoked)


async def test_model_then_cache(tmp_path):
    svc = service(tmp_path)
    first = await svc.complete(request())
    assert first.text == "return a + b" and first.source == "model"
    again = await svc.complete(request())
    assert again.source == "cache" and again.text == first.text
    assert len(svc.host.calls) == 1  # the model was not asked again


async def test_p_and_q_are_asked_per_request_once_traces_were_asked_whatever_the_host(tmp_path):
    """specdec/trace's ask is a field of every later request (CompletionRequest.trace), not a host's switch: a new
    host (an engine switch) gets it too."""
    svc = service(tmp_path)
    await svc.complete(request())
    svc.traces.asked = True  # what specdec/trace does
    await svc.complete(request(prefix="x = 1\n"))
    first, svc.host = svc.host, FakeHost()
    svc.online.host = svc.host
    await svc.complete(request(prefix="y = 2\n"))
    assert first.traced == [False, True] and svc.host.traced == [True]


async def test_typeahead_serves_the_rest_without_the_model(tmp_path):
    svc = service(tmp_path)
    await svc.complete(request())
    typed = await svc.complete(request(prefix="def add(a, b):\n    retu"))
    assert typed.source == "typeahead" and typed.text == "rn a + b"
    assert await svc.complete(request(prefix="def add(a, b):\n    rex")) is not None  # diverged: model again
    assert len(svc.host.calls) == 2


async def test_debounce_supersedes_older_request(tmp_path):
    svc = service(tmp_path, debounce_ms=100)
    old = asyncio.ensure_future(svc.complete(request(prefix="def add(a, b):\n    r")))
    await asyncio.sleep(0.02)
    new = await svc.complete(request(prefix="def add(a, b):\n    re"))
    assert await old is None and new is not None
    assert svc.counters["superseded"] == 1 and svc.host.calls == ["def add(a, b):\n    re"]


async def test_newer_request_cancels_running_generation(tmp_path):
    host = FakeHost(text="x" * 200)
    svc = service(tmp_path, host)
    running = asyncio.ensure_future(svc.complete(request(prefix="a = ")))
    await asyncio.sleep(0.1)
    newer = asyncio.ensure_future(svc.complete(request(prefix="a = 1")))
    assert await running is None
    assert host.cancelled_at and host.cancelled_at[0] < 20  # stopped within a step of the cancel
    assert (await newer).text == "x" * 200


async def test_cancel_request_stops_generation_within_one_step(tmp_path):
    host = FakeHost(text="y" * 500)
    svc = service(tmp_path, host)
    task = asyncio.ensure_future(svc.complete(request()))
    while not host.steps:  # generating
        await asyncio.sleep(0.01)
    task.cancel()
    steps_at_cancel = host.steps
    with pytest.raises(asyncio.CancelledError):
        await task
    assert svc.counters["cancelled"] == 1 and host.cancelled_at
    assert host.cancelled_at[0] <= steps_at_cancel + 1  # the worker stopped within one step of the cancel


async def test_stale_waiters_are_dropped_newest_first(tmp_path):
    host = FakeHost(text="z" * 15)
    svc = service(tmp_path, host)
    docs = [asyncio.ensure_future(svc.complete(request(prefix=f"v{i} = ", uri=f"file:///w/{i}.py"))) for i in range(5)]
    results = await asyncio.gather(*docs)
    served = [i for i, r in enumerate(results) if r is not None]
    assert 0 in served and 4 in served  # the running one and the newest
    assert svc.counters["dropped"] >= 2


async def test_model_failure_answers_empty_and_next_request_works(tmp_path):
    host = FakeHost(fail=True)
    svc = service(tmp_path, host)
    assert await svc.complete(request()) is None
    assert svc.counters["errors"] == 1
    host.fail = False
    assert (await svc.complete(request())).text == "return a + b"


async def test_not_ready_answers_empty_at_once(tmp_path):
    host = FakeHost()
    host.ready, host.state = False, "loading"
    svc = service(tmp_path, host, debounce_ms=5000)
    # answered before the debounce would end: never held for a model that is not there
    assert await asyncio.wait_for(svc.complete(request()), 2.5) is None
    assert host.calls == []


async def test_strings_only_when_invoked_and_disabled_languages(tmp_path):
    svc = service(tmp_path)
    in_string = request(prefix='x = "hel', suffix='lo"\n')
    assert await svc.complete(in_string) is None
    in_string.invoked = True
    assert await svc.complete(in_string) is not None
    svc.settings = svc.settings.update({"languages": ["go"]})
    assert await svc.complete(request(prefix="y = ")) is None


async def test_the_syntax_is_read_off_the_event_loop_in_arrival_order(tmp_path, monkeypatch):
    """tree-sitter over a big document's window takes tens of ms: never on the event loop's thread, and requests
    still go on in the order they came (the older one is superseded by the newer, not the other way round)."""
    from lsp_server import service as service_module

    analysed, analyze = [], service_module.syntax.analyze

    def spy(language, prefix, suffix):
        analysed.append((threading.current_thread() is threading.main_thread(), prefix))
        time.sleep(0.05 if prefix.endswith("r") else 0)  # the older request's analysis is the slower one
        return analyze(language, prefix, suffix)

    monkeypatch.setattr(service_module.syntax, "analyze", spy)
    svc = service(tmp_path, debounce_ms=50)
    old = asyncio.ensure_future(svc.complete(request(prefix="def add(a, b):\n    r")))
    await asyncio.sleep(0.01)
    new = await svc.complete(request(prefix="def add(a, b):\n    re"))
    assert await old is None and new is not None and svc.counters["superseded"] == 1
    assert analysed == [(False, "def add(a, b):\n    r"), (False, "def add(a, b):\n    re")]


async def test_acceptance_is_counted_once_per_suggestion(tmp_path):
    svc = service(tmp_path)
    s = await svc.complete(request())
    assert svc.accept(s.id) and not svc.accept(s.id) and not svc.accept("nope")
    summary = svc.metrics.summary()
    lang = summary["languages"]["python"]
    assert lang["shown"] == 1 and lang["accepted"] == 1 and lang["user_accept_rate"] == 1.0
    assert lang["acceptance_rate"] == pytest.approx(0.7)
    assert lang["tokens_per_pass"] == pytest.approx((len("return a + b") + 1) / 4)  # the stop token counts


def test_settings_camel_case_section_and_validation():
    s = Settings().update({"specdec": {"maxNewTokens": 32, "debounceMs": 50, "languages": "python, go"}})
    assert (s.max_new_tokens, s.debounce_ms, s.languages) == (32, 50, ("python", "go"))
    assert s.update({"draftQuant": "int8-down-fp32"}).draft_quant == "int8-down-fp32"
    assert Settings().dtype == "auto" and s.update({"dtype": "bf16"}).dtype == "bf16"
    for bad in ({"strategy": "magic"}, {"draftQuant": "int4"}, {"dtype": "fp16"}, {"maxNewTokens": "many"}, {"maxNewTokens": 0}, {"enabled": "yes"}, [1, 2]):
        with pytest.raises(SettingsError):
            s.update(bad)
    assert s.update({"unknownKey": 1}) == s


@pytest.mark.parametrize("bad, key", [
    ({"maxDraft": 1e9}, "maxDraft"), ({"maxNewTokens": 1e9}, "maxNewTokens"),  # item 3: unbounded budgets
    ({"prometheusPort": 70000}, "prometheusPort"), ({"prometheusPort": 80}, "prometheusPort"),  # item 4
    ({"fimFamily": "gpt"}, "fimFamily"), ({"temperature": float("nan")}, "temperature"),  # item 5
    ({"temperature": 1e-300}, "temperature"), ({"temperature": float("inf")}, "temperature"),
    ({"temperature": 99}, "temperature"), ({"topP": 1e-300}, "topP"), ({"topP": 0}, "topP"),
    ({"maxNewTokens": "16"}, "maxNewTokens"), ({"max_suffix_tokens": -1}, "maxSuffixTokens"),
    ({"specdec": {"maxSnippetTokens": -1}}, "maxSnippetTokens"), ({"maxDraft": 2.5}, "maxDraft"),
    ({"debounceMs": True}, "debounceMs"), ({"languages": [1]}, "languages"), ({"target": 3}, "target"),
    ({"target": ""}, "target"),
])
def test_every_bad_value_is_refused_naming_the_key_and_range(bad, key):
    """Issue #30 items 3-5: one schema refuses each bad value with the key and what it allows."""
    with pytest.raises(SettingsError, match=key) as caught:
        Settings().update(bad)
    assert " must be " in str(caught.value)


def test_schema_is_complete_and_defaults_are_valid():
    from dataclasses import fields

    from lsp_server.settings import schema
    from specdec.prompts.fim import TEMPLATES

    Settings().validate()
    rows = {row["key"]: row for row in schema()}
    assert len(rows) == len(fields(Settings))
    for row in rows.values():
        assert row["doc"] and row["type"] in ("boolean", "integer", "number", "string", "array"), row
        if row["type"] in ("integer", "number"):  # every number is bounded
            assert row["minimum"] is not None and row["maximum"] is not None, row
    assert rows["fimFamily"]["choices"] == ["", *TEMPLATES]
    assert rows["temperature"]["zeroAllowed"] and rows["prometheusPort"]["zeroAllowed"]
    assert {k for k, r in rows.items() if r["reloadsModels"]} == {"target", "draft", "dtype", "draftQuant", "targetQuant",
                                                                     "int4Kernel", "forward", "adapters", "engine",
                                                                     "engineUrl"}
    good = Settings().update({"temperature": 0, "topP": 1, "prometheusPort": 9464, "maxNewTokens": 32.0,
                              "maxSuffixTokens": 0, "fimFamily": "starcoder"})
    assert (good.temperature, good.max_new_tokens, good.fim_family) == (0.0, 32, "starcoder")
    assert isinstance(good.max_new_tokens, int) and isinstance(good.top_p, float)
    assert Settings().update({"strategy": "lookup", "draft": ""}).draft == ""
    with pytest.raises(SettingsError, match="draft"):
        Settings().update({"strategy": "draft", "draft": ""})  # would fail only at the next load


def test_a_refused_change_applies_nothing():
    s = Settings().update({"maxNewTokens": 32})
    with pytest.raises(SettingsError) as caught:
        s.update({"strategy": "plain", "maxNewTokens": 16, "topP": 2, "temperature": -1})
    assert "topP" in str(caught.value) and "temperature" in str(caught.value)
    assert s.strategy == "auto" and s.max_new_tokens == 32


async def test_identical_concurrent_requests_share_one_generation(tmp_path):
    """An editor's completion and inline requests at one position must not cancel each other."""
    svc = service(tmp_path)
    first = asyncio.ensure_future(svc.complete(request()))
    await asyncio.sleep(0.05)
    second = await svc.complete(request())
    assert (await first).text == second.text == "return a + b"
    assert len(svc.host.calls) == 1 and svc.counters["cancelled"] == 0


async def test_hits_are_attributed_to_their_own_workspaces_adapter(tmp_path):
    host = FakeHost()
    host.adapter_for = lambda workspace: SimpleNamespace(name="repo@v1") if workspace == "/w" else None
    svc = service(tmp_path, host)
    await svc.complete(request())  # model request in /w, adapter repo@v1
    other = EditorRequest.at("file:///x/b.py", "python", "/x", "def add(a, b):\n    ", "\n")
    await svc.complete(other)  # same text in another workspace: no adapter, so no shared cache entry
    typed = await svc.complete(request(prefix="def add(a, b):\n    ret"))
    assert typed.source == "typeahead" and typed.adapter == "repo@v1"
    rows = {(a["workspace"], a["adapter"]): a for a in svc.metrics.summary()["adapters"]}
    assert rows[("/w", "repo@v1")]["requests"] == 2 and rows[("/w", "repo@v1")]["typeahead_hits"] == 1
    assert rows[("/x", "base")]["model_requests"] == 1 and len(host.calls) == 2


def test_first_run_pulls_catalog_models_with_progress_then_loads(tmp_path, monkeypatch):
    import tiny
    from lsp_server.hosts import ModelHost
    from specdec.models import store as models
    from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

    pulled = []

    def fake_pull(model_id, source="auto", progress=None):
        for i in range(3):
            progress(f"downloading {model_id} part {i + 1}/3", i / 3)
        pulled.append(model_id)
        out = models.models_dir() / models.cache_name(model_id)
        tiny.save(out.parent, seed=len(pulled), name=out.name)
        return out

    monkeypatch.setattr(models, "pull", fake_pull)
    host, reports = ModelHost(), []
    settings = Settings().update({"dtype": "fp32", "adapters": False})
    host.load(settings, lambda message, percent: reports.append((message, percent)))
    assert host.state == "ready", host.error
    assert pulled == [DEFAULT_TARGET, DEFAULT_DRAFT]
    percents = [p for _, p in reports]
    assert percents == sorted(percents) and percents[-1] < 100  # monotonic, then the session is built
    assert reports[0][0] == f"downloading {DEFAULT_TARGET} part 1/3" and "loading target" in reports[-3][0]
    # auto with a draft model plans its drafts with the target's cost curve: measured at load, reported last
    assert reports[-1][0].startswith("measuring the target's verify cost") and host.cost_curve()["source"] == "measured"
    host.load(settings)  # now cached: nothing pulled again
    assert pulled == [DEFAULT_TARGET, DEFAULT_DRAFT] and host.cost_curve()["source"] == "cached"


async def test_closed_documents_leave_nothing_behind_and_open_ones_are_bounded(tmp_path):
    """didClose drops a document's type-ahead text; without closes, only MAX_DOCUMENTS are kept."""
    from lsp_server.answers import MAX_DOCUMENTS

    svc = service(tmp_path, host=FakeHost(step=0))
    body = "x = 1\n" * 40_000  # 240 KB
    for n in range(MAX_DOCUMENTS + 20):
        uri = f"file:///w/{n}.py"
        assert await svc.complete(request(prefix=body + f"def f{n}():\n    ", uri=uri)) is not None
        svc.forget(uri)
    assert not svc.answers.last and not svc.latest
    for n in range(MAX_DOCUMENTS + 20):
        await svc.complete(request(prefix=body + f"def g{n}():\n    ", uri=f"file:///w/{n}.py"))
    assert len(svc.answers.last) == MAX_DOCUMENTS and "file:///w/0.py" not in svc.answers.last  # the least recent went first


@pytest.mark.parametrize("change", [{"topP": 0.5, "temperature": 0.7}, {"maxPrefixTokens": 256},
                                    {"maxSuffixTokens": 16}, {"fimFamily": "qwen"}, {"maxDraft": 4},
                                    {"strategy": "plain"}, {"multiline": False}, {"maxSnippetTokens": 8}])
async def test_a_changed_setting_never_serves_a_suggestion_made_under_the_old_one(tmp_path, change):
    """Issue #30 item 7: the cache key left out topP, maxPrefixTokens, maxSuffixTokens, fimFamily; type-ahead
    state survived a settings change."""
    svc = service(tmp_path)
    assert (await svc.complete(request())).source == "model"
    svc.settings = svc.settings.update(change)
    assert (await svc.complete(request())).source == "model"  # not the old cache entry
    assert (await svc.complete(request(prefix="def add(a, b):\n    ret"))).source == "typeahead"
    svc.settings = Settings().update({"debounce_ms": 0})  # back to the first settings: type-ahead is gone
    assert (await svc.complete(request(prefix="def add(a, b):\n    ret"))).source == "model"
    assert len(svc.host.calls) == 3


async def test_settings_that_cannot_change_output_keep_cache_and_typeahead(tmp_path):
    svc = service(tmp_path)
    await svc.complete(request())
    svc.settings = svc.settings.update({"debounceMs": 0, "prometheusPort": 0, "languages": ["python"]})
    assert (await svc.complete(request())).source == "cache"
    assert (await svc.complete(request(prefix="def add(a, b):\n    ret"))).source == "typeahead"


async def test_a_generation_finishing_after_a_settings_change_leaves_no_typeahead(tmp_path):
    svc = service(tmp_path, FakeHost(step=0.01))
    running = asyncio.ensure_future(svc.complete(request()))
    await asyncio.sleep(0.05)
    svc.settings = svc.settings.update({"maxNewTokens": 8})
    assert (await running).source == "model"  # made under the old settings: its own request gets it
    assert (await svc.complete(request(prefix="def add(a, b):\n    ret"))).source == "model"


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    import tiny

    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


def loaded_host(tiny_pair, **options):
    from lsp_server.hosts import ModelHost

    host = ModelHost()
    settings = Settings().update({"target": str(tiny_pair[0]), "draft": str(tiny_pair[1]), "dtype": "fp32",
                                  "adapters": False, **options})
    host.load(settings)
    assert host.state == "ready", host.error
    return host, settings


def test_reconfiguration_waits_for_the_running_generation(tiny_pair):
    """Issue #30 item 6: apply() swapped session.drafter under a running generation ('NoneType' ... 'observe')."""
    import threading

    from specdec.engine.session import GenerationConfig

    host, settings = loaded_host(tiny_pair, strategy="draft")
    session = host.completer.session
    drafter = session.drafter
    started, go = threading.Event(), threading.Event()

    def stop(text):  # runs in the worker between decode steps: hold the generation there
        started.set()
        go.wait(10)
        return None

    job = host.executor.submit(host.completer.complete, "def add(a, b):\n    ", "\n", GenerationConfig(24), None,
                               stop)
    assert started.wait(10)
    changed = settings.update({"strategy": "plain", "fimFamily": "starcoder", "maxSuffixTokens": 8})
    assert host.apply(changed)
    assert host.apply(changed.update({"maxPrefixTokens": 256}))  # builds on the change still queued
    assert session.drafter is drafter and host.completer.max_suffix_tokens == 64  # not under the generation
    go.set()
    result = job.result(10)
    assert result.stop_reason in ("max_tokens", "eos") and result.stats.drafted > 0  # the engine's Generation
    host.executor.submit(lambda: None).result(10)  # the swaps were queued behind it
    assert session.drafter is drafter  # the session that ran is left as it was: the change is a new one
    assert host.completer.session.target is session.target  # over the same target and KV cache
    session = host.completer.session
    assert session.drafter is None and session.strategy == "plain" and host.completer.template.family == "starcoder"
    assert (host.completer.max_suffix_tokens, host.completer.max_prefix_tokens) == (8, 256)


def test_a_valid_fim_family_change_rebuilds_the_template(tiny_pair):
    """Issue #30 item 5: a runtime fimFamily change was ignored."""
    from specdec.prompts import fim

    host, settings = loaded_host(tiny_pair)
    assert host.completer.template.family == "qwen"
    assert host.apply(settings.update({"fimFamily": "starcoder"}))
    host.executor.submit(lambda: None).result(10)
    assert host.completer.template is fim.TEMPLATES["starcoder"]
    assert host.apply(settings.update({"fimFamily": ""}))
    host.executor.submit(lambda: None).result(10)
    assert host.completer.template is fim.TEMPLATES["qwen"]  # detected again


def test_a_fim_order_change_rebuilds_the_prompt_without_a_reload(tiny_pair):
    """fimOrder spm puts the suffix first in the prompt the loaded models are given, without a reload."""
    host, settings = loaded_host(tiny_pair)
    vocab = host.tokenizer().get_vocab()
    assert host.apply(settings.update({"fimOrder": "spm"}))
    host.executor.submit(lambda: None).result(10)
    assert host.completer.template.order == "spm"
    assert host.completer.prompt("a = 1\n", "\nb = 2\n").ids[0] == vocab["<|fim_suffix|>"]
    assert host.apply(settings.update({"fimOrder": ""}))
    host.executor.submit(lambda: None).result(10)
    assert host.completer.prompt("a = 1\n", "\nb = 2\n").ids[0] == vocab["<|fim_prefix|>"]


@pytest.mark.parametrize("error", [ImportError("No module named 'torch'"), KeyError("weight"), ValueError("bad")])
def test_a_load_that_raises_anything_ends_failed(tmp_path, monkeypatch, error):
    """Issue #30 item 6: a load thread raising e.g. ImportError stayed in 'loading' forever."""
    from lsp_server.hosts import ModelHost
    from specdec.models import loading, store

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(store, "ensure_local", lambda spec, progress: None)
    monkeypatch.setattr(loading, "load_pair", broken)
    host = ModelHost()
    host.load(Settings().update({"target": str(tmp_path), "draft": ""}))
    assert host.state == "failed" and type(error).__name__ in host.error and not host.ready


def test_target_quant_setting_serves_the_quantized_target(tiny_pair):
    """targetQuant reaches the load: int4 layers where the GGUF layout fits, and a change reloads the models."""
    from specdec.models.int4 import Int4Linear, Int8ChannelLinear

    host, settings = loaded_host(tiny_pair, targetQuant="int8")
    layer = host.completer.session.target.model.model.layers[0].mlp.up_proj
    assert isinstance(layer, (Int4Linear, Int8ChannelLinear)) and host.target_quant == "int8"
    assert settings.models_differ(settings.update({"targetQuant": "none"}))
    host, settings = loaded_host(tiny_pair)  # the default, auto: a float checkpoint without a GGUF stays as loaded
    assert settings.target_quant == "auto" and host.target_quant == "none"
    assert type(host.completer.session.target.model.model.layers[0].mlp.up_proj).__name__ == "Linear"


def test_int4_kernel_setting_reaches_the_load(tiny_pair, monkeypatch):
    """int4Kernel w4a8 where the kernel cannot run fails the load with the reason; auto falls back; a change reloads."""
    from lsp_server.hosts import ModelHost
    from specdec.models import w4a8

    monkeypatch.setenv("SPECDEC_W4A8", "0")
    monkeypatch.setattr(w4a8, "_state", {})  # load() answers again, under SPECDEC_W4A8=0
    host = ModelHost()
    host.load(Settings().update({"target": str(tiny_pair[0]), "draft": "", "strategy": "lookup", "dtype": "fp32",
                                 "targetQuant": "int4", "int4Kernel": "w4a8"}))
    assert host.state == "failed" and "w4a8" in host.error and "SPECDEC_W4A8=0" in host.error
    host, settings = loaded_host(tiny_pair, targetQuant="int4", int4Kernel="auto")
    assert settings.models_differ(settings.update({"int4Kernel": "aten"}))
    with pytest.raises(SettingsError, match="int4Kernel must be one of"):
        settings.update({"int4Kernel": "avx2"})
