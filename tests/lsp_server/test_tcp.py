"""`specdec serve --tcp` (issue #40 item 10): a port probe or an idle connection never takes the server. The client
is the first connection to send `initialize`; the others are closed after PENDING_SECONDS without it; the server
ends when its client leaves, and only then. Real TCP on 127.0.0.1, a real server process."""

import json
import re
import socket
import subprocess
import sys
import time

import pytest

import raw_client as rc

INITIALIZE = rc.request("init", "initialize", {"capabilities": {}, "processId": None, "rootUri": None})
CEILING = 60  # seconds: generous, for a loaded machine; every wait below ends on a state, not on this


class Server:
    """`specdec serve --tcp PORT` with transport.PENDING_SECONDS set (the module constant), stderr to a file."""

    def __init__(self, tmp_path, pending_seconds: float):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            self.port = free.getsockname()[1]
        code = ("import sys; import lsp_server.transport as t; t.PENDING_SECONDS = float(sys.argv[1]); "
                "from specdec.cli import main; sys.exit(main(['serve', '--tcp', sys.argv[2]]))")
        self.stderr_path = tmp_path / "server-stderr.txt"
        self.process = subprocess.Popen([sys.executable, "-c", code, str(pending_seconds), str(self.port)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=open(self.stderr_path, "wb"), cwd=tmp_path)

    def listening(self) -> None:
        """Waits until the port accepts: each try is itself a probe (connect, close), which must not end it."""
        deadline = time.monotonic() + CEILING
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=CEILING).close()
                return
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and self.process.poll() is None, self.stderr()
                time.sleep(0.05)

    def connect(self) -> "Client":
        return Client(socket.create_connection(("127.0.0.1", self.port), timeout=CEILING))

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Client:
    """One TCP connection: frames out, replies in (server requests and notifications skipped)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def send(self, message) -> None:
        self.sock.sendall(rc.frame(message))

    def message(self) -> dict | None:
        """The next message from the server; None when it closed the connection."""
        while True:
            header, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if sep:
                length = int(re.search(rb"Content-Length: (\d+)", header).group(1))
                if len(rest) >= length:
                    self.buffer = rest[length:]
                    return json.loads(rest[:length])
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buffer += chunk

    def reply(self, msg_id) -> dict:
        while (message := self.message()) is not None:
            if message.get("id") == msg_id and "method" not in message:
                return message
        raise AssertionError(f"the server closed the connection before answering {msg_id!r}")

    def call(self, msg_id, method: str, params=None) -> dict:
        self.send(rc.request(msg_id, method, params))
        return self.reply(msg_id)

    def closed_by_server(self) -> bool:
        """Blocks (up to the socket's timeout) until the server closes this connection."""
        return self.message() is None

    def still_open(self) -> bool:
        """Nothing to read and no end of stream, right now."""
        self.sock.setblocking(False)
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        finally:
            self.sock.settimeout(CEILING)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve(tmp_path):
    started: list[Server] = []

    def start(pending_seconds: float) -> Server:
        server = Server(tmp_path, pending_seconds)
        started.append(server)
        server.listening()
        return server

    yield start
    for server in started:
        server.kill()


def test_a_probe_then_the_editor(serve):
    server = serve(pending_seconds=600)  # listening() already probed the port once
    for _ in range(3):
        socket.create_connection(("127.0.0.1", server.port), timeout=CEILING).close()
    editor = server.connect()
    assert "result" in editor.call("init", "initialize", INITIALIZE["params"])
    assert editor.call("stats", "specdec/stats", {})["result"]["model"]
    assert server.alive()


def test_an_idle_connection_does_not_block_the_editor(serve):
    server = serve(pending_seconds=600)  # the idle connection stays for the whole test
    idle = server.connect()
    editor = server.connect()
    assert "result" in editor.call("init", "initialize", INITIALIZE["params"])
    assert editor.call("stats", "specdec/stats", {})["result"]["model"]
    assert idle.still_open()  # served beside it, not after it
    # the idle one is not the client: its requests are answered on its own connection, and it cannot take over
    assert idle.call(1, "specdec/stats", {})["error"]["code"] == -32002
    assert idle.call(2, "initialize", INITIALIZE["params"])["error"]["code"] == -32600
    assert idle.closed_by_server()
    assert editor.call("stats-2", "specdec/stats", {})["result"]["model"]
    # a connection after the client's is closed at once
    late = server.connect()
    late.send(rc.request(3, "specdec/stats", {}))
    assert late.closed_by_server()
    assert server.alive()


def test_a_silent_connection_is_closed_after_the_timeout_and_the_server_stays(serve):
    server = serve(pending_seconds=1)
    idle = server.connect()
    assert idle.closed_by_server()  # within CEILING: the socket's timeout would raise
    assert server.alive()
    editor = server.connect()
    editor.send(INITIALIZE)  # sent at once: well inside its own second
    assert "result" in editor.reply("init")
    assert "closed a connection" in server.stderr() and "no initialize within 1s" in server.stderr()


def test_the_server_ends_when_its_client_leaves_and_only_then(serve):
    server = serve(pending_seconds=600)
    leaving, staying = server.connect(), server.connect()  # two candidates, neither initializes
    editor = server.connect()
    assert "result" in editor.call("init", "initialize", INITIALIZE["params"])
    leaving.close()  # a candidate leaving changes nothing
    assert editor.call("stats", "specdec/stats", {})["result"]["model"]
    assert staying.still_open()
    editor.close()  # and one still connected does not keep the server alive
    assert server.process.wait(timeout=CEILING) == 1  # gone without shutdown: LSP's 1
    assert staying.closed_by_server()
