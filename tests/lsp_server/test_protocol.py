"""The protocol layer never goes deaf (issue #30 items 8, 9, 12): bad frames and bad messages are
answered or skipped, `exit` ends the process promptly with LSP's code, --tcp serves one client."""

import json
import random
import socket
import subprocess
import sys
import time

import pytest

import raw_client as rc
import tiny
from lsp_server.transport import Dispatcher, recover_id

SOURCE = "def add(a, b):\n    \n\nprint(add(1, 2))\n"


# -- in process: the dispatcher answers what pygls would drop ---------------------------------------
class Capture(rc.Capture):
    def replies(self) -> list[dict]:
        """The replies written since the last call."""
        found = self.messages()
        self.out.clear()
        return [r for r in found if "method" not in r]


@pytest.fixture
async def wire():
    from lsp_server.server import create_server

    server = create_server()
    exits: list[int] = []
    dispatcher = Dispatcher(server, exits.append)
    capture = Capture()
    server.protocol.set_writer(capture)
    dispatcher.exits = exits
    dispatcher.capture = capture
    return dispatcher


def inline_params(line=1, character=4, uri="file:///x/a.py"):
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 1}}


BAD_REQUESTS = [  # (message, expected reply id, expected error code)
    *[(rc.request(n, "textDocument/inlineCompletion", params), n, -32602) for n, params in enumerate([
        [], None, "x", 5, {}, inline_params(-1, 0), inline_params(0, -3), inline_params(2**63, 0),
        inline_params(0, 2**63), inline_params(2**31, 0), {"textDocument": None, "position": {"line": 0}},
        {**inline_params(), "context": {"triggerKind": 99}}], start=1)],
    (rc.request(20, "textDocument/completion", {"textDocument": {"uri": 5}, "position": {}}), 20, -32602),
    (rc.request(21, "workspace/executeCommand", []), 21, -32602),
    ({"jsonrpc": "2.0", "id": {"o": 1}, "method": "specdec/stats"}, None, -32600),
    ({"jsonrpc": "2.0", "id": [1], "method": "specdec/stats"}, None, -32600),
    ({"jsonrpc": "2.0", "id": True, "method": "specdec/stats"}, None, -32600),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "specdec/stats"}, None, -32600),
    ({"id": 22, "method": "specdec/stats"}, 22, -32600),
    ({"jsonrpc": "1.0", "id": 23, "method": "specdec/stats"}, 23, -32600),
    ({"jsonrpc": "2.0", "id": 24, "method": 12}, 24, -32600),
    ({"jsonrpc": "2.0", "id": 25}, 25, -32600),
    ({"jsonrpc": "2.0", "id": "26", "method": "no/such/method"}, "26", -32601),
    ({"jsonrpc": "2.0", "id": 27, "method": "initialize", "params": {"capabilities": {}}}, 27, -32600),
    ([], None, -32600),
    (5, None, -32600),
]


async def initialize(wire):
    wire.feed(rc.frame(rc.request("init", "initialize", {"capabilities": {}, "processId": None, "rootUri": None})))
    assert wire.capture.replies()[0]["id"] == "init"


