"""`specdec serve` with engine llama-server / vllm / sglang, over real LSP (stdio), against the fake engines:
suggestions placed like local ones, the engine's speculation in specdec/stats and specdec/trace, one message
and a status state per outage, empty answers within bounds, resumption, cancellation reaching the engine,
and the API key in no output of the server."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

import raw_client as rc
from fake_engines import FakeEngine

KEY = "sk-team-secret-9731"
DOC = "file:///work/calc.py"
TEXT = "def add(a, b):\n    \n"
UTIL = "def sub(a, b):\n    return a - b\n"


class Server(rc.RawServer):
    """RawServer started with an engine API key in its environment."""

    def __init__(self, tmp_path, key: str = KEY, args=()):
        import os

        os.environ["SPECDEC_ENGINE_API_KEY"] = key  # the child inherits it
        try:
            super().__init__(tmp_path, args)
        finally:
            del os.environ["SPECDEC_ENGINE_API_KEY"]

    def start(self, engine: str, url: str, **options):
        self.initialize({"engine": engine, "engineUrl": url, "debounceMs": 0, **options})
        self.send(rc.notification("textDocument/didOpen", {"textDocument": {
            "uri": DOC, "languageId": "python", "version": 1, "text": TEXT}}))

    def inline(self, msg_id, line: int = 1, character: int = 4, timeout: float = 60) -> list:
        reply = self.call(msg_id, "textDocument/inlineCompletion", {
            "textDocument": {"uri": DOC}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 1}}, timeout=timeout)
        assert "error" not in reply, reply
        result = reply["result"]
        return [item["insertText"] for item in (result["items"] if isinstance(result, dict) else result or [])]

    def stats(self) -> dict:
        return self.call(f"stats-{time.monotonic()}", "specdec/stats", {})["result"]

    def wait_messages(self, n: int, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < n and time.monotonic() < deadline:
            self._drain(0.1)
        return self.messages


@pytest.fixture
def server(tmp_path):
    made = []

    def make(key: str = KEY, args=()):
        made.append(Server(tmp_path, key, args))
        return made[-1]

    yield make
    for s in made:
        s.close()


def everything_said(s: Server, tmp_path) -> str:
    metrics = (tmp_path / "state" / "metrics.jsonl")
    return s.stderr() + json.dumps(s.messages) + json.dumps(s.stats()) + (metrics.read_text() if metrics.is_file()
                                                                         else "")


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_remote_completion_placed_like_a_local_one_with_its_speculation(server, tmp_path, kind):
    with FakeEngine(kind, ["return a + b", "\n", "\n", "def sub(a, b):", "\n"], token_delay_s=0.05) as engine:
        s = server()
        s.start(kind, engine.url)
        s.send(rc.notification("textDocument/didOpen", {"textDocument": {  # another open file: context
            "uri": "file:///work/util.py", "languageId": "python", "version": 1, "text": UTIL}}))
        assert s.inline(1) == ["return a + b"]  # cut at the block's end by the server's stop rule, finalized
        post = engine.wait_post()
        trace = s.call("trace", "specdec/trace", {"uri": DOC})["result"]["traces"]
        stats = s.stats()
    assert post["headers"]["Authorization"] == f"Bearer {KEY}"
    if kind == "llama-server":
        assert post["body"]["input_extra"] == [{"filename": "util.py", "text": UTIL}]
        assert post["body"]["input_prefix"] == "def add(a, b):\n" and post["body"]["prompt"] == "    "
    else:
        prompt = post["body"]["prompt" if kind == "vllm" else "text"]
        assert prompt == (f"<|file_sep|>util.py\n{UTIL}\n<|file_sep|>calc.py\n"  # no workspace folder: no repo_name
                          "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>")
    assert post["ended"] == "closed"  # the stop rule closed the stream: the engine dropped the rest
    assert stats["engine"]["kind"] == kind and stats["engine"]["state"] == "ok"
    assert KEY not in json.dumps(stats["engine"])
    row = next(r for r in stats["engines"] if r["engine"] == kind and r["language"] == "python")
    assert row["model_requests"] == 1
    # llama-server's timings come with every event (timings_per_token); vLLM's metrics and SGLang's meta_info
    # only with the last, which a stream our stop rule closed never sent
    assert trace[-1]["speculation"] == ("reported" if kind == "llama-server" else "not reported")
    assert trace[-1]["engine"] == kind and trace[-1]["shown"] == "return a + b"
    assert "Traceback" not in s.stderr()


@pytest.mark.parametrize("kind", ["llama-server", "vllm", "sglang"])
def test_finished_stream_reports_acceptance_per_engine_and_language(server, kind):
    with FakeEngine(kind, ["return", " a", " +", " b"]) as engine:
        s = server()
        s.start(kind, engine.url)
        assert s.inline(1) == ["return a + b"]
        stats = s.stats()
        trace = s.call("trace", "specdec/trace", {"uri": DOC})["result"]["traces"][-1]
    row = next(r for r in stats["engines"] if r["engine"] == kind and r["language"] == "python")
    # the fakes report 4 tokens from 2 passes of 4 drafted tokens: 2 of 8 accepted, 2 tokens a pass
    assert row["acceptance_rate"] == 0.25 and row["tokens_per_pass"] == 2.0 and row["speculation_not_reported"] == 0
    assert (trace["speculation"], trace["drafted"], trace["accepted"], trace["target_passes"]) == \
        ("reported", 8, 2, 2)


def test_unreported_speculation_is_not_zero_acceptance(server):
    with FakeEngine("llama-server", ["return a + b"], speculation=False) as engine:
        s = server()
        s.start("llama-server", engine.url)
        assert s.inline(1) == ["return a + b"]
        stats = s.stats()
    row = next(r for r in stats["engines"] if r["engine"] == "llama-server" and r["language"] == "python")
    assert row["acceptance_rate"] is None and row["speculation_not_reported"] == 1


@pytest.mark.parametrize("fault,state,words", [(dict(status=401), "auth", "refused the key"),
                                               (dict(status=503), "http", "HTTP 503"),
                                               (dict(stall_after=1), "stalled", "stalled"),
                                               (dict(end_after=1), "ended", "ended early"),
                                               (dict(garbage=True), "shape", "not understood"),
                                               (dict(raw=[b"data: " + b"[" * 200_000 + b"]" * 200_000 + b"\n\n"]),
                                                "shape", "not understood")])  # JSON deeper than Python's stack
def test_failure_one_message_status_state_no_traceback_no_key(server, tmp_path, fault, state, words):
    with FakeEngine("vllm", ["return a + b", "\n"], **fault) as engine:
        s = server()
        s.start("vllm", engine.url)
        started = time.monotonic()
        assert s.inline(1) == []
        for i in range(5):  # keystrokes during the outage: answered empty at once, the engine left alone
            assert s.inline(10 + i) == []
        assert time.monotonic() - started < 60  # stall bound (8 s) plus answers at once
        messages = s.wait_messages(1)
        stats = s.stats()
        posts = len(engine.posts)
    assert posts == 1
    assert len(messages) == 1 and words in messages[0]["message"] and messages[0]["type"] == 2  # Warning
    assert stats["engine"]["state"] == state and stats["model"]["state"] == "ready"
    said = everything_said(s, tmp_path)
    assert "Traceback" not in said and KEY not in said


def test_unreachable_then_back_resumes_by_itself(server, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = server()
    s.start("llama-server", f"http://127.0.0.1:{port}")
    assert s.inline(1) == []
    assert s.stats()["engine"]["state"] == "unreachable"
    engine = FakeEngine("llama-server", ["return a + b"])
    engine.server.server_close()
    engine.server = ThreadingHTTPServer(("127.0.0.1", port), engine.handler)
    engine.server.daemon_threads = True
    threading.Thread(target=engine.server.serve_forever, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        texts = []
        while time.monotonic() < deadline and texts != ["return a + b"]:
            texts = s.inline(f"again-{time.monotonic()}")
            time.sleep(0.2)
    finally:
        engine.close()
    assert texts == ["return a + b"]
    messages = s.wait_messages(2)
    assert [m["type"] for m in messages] == [2, 3]  # one warning when it went, one note when it came back
    assert "unreachable" in messages[0]["message"] and "resume" in messages[1]["message"]
    assert s.stats()["engine"]["state"] == "ok"
    assert KEY not in everything_said(s, tmp_path) and "Traceback" not in s.stderr()


def test_cancel_request_closes_the_connection_at_the_engine(server):
    with FakeEngine("sglang", ["x"] * 400, token_delay_s=0.02) as engine:
        s = server()
        s.start("sglang", engine.url, maxNewTokens=400, multiline=False)
        s.send(rc.request("slow", "textDocument/inlineCompletion", {
            "textDocument": {"uri": DOC}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 1}}))
        deadline = time.monotonic() + 30
        while not engine.posts and time.monotonic() < deadline:
            time.sleep(0.02)
        s.send(rc.notification("$/cancelRequest", {"id": "slow"}))
        post = engine.wait_post()
        reply = s.reply("slow")
    assert post["ended"] == "closed"
    assert "error" in reply or not reply.get("result")


def test_serve_engine_flags_are_the_base_settings(server):
    with FakeEngine("vllm", ["return a + b"]) as engine:
        s = server(args=("--engine", "vllm", "--engine-url", engine.url))
        s.initialize({"debounceMs": 0})  # the editor's options apply over the flags
        s.send(rc.notification("textDocument/didOpen", {"textDocument": {
            "uri": DOC, "languageId": "python", "version": 1, "text": TEXT}}))
        assert s.inline(1) == ["return a + b"]
        assert s.stats()["engine"]["kind"] == "vllm" and engine.posts[-1]["path"] == "/v1/completions"


def test_wrong_engine_kind_is_a_message_and_a_state(server, tmp_path):
    """engine llama-server pointed at a vLLM: its /props is a 404, said once, shown as the engine's state."""
    with FakeEngine("vllm", ["return a + b"]) as engine:
        s = server()
        s.start("llama-server", engine.url)
        assert s.inline(1) == []
        messages = s.wait_messages(1)
        stats = s.stats()
    assert stats["model"]["state"] == "ready" and stats["engine"]["state"] == "http"
    assert len(messages) == 1 and messages[0]["type"] == 2 and "not a llama-server" in messages[0]["message"]
    assert "404" in stats["engine"]["reason"] and "Traceback" not in s.stderr()


def test_refused_trace_requests_are_one_log_line_and_a_short_error(server, tmp_path):
    with FakeEngine("vllm", ["return a + b"]) as engine:
        s = server()
        s.start("vllm", engine.url)
        huge = s.call("huge", "specdec/trace", {"uri": DOC, "limit": "x" * 1_000_000})
        negative = s.call("negative", "specdec/trace", {"uri": DOC, "limit": -1})
        assert s.call("fine", "specdec/trace", {"uri": DOC})["result"]["traces"] == []  # still serving
    assert huge["error"]["code"] == -32602 and len(huge["error"]["message"]) < 200
    assert negative["error"]["code"] == -32602 and "-1" in negative["error"]["message"]
    said = s.stderr()
    assert "Traceback" not in said and "x" * 1000 not in said
    refusals = [line for line in said.splitlines() if "refused request" in line]
    assert len(refusals) == 2 and "WARNING" in refusals[0] and "limit must be a whole number" in refusals[0]
