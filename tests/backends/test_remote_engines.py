"""Remote engines against fakes of llama-server, vLLM and SGLang on 127.0.0.1 (tests/fake_engines.py):
the exact request each receives, streamed and whole replies, speculation reported or not, cancellation
closing the connection, the failure policy, and the key kept out of every message."""

from __future__ import annotations

import threading
import time

import pytest

from lsp_server.settings import Settings
from specdec.backends import CompletionRequest, make_backend
from specdec.backends.remote.backend import RemoteBackend
from specdec.backends.remote.engines import Sglang, Speculation, Vllm
from specdec.backends.remote.health import Health
from tests.fake_engines import FakeEngine

KEY = "sk-team-secret-4242"
PIECES = ["    return", " a", " +", " b", "\n"]


def Request(prefix: str = "def add(a, b):\n", suffix: str = "\n\nprint(add(1, 2))\n", path: str = "src/calc.py",
            max_new_tokens: int = 16, **fields) -> CompletionRequest:
    """The request the server sends a remote engine (its settings applied): the backends' one request type."""
    return CompletionRequest(prefix, suffix, path, language="python", max_new_tokens=max_new_tokens, **fields)


class Token:
    def __init__(self):
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


def backend_for(engine: FakeEngine, monkeypatch, key: str = KEY, **settings) -> RemoteBackend:
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", key)
    messages = []
    backend = make_backend(engine.kind, on_status=lambda state, message: messages.append((state, message)))
    backend.messages = messages
    backend.load(Settings().update({"engine": engine.kind, "engineUrl": engine.url, **settings}))
    assert backend.ready
    return backend


@pytest.mark.parametrize("whole", [False, True])
def test_llama_server_infill_request_and_speculation(monkeypatch, whole):
    with FakeEngine("llama-server", PIECES, whole=whole) as engine:
        backend = backend_for(engine, monkeypatch)
        chunks = [{"filename": "src/util.py", "text": "def sub(a, b):\n    return a - b\n"}]
        result = backend.complete(Request(prefix="def add(a, b):\n    ", suffix="", chunks=chunks))
        post = engine.wait_post()
    assert post["path"] == "/infill"
    assert post["headers"]["Authorization"] == f"Bearer {KEY}"
    body = post["body"]
    assert body == {"input_prefix": "def add(a, b):\n", "input_suffix": "", "input_extra": chunks,
                    "prompt": "    ", "n_predict": 16, "n_indent": 0, "stream": True, "cache_prompt": True,
                    "return_tokens": True, "stop": [], "timings_per_token": True, "t_max_predict_ms": 5000,
                    "top_k": 1, "samplers": ["top_k"]}
    assert result.text == "".join(PIECES) and result.stop_reason == "eos"
    assert result.stats["speculation"] == "reported"
    assert (result.stats["drafted"], result.stats["accepted"], result.stats["target_passes"]) == (8, 3, 2)
    assert result.trace.as_dict() == {"engine": "llama-server", "speculation": "reported", "drafted": 8,
                                      "accepted": 3, "target_passes": 2, "new_tokens": 5, "text": "".join(PIECES),
                                      "passes": []}


def test_llama_server_without_speculation_fields_is_not_reported(monkeypatch):
    with FakeEngine("llama-server", PIECES, speculation=False) as engine:
        result = backend_for(engine, monkeypatch).complete(Request())
    assert result.text == "".join(PIECES)
    assert result.stats["speculation"] == "not reported"
    assert result.stats["drafted"] is None and result.stats["accepted"] is None  # never a zero acceptance


def test_vllm_completions_request_raw_fim_prompt(monkeypatch):
    with FakeEngine("vllm", PIECES) as engine:
        backend = backend_for(engine, monkeypatch)
        chunks = [{"filename": "src/util.py", "text": "def sub(a, b):\n    return a - b"}]
        result = backend.complete(Request(workspace="/home/me/calc", chunks=chunks))
        post = engine.wait_post()
    assert post["path"] == "/v1/completions"
    assert post["headers"]["Authorization"] == f"Bearer {KEY}"
    body = post["body"]
    assert "suffix" not in body
    assert body["prompt"] == ("<|repo_name|>calc\n<|file_sep|>src/util.py\ndef sub(a, b):\n    return a - b\n"
                              "<|file_sep|>src/calc.py\n<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n\n"
                              "print(add(1, 2))\n<|fim_middle|>")
    assert body["model"] == "Qwen/Qwen2.5-Coder-7B" and body["max_tokens"] == 16 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "<|endoftext|>" in body["stop"] and "<|file_sep|>" in body["stop"]
    assert result.text == "".join(PIECES)
    assert (result.stats["speculation"], result.stats["drafted"], result.stats["accepted"],
            result.stats["target_passes"]) == ("reported", 8, 3, 2)


