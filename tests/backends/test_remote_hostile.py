"""Remote engines that misbehave (issue #52), against the fakes on 127.0.0.1 (tests/fake_engines.py): counts that
are no counts, JSON nested past Python's stack, the key echoed where a message cuts it, discovery answered by the
wrong engine or not as JSON, replies bigger than maxNewTokens, Retry-After, a new URL after an outage, IPv6 hosts,
and an engine slow to its first byte. Every one ends as a result (empty where it failed), a health state and one
line: never a raise, never a part of the key."""

from __future__ import annotations

import json
import math

import pytest

from lsp_server.settings import Settings, SettingsError
from specdec.backends import make_backend
from specdec.backends.remote.http import Endpoint
from specdec.errors import SpecdecError
from tests.backends.test_remote_engines import KEY, PIECES, Request, backend_for
from tests.fake_engines import FakeEngine

DEEP = b"data: " + b"[" * 200_000 + b"]" * 200_000 + b"\n\n"


def everything(backend, result, caplog) -> str:
    return repr(backend.messages) + caplog.text + repr(backend.stats()) + repr(result.to_dict())


def key_leaks(text: str) -> list[str]:
    """The beginnings of KEY (4 characters or more) found in text."""
    return [KEY[:n] for n in range(4, len(KEY) + 1) if KEY[:n] in text]


# -- item 1: counts that are no counts, JSON deeper than the stack -----------------------------------------------

def _infinite(kind):
    def patch(fields):
        if kind == "llama-server":
            fields["tokens_predicted"] = math.inf
            fields["timings"].update(draft_n=math.inf, predicted_n=math.inf)
        elif kind == "vllm":
            fields["usage"]["completion_tokens"] = math.inf
            fields["metrics"]["speculative_decoding"]["num_draft_tokens"] = math.inf
        else:
            fields["meta_info"]["completion_tokens"] = math.inf
    return patch


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_infinite_counts_are_not_reported_and_never_raise(monkeypatch, kind):
    with FakeEngine(kind, PIECES, final_patch=_infinite(kind)) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request())
    assert result.text == "".join(PIECES) and result.stop_reason == "eos"  # the text is the engine's
    assert result.stats["speculation"] == "not reported" and result.stats["drafted"] is None
    assert backend.health.state == "ok"


def test_sglang_accept_rate_of_1e_320_is_not_reported(monkeypatch):
    def patch(fields):
        fields["meta_info"].update(spec_accept_rate=1e-320, spec_accept_length=1e-320, spec_verify_ct=None)

    with FakeEngine("sglang", PIECES, final_patch=patch) as engine:
        result = backend_for(engine, monkeypatch).complete(Request())
    assert result.text == "".join(PIECES)
    assert result.stats["speculation"] == "not reported" and result.stats["accepted"] is None


def test_vllm_metrics_counter_jumping_to_1e999(monkeypatch):
    with FakeEngine("vllm", PIECES, speculation=False, prometheus=True) as engine:
        backend = backend_for(engine, monkeypatch)  # its discovery scraped the counters as they were
        engine.metrics_page = (b'vllm:spec_decode_num_drafts_total{engine="0"} 1e999\n'
                               b'vllm:spec_decode_num_draft_tokens_total{engine="0"} 1e999\n'
                               b'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 1.2.3\n'
                               b'vllm:spec_decode_num_accepted_tokens_total{engine="1"} 5\n')
        result = backend.complete(Request())
    assert result.text == "".join(PIECES)
    assert result.stats["speculation"] == "not reported" and backend.health.state == "ok"


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_json_nested_200000_deep_is_one_line_and_a_state(monkeypatch, caplog, kind):
    with FakeEngine(kind, raw=[DEEP]) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request())
    assert result.text == "" and result.stop_reason == "error"
    assert backend.health.state == "shape"
    assert len(backend.messages) == 1 and "not JSON" in backend.messages[0][1]
    assert len(backend.messages[0][1]) < 400 and "Traceback" not in caplog.text