@pytest.mark.parametrize("message, reply_id, code", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
async def test_every_bad_request_is_answered(wire, message, reply_id, code):
    await initialize(wire)
    wire.feed(rc.frame(message))
    (reply,) = wire.capture.replies()
    assert reply["id"] == reply_id and reply["error"]["code"] == code
    wire.feed(rc.frame(rc.request(99, "specdec/stats", {})))  # and it still serves
    assert wire.capture.replies()[0]["result"]["model"]["state"] == "idle"


async def test_stats_say_which_cost_curve_the_planner_uses(wire):
    """Issue #40 item 2: the curve's source (measured, cached, learned), its ms per pass size and the passes
    it has seen; null where the strategy plans nothing."""
    from types import SimpleNamespace

    from specdec.engine.cost_curve import CostCurve
    from specdec.engine.learned_cost import LearnedCostCurve

    await initialize(wire)
    wire.feed(rc.frame(rc.request(1, "specdec/stats", {})))
    assert wire.capture.replies()[0]["result"]["cost_curve"] is None  # nothing loaded
    curve = LearnedCostCurve(CostCurve((1, 2, 4, 8), (0.080, 0.099, 0.134, 0.157)), "cached", min_passes=2)
    wire.server.host.completer = SimpleNamespace(session=SimpleNamespace(cost_curve=curve))
    wire.feed(rc.frame(rc.request(2, "specdec/stats", {})))
    assert wire.capture.replies()[0]["result"]["cost_curve"] == {
        "source": "cached", "ms": {"1": 80.0, "2": 99.0, "4": 134.0, "8": 157.0}, "passes": 0}
    for _ in range(2):
        for n, seconds in ((1, 0.083), (8, 0.136)):
            curve.observe(n, seconds)
    wire.feed(rc.frame(rc.request(3, "specdec/stats", {})))
    reported = wire.capture.replies()[0]["result"]["cost_curve"]
    assert reported["source"] == "learned" and reported["passes"] == 4
    assert reported["ms"]["1"] == 83.0 and reported["ms"]["8"] == 136.0


@pytest.mark.parametrize("raw, reply_id, code", [
    (b'{"jsonrpc": "2.0", "id": 5, "method": "specdec/stats", "params": {"x": "\xff\xfe"}}', 5, -32700),
    (b'{"jsonrpc": "2.0", "id": 6, "method": "specdec/st', 6, -32700),
    (b"{garbage}", None, -32700),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "specdec/stats", "params": %s}' % (b"[" * 100_000 + b"]" * 100_000),
     7, -32700),
], ids=["invalid-utf8", "truncated-json", "garbage", "nested-100000-deep"])
async def test_unparseable_bodies_are_answered(wire, raw, reply_id, code):
    await initialize(wire)
    wire.feed(rc.frame(raw))
    (reply,) = wire.capture.replies()
    assert reply["id"] == reply_id and reply["error"]["code"] == code


async def test_responses_are_never_answered(wire):
    await initialize(wire)
    for response in ({"jsonrpc": "2.0", "id": {"o": 1}, "result": None}, {"jsonrpc": "2.0", "id": 77, "result": 1},
                     {"jsonrpc": "2.0", "id": None, "error": {"code": 1, "message": "x"}}):
        wire.feed(rc.frame(response))
    assert wire.capture.replies() == []


async def test_a_batch_gets_an_error_for_each_request(wire):
    await initialize(wire)
    wire.feed(rc.frame([rc.request(1, "specdec/stats", {}), rc.request("two", "specdec/stats", {}),
                        rc.notification("initialized", {})]))
    assert [(r["id"], r["error"]["code"]) for r in wire.capture.replies()] == [(1, -32600), ("two", -32600)]


async def test_lifecycle_requests_are_answered(wire):
    wire.feed(rc.frame(rc.request(1, "specdec/stats", {})))  # before initialize
    assert wire.capture.replies()[0]["error"]["code"] == -32002
    await initialize(wire)
    wire.feed(rc.frame(rc.request(2, "shutdown")))
    assert wire.capture.replies()[0] == {"jsonrpc": "2.0", "id": 2, "result": None}
    wire.feed(rc.frame(rc.request(3, "specdec/stats", {})))  # pygls drops this without a word
    assert wire.capture.replies()[0]["error"]["code"] == -32600
    wire.feed(rc.frame(rc.notification("exit")))
    assert wire.exits == [0]


async def test_exit_without_shutdown_reports_1(wire):
    await initialize(wire)
    wire.feed(rc.frame(rc.notification("exit", [])))  # params that do not parse do not keep it alive
    assert wire.exits == [1]


def test_recover_id():
    assert recover_id(b'{"jsonrpc":"2.0","id": 12,"method":"x"') == 12
    assert recover_id(b'{"x": 1, "id":"a\\"b", "method"') == 'a"b'
    assert recover_id(b'{"id": 1.5}') is None and recover_id(b"{}") is None
    assert recover_id(b'{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id": 3}') is None
    assert recover_id(b'{"params": {"text": "\\"id\\": 4 }"}, "id": 5, "x": [') == 5


