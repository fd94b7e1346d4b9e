"""A byte-level LSP client for `specdec serve`: writes arbitrary (broken) frames, reads replies by id."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time


def frame(message) -> bytes:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def request(msg_id, method: str, params=None) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, **({} if params is None else {"params": params})}


def notification(method: str, params=None) -> dict:
    return {"jsonrpc": "2.0", "method": method, **({} if params is None else {"params": params})}


def unframe(data: bytes) -> list[dict]:
    """Every message of a run of whole frames."""
    found = []
    while data:
        header, _, rest = data.partition(b"\r\n\r\n")
        length = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        found.append(json.loads(rest[:length]))
        data = rest[length:]
    return found


class Capture:
    """A writer for an in-process server (server.protocol.set_writer): keeps what it writes."""

    def __init__(self):
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        pass

    def messages(self) -> list[dict]:
        return unframe(bytes(self.out))


class RawServer:
    """`specdec serve` over stdio; a thread parses well-formed replies from its stdout into a queue."""

    def __init__(self, tmp_path, args=(), stderr_path=None):
        env = {**os.environ, "SPECDEC_STATE_DIR": str(tmp_path / "state"), "SPECDEC_DATA_DIR": str(tmp_path / "data"),
               "SPECDEC_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
        self.stderr_path = stderr_path or tmp_path / "server-stderr.txt"
        # a session of its own: close() ends the server and anything it started
        self.process = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=open(self.stderr_path, "wb"), env=env,
                                        start_new_session=True)
        self.replies: dict = {}  # id -> reply
        self.nulls: list[dict] = []  # error replies with id null
        self.messages: list[dict] = []  # the server's window/showMessage params
        self._inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.process.stdout
        while True:
            header = b""
            while not header.endswith(b"\r\n\r\n"):
                byte = out.read(1)
                if not byte:
                    return
                header += byte
            length = int(re.search(rb"Content-Length: (\d+)", header).group(1))
            self._inbox.put(json.loads(out.read(length)))

    def write(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message) -> None:
        self.write(frame(message))

    def _drain(self, timeout: float) -> bool:
        try:
            message = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return False
        if message.get("method") == "window/showMessage":
            self.messages.append(message["params"])
        elif "method" in message:  # a request or notification from the server
            if "id" in message:  # window/workDoneProgress/create and the like: say yes
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
        elif message.get("id") is None:
            self.nulls.append(message)
        else:
            self.replies[message["id"]] = message
        return True

    def reply(self, msg_id, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while msg_id not in self.replies:
            left = deadline - time.monotonic()
            # in slices: a server that died is noticed at once, not at the end of a generous ceiling
            if left <= 0 or (not self._drain(min(left, 0.5)) and self.process.poll() is not None):
                raise TimeoutError(f"no reply to id {msg_id!r}; server exit code {self.process.poll()}")
        return self.replies.pop(msg_id)

    def call(self, msg_id, method: str, params=None, timeout: float = 120) -> dict:
        self.send(request(msg_id, method, params))
        return self.reply(msg_id, timeout)

    def initialize(self, options: dict, wait_ready: bool = True, timeout: float = 900) -> dict:
        """Initialize; with wait_ready, until the server reports its models ready (a generous ceiling: a busy
        machine may take minutes)."""
        result = self.call("init", "initialize", {"processId": None, "rootUri": None, "capabilities": {},
                                                  "initializationOptions": options}, timeout=timeout)
        self.send(notification("initialized", {}))
        deadline = time.monotonic() + timeout
        while wait_ready:
            state = self.call("ready?", "specdec/stats", {}, timeout=timeout)["result"]["model"]["state"]
            if state in ("ready", "failed"):
                assert state == "ready"
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"models did not load in {timeout:.0f} s")
            time.sleep(0.1)
        return result

    def close(self) -> None:
        """End the server and its process group (it leads one), whatever state it is in."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")
