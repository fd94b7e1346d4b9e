"""A stand-in for llama.cpp's llama-server in the fast tier: /health, and /infill answering recorded-shape replies.

Its "model" (-m) is a JSON file: {"answers": {text before the cursor: [token ids]}, "pieces": {id: text},
"default": [token ids], "delay_s": seconds before the first token, "token_delay_s": seconds between tokens,
"log": a JSONL file where each request's body is written with how it ended: "done", or "closed" when the
client closed the connection before the reply was complete}. It streams (SSE, chunked) or answers whole,
as llama-server does, honouring n_predict (stop_type "limit") and otherwise ending with stop_type "eos".
`/completion` (the engine benchmark's) answers "default" cut to n_predict, whole.
"crash": "start" or "completion" kills the program with SIGILL there while weight repacking is on, as
llama.cpp's AMX repack does on some Intel CPUs (LLAMA_ARG_REPACK=0 in its environment turns it off);
"crash_always": true crashes there whatever the environment says.
Run as a program it takes llama-server's flags (-m, --port, --spec-type; the rest ignored) and writes them to
"argv_log" when the config names one; in a test, `start(config)`. As llama.cpp b11434 does, it speculates only
under `--spec-type` (`-md` alone loads a draft and never drafts): then `/completion`'s timings carry
`draft_n` / `draft_n_accepted` (every answered token drafted, half of them accepted), else no such fields.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar


def client_closed(sock: socket.socket) -> bool:
    """The client closed its end (EOF readable), without consuming anything it might still send."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def send_json(handler: BaseHTTPRequestHandler, status: int, body) -> None:
    """One whole JSON reply (body: an object, or bytes as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    config: ClassVar[dict] = {}

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body) -> None:
        send_json(self, status, body)

    def do_GET(self) -> None:
        self._json(200, {"status": "ok"}) if self.path == "/health" else self._json(404, {"error": "not found"})

    def _log(self, body: dict, ended: str, sent: int) -> None:
        if self.config.get("log"):
            with open(self.config["log"], "a") as f:
                f.write(json.dumps({"body": body, "ended": ended, "tokens_sent": sent}) + "\n")

    def _wait(self, seconds: float) -> bool:
        """Sleep, watching the connection; False if the client closed it meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if client_closed(self.connection):
                return False
            time.sleep(0.005)
        return not client_closed(self.connection)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/completion":
            crash_if_asked(self.config, "completion")
            limit = int(body.get("n_predict", -1))
            tokens = self.config.get("default", [])
            tokens = tokens[:limit] if limit >= 0 else tokens
            timings = {"prompt_n": len(body.get("prompt", [])), "prompt_ms": 1.0, "predicted_ms": 1.0}
            if self.config.get("spec_type", "none") != "none":
                timings.update(draft_n=len(tokens), draft_n_accepted=len(tokens) // 2)
            self._json(200, {"tokens": tokens, "timings": timings})
            self._log(body, "done", len(tokens))
            return
        if self.path != "/infill":
            self._json(404, {"error": "not found"})
            return
        before = body.get("input_prefix", "") + body.get("prompt", "")
        tokens = self.config.get("answers", {}).get(before, self.config.get("default", []))
        limit = int(body.get("n_predict", -1))
        stop_type = "limit" if 0 <= limit < len(tokens) else "eos"
        tokens = tokens[:limit] if limit >= 0 else tokens
        pieces = self.config.get("pieces", {})
        timings = {"cache_n": 0, "prompt_n": len(before) // 4 + 1, "prompt_ms": 1.0, "predicted_n": len(tokens),
                   "predicted_ms": 1.0}
        if not self._wait(self.config.get("delay_s", 0.0)):
            self._log(body, "closed", 0)
            return
        if not body.get("stream"):
            self._json(200, {"index": 0, "content": "".join(pieces.get(str(t), "") for t in tokens),
                             "tokens": tokens, "stop": True, "stop_type": stop_type, "tokens_predicted": len(tokens),
                             "timings": timings})
            self._log(body, "done", len(tokens))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(data: dict) -> None:
            line = f"data: {json.dumps(data)}\n\n".encode()
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()

        for sent, token in enumerate(tokens):
            if sent and not self._wait(self.config.get("token_delay_s", 0.0)):
                self._log(body, "closed", sent)
                return
            try:
                event({"index": 0, "content": pieces.get(str(token), ""), "tokens": [token], "stop": False,
                       "tokens_predicted": sent + 1, "timings": timings})
            except OSError:
                self._log(body, "closed", sent)
                return
        try:
            event({"index": 0, "content": "", "tokens": [], "stop": True, "stop_type": stop_type,
                   "tokens_predicted": len(tokens), "timings": timings})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self._log(body, "closed", len(tokens))
            return
        self._log(body, "done", len(tokens))


def start(config: dict, port: int = 0) -> ThreadingHTTPServer:
    """Serve in a daemon thread; `server.server_address[1]` is the port, `server.shutdown()` ends it."""
    handler = type("ConfiguredHandler", (Handler,), {"config": config})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def answers_for(tokenizer, cases: dict[str, str]) -> dict:
    """The "answers" and "pieces" of a config: for each text before the cursor, the reply text as token ids."""
    answers = {before: tokenizer.encode(reply, add_special_tokens=False) for before, reply in cases.items()}
    pieces = {str(t): tokenizer.decode([t]) for ids in answers.values() for t in ids}
    return {"answers": answers, "pieces": pieces}


def executable(tmp_path: Path) -> Path:
    """A `llama-server` program (for SPECDEC_LLAMA_SERVER) that runs this module."""
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def crash_if_asked(config: dict, where: str) -> None:
    """Die of SIGILL at `where` if the config asks for it there (while repacking is on, or always)."""
    if config.get("crash") != where:
        return
    if os.environ.get("LLAMA_ARG_REPACK") == "0" and not config.get("crash_always"):
        return
    print("ggml_backend_amx_mul_mat: illegal instruction (a stand-in)", file=sys.stderr, flush=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    # to this thread, as a real fault is: os.kill would let the kernel pick the main thread, and this
    # one could still answer the request before the process is gone
    signal.pthread_kill(threading.get_ident(), signal.SIGILL)


def main(argv: list[str]) -> None:
    model = argv[argv.index("-m") + 1]
    port = int(argv[argv.index("--port") + 1])
    config = json.loads(Path(model).read_text())
    if "--spec-type" in argv:
        config["spec_type"] = argv[argv.index("--spec-type") + 1]
    if config.get("argv_log"):
        Path(config["argv_log"]).write_text(json.dumps(argv))
    crash_if_asked(config, "start")
    server = start(config, port)
    try:
        threading.Event().wait()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