# -- a real server over stdio, tiny models ------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


def options(model_dirs, **extra) -> dict:
    return {"target": str(model_dirs[0]), "draft": str(model_dirs[1]), "dtype": "fp32", "debounceMs": 0,
            "maxNewTokens": 8, **extra}


@pytest.fixture
def server(tmp_path, model_dirs):
    s = rc.RawServer(tmp_path)
    try:
        s.initialize(options(model_dirs))
        s.uri = (tmp_path / "a.py").as_uri()
        s.send(rc.notification("textDocument/didOpen", {"textDocument": {
            "uri": s.uri, "languageId": "python", "version": 1, "text": SOURCE}}))
        yield s
    finally:
        s.close()


def completes(s, msg_id) -> bool:
    """The server still serves a correct completion."""
    reply = s.call(msg_id, "textDocument/inlineCompletion", inline_params(1, 4, s.uri), timeout=300)
    return len(reply["result"]["items"]) == 1


GOOD = json.dumps(rc.request(1000, "specdec/stats", {})).encode()
FRAMING = {  # issue #30 item 8: each left pygls alive but deaf (or dead, for the huge length)
    "huge": b"Content-Length: 1099511627776\r\n\r\n" + GOOD,
    "lowercase": b"content-length: %d\r\n\r\n" % len(GOOD) + GOOD,
    "lf-only": b"Content-Length: %d\n\n" % len(GOOD) + GOOD,
    "5-short": b"Content-Length: %d\r\n\r\n" % (len(GOOD) - 5) + GOOD,
    "10-long": b"Content-Length: %d\r\n\r\n" % (len(GOOD) + 10) + GOOD,
    "truncated": b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD[:30],
    "zero": b"Content-Length: 0\r\n\r\n" + GOOD,
    "abc": b"Content-Length: abc\r\n\r\n" + GOOD,
    "negative": b"Content-Length: -5\r\n\r\n" + GOOD,
}


def test_bad_frames_over_stdio_are_answered_and_the_server_keeps_serving(server):
    for name, raw in FRAMING.items():
        server.write(raw)
        server.send(rc.request(f"after-{name}", "specdec/stats", {}))
        assert "result" in server.reply(f"after-{name}"), name
        reply = server.reply(1000)  # the bad frame's own request: answered (an error, or read anyway)
        assert "result" in reply or reply["error"]["code"] == -32700, name
    # a frame whose length was overstated, and then nothing: the client waits for its reply, so do not
    server.write(FRAMING["10-long"])
    assert "result" in server.reply(1000, timeout=5)
    # requests whose params or envelope do not parse, a batch, invalid UTF-8: answered, not dropped
    for message, reply_id, code in BAD_REQUESTS:
        server.send(message)
        if reply_id is not None:
            assert server.reply(reply_id)["error"]["code"] == code, message
    server.write(rc.frame(b'{"jsonrpc": "2.0", "id": "utf8", "method": "specdec/stats", "params": {"x": "\xff"}}'))
    assert server.reply("utf8")["error"]["code"] == -32700
    assert server.call("alive", "specdec/stats", {})["result"]
    assert len(server.nulls) == sum(1 for _, reply_id, _ in BAD_REQUESTS if reply_id is None)  # id null replies
    assert completes(server, "last")
    assert server.process.poll() is None
    assert "MemoryError" not in server.stderr() and "Traceback" not in server.stderr()


def test_exit_without_shutdown_exits_1(tmp_path):
    s = rc.RawServer(tmp_path)
    try:
        s.initialize({"target": str(tmp_path / "no-model")}, wait_ready=False)
        s.send(rc.notification("exit"))
        assert s.process.wait(timeout=5) == 1
    finally:
        s.close()


