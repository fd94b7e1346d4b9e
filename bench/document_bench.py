"""`python -m specdec_bench.document_bench`: issue #40 item 5's sequence against `specdec serve`, in seconds.

A 10 MB one-line document is opened; 20 one-character didChanges at its end are followed by `specdec/stats`
(seconds until that answer: the event loop's time for the 20 keystrokes), then an inline completion at the
end and, DURING seconds later, a `specdec/stats` (seconds until each answer). Without --options no model loads:
the completion answers empty, after the server has found its cursor and window, which is the time measured.
`--python` runs another checkout's server (its interpreter), for a before/after table.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

TYPED = "abcdefghijklmnopqrst"
DURING = 0.5  # seconds between the inline completion and the specdec/stats asked while it runs


class Server:
    """`specdec serve` over stdio: frames out, replies by id in."""

    def __init__(self, python: str, state: str, log: str = ""):
        env = {**os.environ, "SPECDEC_STATE_DIR": state, "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen([python, "-m", "specdec.cli", "serve", "--log-level", "info"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=open(log, "ab") if log else subprocess.DEVNULL, env=env)
        self.replies: queue.Queue = queue.Queue()
        self.received: dict = {}  # id -> (when, reply), read off the queue
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.process.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line or length is None:
                return
            message = json.loads(out.read(length))
            if "id" in message and "method" not in message:
                self.replies.put((time.perf_counter(), message))

    def send(self, method: str, params, msg_id=None) -> None:
        message = {"jsonrpc": "2.0", "method": method, "params": params, **({} if msg_id is None else {"id": msg_id})}
        body = json.dumps(message).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def wait(self, msg_id, timeout: float = 900.0) -> tuple[float, dict]:
        """(when it came, the reply) to request `msg_id`; replies to others that come first are kept for them."""
        deadline = time.monotonic() + timeout
        while msg_id not in self.received:
            when, message = self.replies.get(timeout=max(0.0, deadline - time.monotonic()))
            self.received[message.get("id")] = (when, message)
        return self.received.pop(msg_id)

    def close(self) -> None:
        try:
            self.send("shutdown", None, "shutdown")
            self.wait("shutdown", timeout=30)
            self.send("exit", None)
            self.process.wait(timeout=30)
        except Exception:
            pass
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def run(python: str, megabytes: float, options: dict | None, keystrokes: int = 20, log: str = "") -> dict:
    line = ("x = 1; " * int(megabytes * (1 << 20) // 7 + 1))[: int(megabytes * (1 << 20))]
    uri = "file:///bench/big.py"
    with tempfile.TemporaryDirectory(prefix="specdec-document-bench-") as state:
        server = Server(python, state, log)
        try:
            server.send("initialize", {"processId": None, "rootUri": None, "capabilities": {},
                                       "initializationOptions": options or {}}, "init")
            server.wait("init", timeout=120)
            if options:  # load the models, and wait for them
                server.send("initialized", {})
                while True:
                    server.send("specdec/stats", {}, "ready?")
                    state_now = server.wait("ready?")[1]["result"]["model"]["state"]
                    if state_now in ("ready", "failed"):
                        break
                    time.sleep(0.2)
            server.send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                  "text": line}})
            server.send("specdec/stats", {}, "opened")
            started = time.perf_counter()
            opened = server.wait("opened")[0] - started
            started = time.perf_counter()
            for i, char in enumerate((TYPED * (1 + keystrokes // len(TYPED)))[:keystrokes]):
                here = {"line": 0, "character": len(line) + i}
                server.send("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2 + i}, "contentChanges": [
                    {"range": {"start": here, "end": here}, "text": char}]})
            server.send("specdec/stats", {}, "typed")
            typed = server.wait("typed")[0] - started
            end = {"line": 0, "character": len(line) + keystrokes}
            started = time.perf_counter()
            server.send("textDocument/inlineCompletion", {"textDocument": {"uri": uri}, "position": end,
                                                          "context": {"triggerKind": 1}}, "inline")
            time.sleep(DURING)
            asked = time.perf_counter()
            server.send("specdec/stats", {}, "during")
            during = server.wait("during")[0] - asked
            completed = server.wait("inline")[0] - started
        finally:
            server.close()
    return {"characters": len(line), "keystrokes": keystrokes, "open_s": opened, "keystrokes_then_stats_s": typed,
            "stats_during_completion_s": during, "completion_s": completed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_bench.document_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose specdec serves (a checkout)")
    parser.add_argument("--megabytes", type=float, default=10.0, help="the document's size (one line)")
    parser.add_argument("--keystrokes", type=int, default=20, help="one-character didChanges at the line's end")
    parser.add_argument("--options", default="", help="initializationOptions as JSON, to load models first")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument("--server-log", default="", help="append the server's log (stderr) to this file")
    args = parser.parse_args(argv)
    result = run(args.python, args.megabytes, json.loads(args.options) if args.options else None, args.keystrokes,
                 args.server_log)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"document: one line of {result['characters']:,} characters ({args.python})")
        rows = [("didOpen, then specdec/stats answered", result["open_s"]),
                (f"{args.keystrokes} one-character didChanges, then specdec/stats", result["keystrokes_then_stats_s"]),
                (f"specdec/stats asked {DURING} s into an inline completion", result["stats_during_completion_s"]),
                ("the inline completion answered", result["completion_s"])]
        for label, seconds in rows:
            print(f"{label:<52} {seconds:8.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
