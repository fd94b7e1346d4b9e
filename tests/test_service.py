"""Scheduling without a model: cache, type-ahead, debounce, supersession, cancellation, failures."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from lsp_server.metrics import MetricsStore
from lsp_server.service import CompletionRequest, CompletionService
from lsp_server.settings import Settings, SettingsError
from specdec.engine import GenerationStats


class FakeHost:
    """Generates `text` one 'step' (20 ms) per character, honouring the cancel token between steps."""

    def __init__(self, text="return a + b", step=0.02, fail=False):
        self.ready, self.state, self.error, self.adapter = True, "ready", "", ""
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.text, self.step, self.fail = text, step, fail
        self.calls, self.cancelled_at = [], []

    def adapter_for(self, workspace):
        return None

    def generate(self, request, ctx, settings, cancel):
        self.calls.append(request.prefix)
        if self.fail:
            raise RuntimeError("model exploded")
        out = ""
        for ch in self.text:
            if cancel.cancelled:
                self.cancelled_at.append(len(out))
                return out, SimpleNamespace(stop_reason="cancelled", stats=GenerationStats())
            time.sleep(self.step)
            out += ch
        stats = GenerationStats(new_tokens=len(out), produced=len(out) + 1, drafted=10, accepted=7, target_passes=4,
                                seconds=0.3)
        return out, SimpleNamespace(stop_reason="eos", stats=stats)


def service(tmp_path, host=None, **settings):
    defaults = {"debounce_ms": 0}
    return CompletionService(host or FakeHost(), MetricsStore(tmp_path / "m.jsonl"),
                             Settings().update({**defaults, **settings}))


def request(prefix="def add(a, b):\n    ", suffix="\n", uri="file:///w/a.py", invoked=False):
    return CompletionRequest(uri, "python", "/w", prefix, suffix, invoked)


async def test_model_then_cache(tmp_path):
    svc = service(tmp_path)
    first = await svc.complete(request())
    assert first.text == "return a + b" and first.source == "model"
    start = time.perf_counter()
    again = await svc.complete(request())
    assert again.source == "cache" and again.text == first.text
    assert time.perf_counter() - start < 0.01
    assert len(svc.host.calls) == 1


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
    await asyncio.sleep(0.1)
    cancelled_at = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - cancelled_at < 0.1  # ~one 20 ms step
    assert svc.counters["cancelled"] == 1 and host.cancelled_at


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
    svc = service(tmp_path, host, debounce_ms=500)
    start = time.perf_counter()
    assert await svc.complete(request()) is None
    assert time.perf_counter() - start < 0.05


async def test_strings_only_when_invoked_and_disabled_languages(tmp_path):
    svc = service(tmp_path)
    in_string = request(prefix='x = "hel', suffix='lo"\n')
    assert await svc.complete(in_string) is None
    in_string.invoked = True
    assert await svc.complete(in_string) is not None
    svc.settings = svc.settings.update({"languages": ["go"]})
    assert await svc.complete(request(prefix="y = ")) is None


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
])
def test_every_bad_value_is_refused_naming_the_key_and_range(bad, key):
    """Issue #30 items 3-5: one schema refuses each bad value with the key and what it allows."""
    with pytest.raises(SettingsError, match=key) as caught:
        Settings().update(bad)
    assert " must be " in str(caught.value)


def test_schema_is_complete_and_defaults_are_valid():
    from dataclasses import fields

    from lsp_server.settings import schema
    from specdec.fim import TEMPLATES

    Settings().validate()
    rows = {row["key"]: row for row in schema()}
    assert len(rows) == len(fields(Settings))
    for row in rows.values():
        assert row["doc"] and row["type"] in ("boolean", "integer", "number", "string", "array"), row
        if row["type"] in ("integer", "number"):  # every number is bounded
            assert row["minimum"] is not None and row["maximum"] is not None, row
    assert rows["fimFamily"]["choices"] == ["", *TEMPLATES]
    assert rows["temperature"]["zeroAllowed"] and rows["prometheusPort"]["zeroAllowed"]
    assert {k for k, r in rows.items() if r["reloadsModels"]} == {"target", "draft", "dtype", "draftQuant", "adapters"}
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
    other = CompletionRequest("file:///x/b.py", "python", "/x", "def add(a, b):\n    ", "\n")
    await svc.complete(other)  # same text in another workspace: no adapter, so no shared cache entry
    typed = await svc.complete(request(prefix="def add(a, b):\n    ret"))
    assert typed.source == "typeahead" and typed.adapter == "repo@v1"
    rows = {(a["workspace"], a["adapter"]): a for a in svc.metrics.summary()["adapters"]}
    assert rows[("/w", "repo@v1")]["requests"] == 2 and rows[("/w", "repo@v1")]["typeahead_hits"] == 1
    assert rows[("/x", "base")]["model_requests"] == 1 and len(host.calls) == 2


def test_first_run_pulls_catalog_models_with_progress_then_loads(tmp_path, monkeypatch):
    import tiny
    from lsp_server.service import ModelHost
    from specdec import models
    from specdec.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

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
    assert reports[0][0] == f"downloading {DEFAULT_TARGET} part 1/3" and "loading target" in reports[-2][0]
    host.load(settings)  # now cached: nothing pulled again
    assert pulled == [DEFAULT_TARGET, DEFAULT_DRAFT]