def test_a_request_nested_100000_deep_is_answered_over_stdio(tmp_path):
    """Issue #40 item 14: the decoder's RecursionError escaped its ValueError handling, so such a request was never
    answered. Arrays and objects; the server keeps serving."""
    s = rc.RawServer(tmp_path)
    try:
        s.initialize({"target": str(tmp_path / "no-model")}, wait_ready=False)
        arrays, objects = "[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000
        for msg_id, body in [("arrays", '{"jsonrpc": "2.0", "id": "arrays", "method": "specdec/stats", "params": %s}'),
                             ("objects", '{"jsonrpc": "2.0", "id": "objects", "method": "specdec/stats", "params": %s}')]:
            s.write(rc.frame((body % (arrays if msg_id == "arrays" else objects)).encode()))
            assert s.reply(msg_id, timeout=60)["error"]["code"] == -32700
        assert "result" in s.call("after", "specdec/stats", {})
        assert s.process.poll() is None
    finally:
        s.close()


def test_shutdown_exit_with_a_request_in_flight_ends_within_2s(tmp_path, model_dirs):
    s = rc.RawServer(tmp_path)
    try:
        s.initialize(options(model_dirs, maxNewTokens=1024))  # the most the settings allow
        uri = (tmp_path / "a.py").as_uri()
        s.send(rc.notification("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": SOURCE}}))
        s.send(rc.request("busy", "textDocument/inlineCompletion", inline_params(1, 4, uri)))
        time.sleep(0.3)
        assert s.call("bye", "shutdown")["result"] is None
        s.send(rc.notification("exit"))
        start = time.monotonic()
        assert s.process.wait(timeout=10) == 0
        assert time.monotonic() - start < 2
        assert "closed file" not in s.stderr() and len(s.stderr().splitlines()) < 50
    finally:
        s.close()


def test_tcp_serves_one_client_at_a_time(tmp_path, model_dirs):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--tcp", str(port)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                first = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        first.sendall(rc.frame(rc.request(1, "initialize", {"capabilities": {}, "processId": None, "rootUri": None})))
        assert b'"id": 1' in first.recv(65536)
        second = socket.create_connection(("127.0.0.1", port), timeout=10)
        second.sendall(rc.frame(rc.request(2, "specdec/stats", {})))
        try:  # closed without a word: no stats, no session, no stolen replies
            assert second.recv(65536) == b""
        except ConnectionResetError:
            pass
        first.sendall(rc.frame(rc.request(3, "specdec/stats", {})))
        assert b'"id": 3' in first.recv(65536)
        first.sendall(rc.frame(rc.request(4, "shutdown")) + rc.frame(rc.notification("exit")))
        assert process.wait(timeout=10) == 0
        assert b"refused a connection" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


# -- a bounded, seeded protocol fuzz over stdio ----------------------------------------------------------
JUNK = [None, [], {}, -1, 2**63, -(2**63), 2**31, "", "x", 1.5, True, {"o": 1}, [1, 2], "\udcff"[:0] + "é\u2028"]
JUNK_BYTES = [b"\xff", b"\x00", b"{", b"}", b'"', b"\\", b"\r\n", b"\xc3", b",", b"[", b"9" * 30]


def base_messages(uri: str, other: str) -> list[dict]:
    """Valid messages of every kind the server handles (never shutdown, exit, settings or fine-tuning)."""
    return [
        rc.request(0, "specdec/stats", {}),
        rc.request(0, "textDocument/inlineCompletion", inline_params(1, 4, uri)),
        rc.request(0, "textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 4},
                                                  "context": {"triggerKind": 1}}),
        rc.request(0, "workspace/executeCommand", {"command": "specdec.accept", "arguments": ["abc"]}),
        rc.request(0, "textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}}),
        rc.request(0, "initialize", {"capabilities": {}, "processId": None, "rootUri": None}),
        rc.notification("textDocument/didOpen", {"textDocument": {"uri": other, "languageId": "python", "version": 1,
                                                                  "text": "x = 1\n"}}),
        rc.notification("textDocument/didChange", {"textDocument": {"uri": other, "version": 2}, "contentChanges": [
            {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}, "text": "y"}]}),
        rc.notification("$/cancelRequest", {"id": 12345}),
    ]