def test_an_unforeseen_failure_is_still_an_empty_result_and_a_state(monkeypatch):
    """The contract holds whatever goes wrong inside a completion: here the engine's reader itself raises."""
    with FakeEngine("vllm", PIECES) as engine:
        backend = backend_for(engine, monkeypatch)

        def broken(event, reading):
            raise RecursionError("maximum recursion depth exceeded")

        monkeypatch.setattr(backend.engine, "read", broken)
        result = backend.complete(Request())
    assert result.text == "" and result.stop_reason == "error"
    assert backend.health.state == "shape" and "RecursionError" in backend.health.reason


# -- item 2: the key, cut where a message cuts the engine's words -----------------------------------------------

ECHO = f"Authorization: Bearer {KEY}"


@pytest.mark.parametrize("inside", [1, 4, 9, len(KEY) - 1])  # characters of the key before a cut at 200
def test_a_401_body_echoing_the_key_leaves_no_part_of_it(monkeypatch, caplog, inside):
    pad = "x" * (200 - len("Authorization: Bearer ") - inside)
    with FakeEngine("vllm", status=401, status_body=f"{pad}{ECHO} and more".encode()) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request())
    assert backend.health.state == "auth"
    assert key_leaks(everything(backend, result, caplog)) == []


@pytest.mark.parametrize("inside", [4, 9, len(KEY) - 1])
def test_a_non_json_line_echoing_the_key_leaves_no_part_of_it(monkeypatch, caplog, inside):
    pad = "y" * (80 - len("Authorization: Bearer ") - inside)
    with FakeEngine("llama-server", raw=[f"data: {pad}{ECHO} tail\n\n".encode()]) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request())
    assert backend.health.state == "shape"
    assert key_leaks(everything(backend, result, caplog)) == []


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_an_odd_event_echoing_the_key_leaves_no_part_of_it(monkeypatch, caplog, kind):
    def odd(pad: str) -> dict:  # no engine's event: content, choices and text of the wrong type
        return {"content": 5, "choices": 5, "text": 5, "echo": f"{pad}{ECHO}"}

    start = str(odd("")).index(KEY)  # where the message's quote of the event has the key
    for inside in (4, 9, len(KEY) - 1):
        event = odd("z" * (120 - start - inside))
        with FakeEngine(kind, raw=[b"data: " + json.dumps(event).encode() + b"\n\n"]) as engine:
            backend = backend_for(engine, monkeypatch)
            result = backend.complete(Request())
        assert backend.health.state == "shape"
        assert key_leaks(everything(backend, result, caplog)) == [], inside


def test_a_key_the_engine_cut_itself_is_scrubbed():
    endpoint = Endpoint("http://127.0.0.1:1", KEY)
    assert endpoint.quote(f"token Bearer {KEY[:7]}... rejected", 200) == "token Bearer [key]... rejected"
    assert endpoint.quote("task-tracker sk-t", 200) == "task-tracker [key]"  # a word ending in the key's first 4
    assert endpoint.quote(f"{KEY}{KEY}", 200) == "[key][key]"


# -- item 3: discovery answered by the wrong engine, or not as JSON -----------------------------------------------

@pytest.mark.parametrize("kind, served, replies, state, words", [
    ("llama-server", "vllm", {}, "http", "not a llama-server"),  # --engine llama-server at a vLLM
    ("vllm", "vllm", {"/v1/models": (500, b"Internal Server Error", "text/plain")}, "http", "HTTP 500"),
    ("sglang", "sglang", {"/get_model_info": (200, b"<html><body>login</body></html>", "text/html")}, "shape",
     "not JSON"),
    ("vllm", "vllm", {"/v1/models": (200, b"[1, 2]", "application/json")}, "shape", "a JSON list"),
])
def test_discovery_failures_are_a_state_and_one_message(monkeypatch, caplog, kind, served, replies, state, words):
    with FakeEngine(served, PIECES, replies=replies) as engine:
        monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
        messages = []
        backend = make_backend(kind, on_status=lambda s, m: messages.append((s, m)))
        backend.messages = messages
        backend.load(Settings().update({"engine": kind, "engineUrl": engine.url}))
        result = backend.complete(Request())
    assert backend.ready  # the server's load is done: the status bar shows the engine's state
    assert backend.health.state == state and backend.stats()["state"] == state
    assert len(messages) == 1 and words in messages[0][1], messages
    assert result.text == "" and KEY not in everything(backend, result, caplog)


