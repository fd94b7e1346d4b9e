"""The backend seam: requests and results cross as JSON; `make_backend` picks by kind; the local backend runs the one
builder and gives the text the engine gives, whatever calls it (the server, `specdec complete`, the benchmark)."""

import json
from types import SimpleNamespace

import pytest

from specdec.backends import Backend, CompletionRequest, CompletionResult, make_backend
from specdec.backends.local import LoadSpec, LocalBackend, build
from specdec.errors import SpecdecError


def test_a_request_and_a_result_survive_json():
    request = CompletionRequest("def add(a, b):\n    ", "\n", path="m.py", context="# other\n", language="python",
                                workspace="/w", document="/w/m.py", max_new_tokens=12, temperature=0.5, top_k=3,
                                top_p=0.9, seed=7, max_draft=4)
    assert CompletionRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    result = CompletionResult("return a + b", "eos", {"drafted": 3, "drafted_by": {"lookup": 3}}, [5, 6, 7])
    assert CompletionResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


@pytest.mark.parametrize("data, message", [
    ({"prefix": "a", "suffix": "", "temprature": 1.0}, "unknown completion request keys \\['temprature'\\]"),
    ({"prefix": "a"}, "needs suffix as text"),
    ({"prefix": 1, "suffix": 2}, "needs prefix and suffix as text"),
    (["a", "b"], "a completion request is a JSON object, not list"),
])
def test_a_bad_request_is_refused_in_one_line(data, message):
    with pytest.raises(SpecdecError, match=message):
        CompletionRequest.from_dict(data)


def test_make_backend_picks_by_kind_and_refuses_an_unknown_one():
    assert type(make_backend()) is LocalBackend and type(make_backend("local")) is LocalBackend
    assert isinstance(make_backend("local"), Backend)

    class Mine(LocalBackend):
        pass

    assert type(make_backend("local", cls=Mine)) is Mine
    with pytest.raises(SpecdecError, match="^unknown engine 'nope'; known: local, llama-server, vllm, sglang$"):
        make_backend("nope")
    with pytest.raises(SpecdecError, match="is not a local backend"):
        make_backend("local", cls=dict)


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_make_backend_makes_each_remote_engine(kind):
    from specdec.backends.remote.backend import RemoteBackend

    backend = make_backend(kind, " http://127.0.0.1:8012 ")
    assert type(backend) is RemoteBackend and isinstance(backend, Backend)
    assert (backend.kind, backend.engine.kind, backend.url, backend.state) == (kind, kind, "http://127.0.0.1:8012",
                                                                               "idle")
    said = []
    server_side = make_backend(kind, on_status=lambda state, message: said.append(state))  # URL from settings
    server_side.health.failed("unreachable", "down")
    assert server_side.url == "" and said == ["unreachable"]


URL_RULE = "engine URL must be http://HOST[:PORT][/PATH] or https://..., not"


@pytest.mark.parametrize("kind, url, message", [
    ("vllm", "ftp://engine:8000", f"{URL_RULE} 'ftp://engine:8000'"),
    ("sglang", "engine:8000", f"{URL_RULE} 'engine:8000'"),
    ("llama-server", "http://me:hunter2@engine:99999", f"{URL_RULE} 'http://engine:99999'"),
    ("local", "http://127.0.0.1:8012", "engine URL needs engine llama-server, vllm or sglang"),
])
def test_make_backend_refuses_a_bad_url_in_one_line(kind, url, message):
    with pytest.raises(SpecdecError) as caught:
        make_backend(kind, url)
    assert str(caught.value) == message and "hunter2" not in str(caught.value)


def test_the_local_backend_completes_as_the_builder_and_the_engine_do(tmp_path):
    """The backend's result is the engine's Generation, field for field, on a session the one builder made; the
    stop predicate it is handed ends generation; an unloaded backend says why it cannot complete."""
    import tiny
    from lsp_server.settings import Settings

    from specdec.engine.session import GenerationConfig

    target = tiny.save(tmp_path, seed=1, name="target")
    settings = Settings().update({"target": str(target), "draft": "", "strategy": "lookup", "dtype": "fp32",
                                  "maxNewTokens": 16, "adapters": False})
    backend = make_backend(settings.engine)
    assert backend.state == "idle" and not backend.ready
    backend.load(settings)
    assert backend.ready, backend.error
    assert backend.stats()["state"] == "ready" and backend.stats()["kind"] == "local"

    request = CompletionRequest("def add(a, b):\n    ", "\n", path="m.py", max_new_tokens=16)
    result = backend.executor.submit(backend.complete, request).result(60)
    reference = build(LoadSpec(str(target), "", "lookup", "fp32")).completer.complete(
        request.prefix, request.suffix, GenerationConfig(16), "m.py")
    assert (result.text, result.tokens, result.stop_reason) == (reference.text, reference.tokens,
                                                                 reference.stop_reason)
    assert result.stats["new_tokens"] == len(result.tokens) and result.stats["strategy"] == "lookup"
    assert json.loads(json.dumps(result.to_dict()))["text"] == result.text  # serialisable as returned

    stopped = backend.executor.submit(backend.complete, request, lambda text: 0 if text else None).result(60)
    assert stopped.stop_reason == "stop" and stopped.text == ""
    backend.executor.shutdown()


def test_a_failed_load_is_a_state_with_its_reason(tmp_path):
    backend = make_backend()
    backend.load(SimpleNamespace(target=str(tmp_path / "missing"), draft="", strategy="plain", dtype="fp32",
                                 draft_quant="int8", target_quant="none", int4_kernel="auto", adapters=False,
                                 max_draft=4, fim_family="", max_prefix_tokens=64, max_suffix_tokens=16,
                                 repo_index=False, repo_index_max_tokens=0))
    assert backend.state == "failed" and backend.error and not backend.ready