def mutate_value(rng: random.Random, value):
    """Replace or delete one random node below the top level (params, or the envelope's fields)."""
    if not isinstance(value, (dict, list)) or not value or rng.random() < 0.25:
        return rng.choice(JUNK)
    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    key = rng.choice(keys)
    copy = dict(value) if isinstance(value, dict) else list(value)
    if isinstance(copy, dict) and rng.random() < 0.2:
        del copy[key]
    else:
        copy[key] = mutate_value(rng, copy[key])
    return copy


def fuzz_case(rng: random.Random, message: dict, msg_id: int) -> tuple[bytes, object]:
    """(bytes to write, the id that must be answered or None): one seeded mutation of a valid message."""
    message = {**message, "id": msg_id} if "id" in message else dict(message)
    expected = message.get("id")
    kind = rng.choice(["json", "json", "id", "bytes", "bytes", "framing"])
    if kind == "json":
        key = rng.choice([k for k in message if k != "id"])
        if rng.random() < 0.15:
            del message[key]
        else:
            message[key] = mutate_value(rng, message[key])
        return rc.frame(json.dumps(message).encode()), expected
    if kind == "id" and "id" in message:
        message["id"] = rng.choice(JUNK + [msg_id, str(msg_id)])
        valid = isinstance(message["id"], (int, str)) and not isinstance(message["id"], bool)
        return rc.frame(json.dumps(message).encode()), message["id"] if valid else None
    body = bytearray(json.dumps(message).encode())
    if kind in ("bytes", "id"):
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(body))
            choice = rng.random()
            if choice < 0.4:
                body[at] = rng.randrange(256)
            elif choice < 0.7:
                body[at:at] = rng.choice(JUNK_BYTES)
            elif choice < 0.85:
                del body[at : at + rng.randint(1, 8)]
            else:
                del body[at:]
        survived = expected is not None and recover_id(bytes(body)) == expected
        return rc.frame(bytes(body)), expected if survived else None
    variant = rng.choice([k for k in FRAMING if k != "huge"] + ["huge", "split-header"])
    n = len(body)
    header = {"huge": b"Content-Length: 1099511627776\r\n\r\n", "lowercase": b"content-length: %d\r\n\r\n" % n,
              "lf-only": b"Content-Length: %d\n\n" % n, "5-short": b"Content-Length: %d\r\n\r\n" % (n - 5),
              "10-long": b"Content-Length: %d\r\n\r\n" % (n + 10), "truncated": b"Content-Length: %d\r\n\r\n" % n,
              "zero": b"Content-Length: 0\r\n\r\n", "abc": b"Content-Length: abc\r\n\r\n",
              "negative": b"Content-Length: -5\r\n\r\n",
              "split-header": b"Content-Type: application/vscode-jsonrpc\r\nContent-Length: %d\r\n\r\n" % n}[variant]
    return header + (bytes(body[: n // 2]) if variant == "truncated" else bytes(body)), expected


def test_protocol_fuzz(server, tmp_path):
    """Seeded mutations of valid messages and the framing cases: every request with an id is answered,
    the server keeps serving, and it still completes correctly afterwards."""
    rng = random.Random(30)
    other = (tmp_path / "other.py").as_uri()
    bases = base_messages(server.uri, other)
    started = time.monotonic()
    for case in range(150):
        msg_id = 10_000 + case
        raw, expected = fuzz_case(rng, rng.choice(bases), msg_id)
        server.write(raw)
        sentinel = server.call(f"alive-{case}", "specdec/stats", {}, timeout=30)
        assert "result" in sentinel, (case, raw[:200])
        if expected is not None:
            reply = server.reply(expected, timeout=30)
            assert "result" in reply or "error" in reply, (case, raw[:200])
    assert time.monotonic() - started < 60
    assert server.process.poll() is None
    assert completes(server, "after-fuzz")