# -- item 4: URLs refused in one line -------------------------------------------------------------------------------

@pytest.mark.parametrize("url, words", [
    ("http://user:hunter2@127.0.0.1:8012", "must not hold a user or password"),
    ("http://a..b:1/", "not a host name"),
    ("http://127.0.0.1:1/a\x00b", "control characters"),
    ("http://" + "h" * 100_000 + ":1", "at most 2048 characters"),
    ("http://127.0.0.1:1/" + "p" * 100_000, "at most 2048 characters"),
])
def test_engine_urls_refused_in_one_short_line(url, words):
    with pytest.raises(SettingsError) as caught:
        Settings().update({"engine": "vllm", "engineUrl": url})
    message = str(caught.value)
    assert words in message and len(message) < 300 and "\n" not in message and "hunter2" not in message
    with pytest.raises(SpecdecError):
        make_backend("vllm", url)


# -- item 5: replies bounded by maxNewTokens, events by size ---------------------------------------------------------

def _event(kind: str, text: str, last: bool = False) -> bytes:
    if kind == "llama-server":
        event = {"content": text, "tokens": [1], "stop": last, **({"stop_type": "eos"} if last else {})}
    else:
        event = {"choices": [{"index": 0, "text": text, "finish_reason": "stop" if last else None}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@pytest.mark.parametrize("kind", ["llama-server", "vllm"])
def test_a_10_mb_event_is_refused_not_shown(monkeypatch, kind):
    with FakeEngine(kind, raw=[_event(kind, "x" * (10 << 20), last=True)]) as engine:
        backend = backend_for(engine, monkeypatch, maxNewTokens=16)
        result = backend.complete(Request(max_new_tokens=16))
    assert result.text == "" and backend.health.state == "shape"
    assert "bytes" in backend.messages[0][1]


@pytest.mark.parametrize("kind", ["llama-server", "vllm"])
def test_a_reply_longer_than_max_new_tokens_is_cut_and_closed(monkeypatch, kind):
    big = [_event(kind, "y" * 100_000)] + [_event(kind, "z")] * 50  # one long piece, then more than was asked
    with FakeEngine(kind, raw=big) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request(max_new_tokens=16))
    from specdec.backends.remote.backend import MAX_TOKEN_CHARS

    assert result.stop_reason == "max_tokens" and result.text == "y" * (16 * MAX_TOKEN_CHARS)
    assert backend.health.state == "ok"


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_an_engine_ignoring_its_token_cap_is_cut_at_it(monkeypatch, kind):
    with FakeEngine(kind, ["ab"] * 200, token_delay_s=0.005) as engine:
        backend = backend_for(engine, monkeypatch)
        result = backend.complete(Request(max_new_tokens=16))
        post = engine.wait_post()
    assert result.text == "ab" * 16 and result.stop_reason == "max_tokens"
    assert post["ended"] == "closed"


def test_the_llama_server_client_of_the_benchmarks_bounds_an_event_too():
    import asyncio

    from specdec.backends.llama_server import HttpError, stream

    with FakeEngine("llama-server", raw=[b"data: " + b"x" * (2 << 20) + b"\n\n"]) as engine:
        with pytest.raises(HttpError, match="bytes"):
            asyncio.run(stream(engine.port, "/infill", {"stream": True}, lambda event: False))


# -- item 11: a new URL ends the backoff, Retry-After, IPv6 hosts ----------------------------------------------------

def test_a_new_engine_url_does_not_wait_out_the_old_backoff(monkeypatch):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("SPECDEC_ENGINE_API_KEY", KEY)
    messages = []
    backend = make_backend("vllm", on_status=lambda state, message: messages.append((state, message)))
    backend.health.first_s = 30.0
    backend.load(Settings().update({"engine": "vllm", "engineUrl": f"http://127.0.0.1:{closed}"}))
    assert backend.health.state == "unreachable" and backend.health.status()["retry_in_s"] > 20
    with FakeEngine("vllm", PIECES) as engine:
        backend.load(Settings().update({"engine": "vllm", "engineUrl": engine.url}))  # the user fixed engineUrl
        result = backend.complete(Request())
    assert result.text == "".join(PIECES)
    assert [state for state, _ in messages] == ["unreachable", "ok"]  # the outage said, then its end


@pytest.mark.parametrize("header, wait", [("7", 7.0), ("3600", 30.0)])
def test_retry_after_is_honoured_up_to_the_backoff_cap(monkeypatch, header, wait):
    now = [1000.0]
    with FakeEngine("vllm", PIECES, status=503, retry_after=header) as engine:
        backend = backend_for(engine, monkeypatch)
        backend.health.clock = lambda: now[0]
        backend.complete(Request())
    assert backend.health.state == "http" and backend.health.retry_at - now[0] == wait


def test_an_ipv6_engine_is_shown_and_addressed_in_brackets():
    from specdec.backends.remote.http import request_head

    endpoint = Endpoint("http://[::1]:8012/base", KEY)
    assert endpoint.shown == "http://[::1]:8012/base"
    head = request_head(endpoint, "POST", "/v1/completions", b"{}", stream=True).decode()
    assert head.startswith("POST /base/v1/completions HTTP/1.1\r\n")
    assert "\r\nHost: [::1]:8012\r\n" in head
    assert "\r\nHost: 127.0.0.1:80\r\n" in request_head(Endpoint("http://127.0.0.1"), "GET", "/props", None).decode()


# -- item 12: the first byte bounded apart from the gaps between pieces ----------------------------------------------

@pytest.mark.parametrize("kind", ["llama-server", "vllm"])
def test_an_engine_slow_to_its_first_byte_is_waited_for(monkeypatch, kind):
    # the stall bound (1.5 s) is shorter than the engine's prompt evaluation (3 s): only the first-byte bound waits
    with FakeEngine(kind, PIECES, first_delay_s=3.0) as engine:
        backend = backend_for(engine, monkeypatch, engineStallSeconds=1.5, engineFirstByteSeconds=60,
                              engineTotalSeconds=60)
        assert (backend.bounds.stall_s, backend.bounds.first_byte_s) == (1.5, 60)  # the settings in force
        result = backend.complete(Request())
    assert result.text == "".join(PIECES) and backend.health.state == "ok"


def test_a_first_byte_that_never_comes_is_its_own_line(monkeypatch):
    with FakeEngine("vllm", PIECES, stall_after=0) as engine:
        backend = backend_for(engine, monkeypatch, engineFirstByteSeconds=0.5, engineStallSeconds=0.5)
        result = backend.complete(Request())
    assert result.text == "" and backend.health.state == "timeout"
    assert "no answer within 0.5 s" in backend.health.reason


def test_the_bounds_are_settings_with_one_rule():
    settings = Settings().update({"engineFirstByteSeconds": 40, "engineTotalSeconds": 60, "engineStallSeconds": 3})
    from specdec.backends.remote.http import Bounds

    assert Bounds.of(settings) == Bounds(2.0, 40.0, 3.0, 60.0)
    assert Bounds.of(Settings()) == Bounds()  # the documented defaults
    with pytest.raises(SettingsError, match="engineFirstByteSeconds .* must not exceed engineTotalSeconds"):
        Settings().update({"engineFirstByteSeconds": 60})
    with pytest.raises(SettingsError, match="engineStallSeconds"):
        Settings().update({"engineStallSeconds": 0})