def test_vllm_refuses_suffix_with_400():
    """The fake replays vLLM's refusal, which is why the prompt is the raw FIM text."""
    from specdec.backends.remote.http import Call, EngineError, Endpoint

    with FakeEngine("vllm") as engine:
        with Call(Endpoint(engine.url), "POST", "/v1/completions", {"model": "m", "prompt": "a", "suffix": "b"}) \
                as call:
            with pytest.raises(EngineError) as err:
                call.check_status()
    assert err.value.status == 400 and "suffix is not currently supported" in str(err.value)


def test_vllm_prometheus_fallback_says_so(monkeypatch):
    with FakeEngine("vllm", PIECES, speculation=False, prometheus=True) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request())
    assert result.stats["speculation"] == "prometheus"  # server-wide counter deltas, and said so
    assert (result.stats["drafted"], result.stats["accepted"]) == (8, 3)
    assert backend.stats()["speculation"] == "prometheus"


def test_vllm_without_any_speculation_source(monkeypatch):
    with FakeEngine("vllm", PIECES, speculation=False) as engine:
        result = backend_for(engine, monkeypatch).complete(Request())
    assert result.text == "".join(PIECES)
    assert result.stats["speculation"] == "not reported" and result.stats["accepted"] is None


@pytest.mark.parametrize("whole", [False, True])
def test_sglang_generate_request_and_meta_info(monkeypatch, whole):
    with FakeEngine("sglang", PIECES, whole=whole) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request(temperature=0.5, seed=7))
        post = engine.wait_post()
    assert post["path"] == "/generate"
    body = post["body"]
    assert body["text"] == ("<|file_sep|>src/calc.py\n<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n\n"
                            "print(add(1, 2))\n<|fim_middle|>")
    assert body["stream"] is True
    assert body["sampling_params"]["max_new_tokens"] == 16 and body["sampling_params"]["temperature"] == 0.5
    assert body["sampling_params"]["sampling_seed"] == 7 and "<|endoftext|>" in body["sampling_params"]["stop"]
    assert result.text == "".join(PIECES)  # cumulative stream text read as pieces
    assert (result.stats["speculation"], result.stats["drafted"], result.stats["accepted"],
            result.stats["target_passes"]) == ("reported", 8, 3, 2)


def test_sglang_speculation_from_meta_info():
    engine = Sglang()
    from specdec.backends.remote.engines import Reading

    reading = Reading(completion_tokens=12, final={"meta_info": {"spec_accept_rate": 0.5, "spec_accept_length": 3.0}})
    assert engine.speculation(reading) == Speculation("reported", 16, 8, 4)
    assert engine.speculation(Reading(completion_tokens=12, final={"meta_info": {}})) == Speculation()


def test_prometheus_counters_parse_and_delta():
    page = ('vllm:spec_decode_num_drafts_total{engine="0"} 4.0\nvllm:spec_decode_num_drafts_total{engine="1"} 1.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0"} 20.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 9.0\n')
    after = Vllm.counters(page)
    assert after == {"vllm:spec_decode_num_drafts": 5.0, "vllm:spec_decode_num_draft_tokens": 20.0,
                     "vllm:spec_decode_num_accepted_tokens": 9.0}
    before = {k: 1.0 for k in after}
    assert Vllm.delta(before, after) == Speculation("prometheus", 19, 8, None)
    assert Vllm.counters("vllm:num_requests_running 0\n") is None


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_stop_predicate_after_every_piece_closes_the_stream(monkeypatch, kind):
    pieces = ["a = 1", "\n", "b = 2", "\n", "c = 3", "\n"] + ["x"] * 40
    with FakeEngine(kind, pieces, token_delay_s=0.02) as engine:
        backend = backend_for(engine, monkeypatch)
        seen = []

        def stop(text):
            seen.append(text)
            return text.index("\n") if "\n" in text else None

        result = backend.complete(Request(), stop)
        post = engine.wait_post()
    assert result.text == "a = 1" and result.stop_reason == "stop"
    assert seen == ["a = 1", "a = 1\n"]  # asked after each streamed piece
    assert post["ended"] == "closed"  # the engine saw the connection close: it drops the request


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_cancel_closes_the_connection_at_the_engine(monkeypatch, kind):
    with FakeEngine(kind, ["x"] * 200, token_delay_s=0.02) as engine:
        backend = backend_for(engine, monkeypatch)
        token = Token()
        timer = threading.Timer(0.2, token.cancel)
        timer.start()
        result = backend.complete(Request(max_new_tokens=200), cancel=token)
        post = engine.wait_post()
    assert result.stop_reason == "cancelled"
    assert post["ended"] == "closed"
    assert backend.health.state == "ok"  # a cancel is not an outage


FAILURES = [
    (dict(status=401), "auth", "HTTP 401"),
    (dict(status=403), "auth", "HTTP 403"),
    (dict(status=500), "http", "HTTP 500"),
    (dict(stall_after=2), "stalled", "no data"),
    (dict(end_after=2), "ended", "ended"),
    (dict(garbage=True), "shape", "not JSON"),
]


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
@pytest.mark.parametrize("fault,state,words", FAILURES)
def test_failures_answer_empty_once_and_keep_the_key_secret(monkeypatch, caplog, kind, fault, state, words):
    with FakeEngine(kind, PIECES, **fault) as engine:
        backend = backend_for(engine, monkeypatch, engineStallSeconds=0.5)
        started = time.monotonic()
        result = backend.complete(Request())
        assert time.monotonic() - started < 10
        assert result.text == "" and result.stop_reason == "error"
        assert backend.health.state == state
        again = backend.complete(Request())  # within the backoff: answered at once, the engine not asked
        assert again.text == "" and len(engine.posts) == 1
    assert len(backend.messages) == 1 and backend.messages[0][0] == state and words in backend.messages[0][1]
    everything = repr(backend.messages) + caplog.text + repr(backend.stats()) + repr(result.to_dict())
    assert KEY not in everything


def test_unreachable_engine_then_back(monkeypatch):
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
    messages = []
    backend = make_backend("llama-server", on_status=lambda state, message: messages.append((state, message)))
    backend.health.first_s = 0.05
    backend.load(Settings().update({"engine": "llama-server", "engineUrl": f"http://127.0.0.1:{port}"}))
    assert backend.ready and backend.health.state == "unreachable"
    assert backend.complete(Request()).text == ""
    assert [m[0] for m in messages] == ["unreachable"]
    engine = FakeEngine("llama-server", PIECES)
    engine.server.server_close()
    from http.server import ThreadingHTTPServer

    engine.server = ThreadingHTTPServer(("127.0.0.1", port), engine.handler)
    engine.server.daemon_threads = True
    engine.thread = threading.Thread(target=engine.server.serve_forever, daemon=True)
    engine.thread.start()
    try:
        time.sleep(0.3)  # past the backoff: the next request tries again
        result = backend.complete(Request())
    finally:
        engine.close()
    assert result.text == "".join(PIECES)
    assert [m[0] for m in messages] == ["unreachable", "ok"] and KEY not in repr(messages)


def test_backoff_is_bounded_and_one_request_probes():
    now = [0.0]
    health = Health(first_s=1.0, max_s=4.0, clock=lambda: now[0])
    delays = []
    for _ in range(5):
        health.failed("unreachable", "x")
        delays.append(health.retry_at - now[0])
    assert delays == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert not health.may_try()
    now[0] += 4.0
    assert health.may_try() and not health.may_try()  # one probe at a time
    health.succeeded()
    assert health.may_try() and health.state == "ok"


def test_adapter_served_by_the_engine_is_used(monkeypatch, tmp_path):
    with FakeEngine("vllm", PIECES, adapters=["calc-repo"]) as engine:
        backend = backend_for(engine, monkeypatch)
        backend.repo_key_of = lambda workspace: "github.com/me/calc repo"  # the registry's key for the folder
        assert backend.adapter_for(str(tmp_path)) == ""  # served under another name: the base model
        backend.repo_key_of = lambda workspace: "calc/repo"
        backend.complete(Request(workspace=str(tmp_path)))
        assert engine.wait_post()["body"]["model"] == "calc-repo"
        backend.complete(Request())
        assert engine.wait_post()["body"]["model"] == "Qwen/Qwen2.5-Coder-7B"
    with FakeEngine("llama-server", PIECES, adapters=["other", "calc-repo"]) as engine:
        backend = backend_for(engine, monkeypatch)
        assert backend.adapters == {"other": 0, "calc-repo": 1}
        monkeypatch.setattr(backend, "adapter_for", lambda workspace: "calc-repo")
        backend.complete(Request(workspace=str(tmp_path)))
        assert engine.wait_post()["body"]["lora"] == [{"id": 1, "scale": 1.0}]
    with FakeEngine("sglang", PIECES, adapters=["calc-repo"]) as engine:
        backend = backend_for(engine, monkeypatch)
        monkeypatch.setattr(backend, "adapter_for", lambda workspace: "calc-repo")
        backend.complete(Request(workspace=str(tmp_path)))
        assert engine.wait_post()["body"]["lora_path"] == "calc-repo"
