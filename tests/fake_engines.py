"""Fakes of llama-server, vLLM and SGLang on 127.0.0.1 for the fast tier, replaying their response shapes.

`FakeEngine(kind, pieces=[...], ...)` serves, in a thread:
- llama-server: GET /health, /props, /lora-adapters; POST /infill streamed as llama-server streams it (one
  SSE event per token: content, tokens, stop false; the last: stop true, stop_type, tokens_predicted and
  `timings` with draft_n / draft_n_accepted when `speculation` is on; with `timings_per_token` every event
  carries the timings so far, as the real one does);
- vLLM: GET /v1/models, /metrics (the spec_decode counters when `prometheus`), POST /v1/completions:
  400 for a `suffix` (vLLM refuses it), chunks of `choices[].text`, a finish_reason, then the
  include_usage chunk with `usage` and, when `speculation`, `metrics.speculative_decoding`;
- SGLang: GET /get_model_info, /get_server_info; POST /generate streaming the whole text so far and
  `meta_info` (spec_accept_rate / spec_accept_length / spec_verify_ct when `speculation`).
Failures: `status` answers every POST with it (401, 500, ...; `status_body` instead of the engine's own body,
`retry_after` as its Retry-After header), `stall_after` stops sending after that many pieces (and waits),
`end_after` closes the connection after that many pieces without the final event, `garbage` sends a non-JSON
event, `whole` answers with one JSON body instead of a stream, `raw` streams these SSE lines (bytes) instead of
the engine's events, `first_delay_s` waits that long after the headers before the first event (an engine
evaluating a long prompt), `final_patch(fields)` edits the fields of the last event (the counts) in place,
`replies` answers a GET path with (status, body bytes, content type) instead, `metrics_page` (bytes) is vLLM's
/metrics.
`requests` records each request (path, headers, body, how it ended: "done", "closed" when the client
closed the connection before the reply was complete); `done` is set after each POST ends.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fake_llama_server import client_closed, send_json


def send_raw(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str, headers=None) -> None:
    """One whole reply of any content type (HTML where JSON was expected, say), with extra headers."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


class FakeEngine:
    def __init__(self, kind: str, pieces=("x",), speculation: bool = True, status: int = 0,
                 stall_after: int | None = None, end_after: int | None = None, garbage: bool = False,
                 token_delay_s: float = 0.0, prometheus: bool = False, adapters=(), model: str = "",
                 whole: bool = False, status_body: bytes | None = None, retry_after: str = "", raw=None,
                 first_delay_s: float = 0.0, final_patch=None, replies: dict | None = None,
                 metrics_page: bytes | None = None):
        self.kind, self.pieces, self.speculation, self.status = kind, list(pieces), speculation, status
        self.stall_after, self.end_after, self.garbage, self.token_delay_s = stall_after, end_after, garbage, \
            token_delay_s
        self.prometheus, self.adapters, self.whole = prometheus, list(adapters), whole
        self.status_body, self.retry_after, self.raw, self.first_delay_s = status_body, retry_after, raw, first_delay_s
        self.final_patch, self.replies, self.metrics_page = final_patch, dict(replies or {}), metrics_page
        self.model = model or {"llama-server": "/models/qwen2.5-coder-7b-q4_k_m.gguf",
                               "vllm": "Qwen/Qwen2.5-Coder-7B", "sglang": "Qwen/Qwen2.5-Coder-7B"}[kind]
        self.requests: list[dict] = []
        self.done = threading.Event()
        self.counters = [0, 0, 0]  # vLLM's spec_decode drafts, draft tokens, accepted tokens
        self.timings_per_token = False
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                engine.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
                if self.path in engine.replies:
                    status, body, content_type = engine.replies[self.path]
                    send_raw(self, status, body, content_type)
                else:
                    self._json(*engine.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                entry = {"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body,
                         "ended": "running"}
                engine.requests.append(entry)
                try:
                    entry["ended"] = engine.post(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    entry["ended"] = "closed"
                finally:
                    engine.done.set()

            def _json(self, status, body):
                send_json(self, status, body)

        self.handler = Handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def posts(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST"]

    def wait_post(self, timeout: float = 10.0) -> dict:
        """The latest POST once it ended (the fake saw its end or the client's close)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.posts and self.posts[-1]["ended"] != "running":
                return self.posts[-1]
            time.sleep(0.01)
        raise AssertionError("no finished POST at the fake engine")

    # -- GET ----------------------------------------------------------------------------------------------
    def get(self, path: str):
        if self.kind == "llama-server":
            if path == "/health":
                return 200, {"status": "ok"}
            if path == "/props":
                return 200, {"model_path": self.model, "default_generation_settings": {"n_ctx": 4096}}
            if path == "/lora-adapters":
                return 200, [{"id": i, "path": f"/adapters/{name}.gguf", "scale": 0.0}
                             for i, name in enumerate(self.adapters)]
        if self.kind == "vllm":
            if path == "/v1/models":
                data = [{"id": self.model, "object": "model", "parent": None}]
                data += [{"id": name, "object": "model", "parent": self.model} for name in self.adapters]
                return 200, {"object": "list", "data": data}
            if path == "/metrics":
                if self.metrics_page is not None:
                    return 200, self.metrics_page
                if not self.prometheus:
                    return 200, b"# HELP vllm:num_requests_running x\nvllm:num_requests_running 0.0\n"
                d, t, a = self.counters
                text = (f"# TYPE vllm:spec_decode_num_drafts_total counter\n"
                        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d}.0\n'
                        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {t}.0\n'
                        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}.0\n')
                return 200, text.encode()
        if self.kind == "sglang":
            if path == "/get_model_info":
                return 200, {"model_path": self.model, "is_generation": True}
            if path == "/get_server_info":
                return 200, {"lora_paths": {name: f"/adapters/{name}" for name in self.adapters}}
        return 404, {"error": "not found"}

    # -- POST ---------------------------------------------------------------------------------------------
    def refusal(self, body: dict):
        if self.status:
            message = {401: "Unauthorized", 403: "Forbidden"}.get(self.status, "Internal Server Error")
            return self.status, {"error": {"code": self.status, "message": message}}
        if self.kind == "vllm" and "suffix" in body:
            return 400, {"object": "error", "message": "suffix is not currently supported", "type":
                         "BadRequestError", "param": None, "code": 400}
        return None

    def final_fields(self, n: int) -> dict:
        """The speculation fields of a finished request of n tokens: 2 passes of 4 drafted tokens each."""
        accepted = max(0, n - 2)
        if self.kind == "llama-server":
            timings = {"prompt_n": 12, "prompt_ms": 3.0, "predicted_n": n, "predicted_ms": 9.0}
            if self.speculation:
                timings.update(draft_n=8, draft_n_accepted=accepted)
            return self.patched({"timings": timings})
        if self.kind == "vllm":
            self.counters = [self.counters[0] + 2, self.counters[1] + 8, self.counters[2] + accepted]
            out = {"usage": {"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n}}
            if self.speculation:
                out["metrics"] = {"speculative_decoding": {
                    "mean_acceptance_length": n / 2, "draft_acceptance_rate": accepted / 8,
                    "acceptance_histogram": [0, 0, 0, 0, 2], "num_spec_steps": 2,
                    "num_accepted_draft_tokens": accepted, "num_draft_tokens": 8, "num_spec_tokens": 4}}
            return self.patched(out)
        meta = {"id": "r1", "prompt_tokens": 12, "completion_tokens": n, "finish_reason": {"type": "stop"}}
        if self.speculation:
            meta.update(spec_accept_rate=accepted / 8, spec_accept_length=n / 2, spec_verify_ct=2)
        return self.patched({"meta_info": meta})

    def patched(self, fields: dict) -> dict:
        if self.final_patch is not None:
            self.final_patch(fields)
        return fields

    def event(self, i: int, text_so_far: str, last: bool) -> dict:
        piece = self.pieces[i]
        n = i + 1
        if self.kind == "llama-server":
            event = {"index": 0, "content": piece, "tokens": [1000 + i], "stop": False, "id_slot": 0}
            if self.timings_per_token:  # cumulative counts on every event, as llama-server sends them
                event.update(self.final_fields(n))
            if last:
                event.update({"stop": True, "stop_type": "eos", "tokens_predicted": n, **self.final_fields(n)})
            return event
        if self.kind == "vllm":
            return {"id": "cmpl-1", "object": "text_completion", "model": self.model,
                    "choices": [{"index": 0, "text": piece, "logprobs": None,
                                 "finish_reason": "stop" if last else None}], "usage": None}
        event = {"text": text_so_far + piece, "meta_info": {"id": "r1", "completion_tokens": n,
                                                             "finish_reason": None}}
        if last:
            event["meta_info"] = self.final_fields(n)["meta_info"]
        return event

    def post(self, handler, body: dict) -> str:
        self.timings_per_token = bool(body.get("timings_per_token"))
        refused = self.refusal(body)
        if refused:
            status, reply = refused
            extra = {"Retry-After": self.retry_after} if self.retry_after else {}
            send_raw(handler, status, self.status_body if self.status_body is not None else json.dumps(reply).encode(),
                     "application/json", extra)
            return "done"
        if self.whole:
            n, text = len(self.pieces), "".join(self.pieces)
            if self.kind == "llama-server":
                reply = {"content": text, "stop": True, "stop_type": "eos", "tokens_predicted": n}
            elif self.kind == "vllm":
                reply = {"id": "cmpl-1", "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}
            else:
                reply = {"text": text}
            handler._json(200, {**reply, **self.final_fields(n)})
            return "done"
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(data: bytes):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()

        if self.first_delay_s:
            end = time.monotonic() + self.first_delay_s
            while time.monotonic() < end:
                if client_closed(handler.connection):
                    return "closed"
                time.sleep(0.01)
        if self.raw is not None:
            for line in self.raw:
                send(line)
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
            return "done"
        text = ""
        for i in range(len(self.pieces)):
            if self.stall_after is not None and i == self.stall_after:
                end = time.monotonic() + 30
                while time.monotonic() < end:
                    if client_closed(handler.connection):
                        return "closed"
                    time.sleep(0.01)
                return "done"
            if self.end_after is not None and i == self.end_after:
                handler.wfile.write(b"0\r\n\r\n")
                return "done"
            if self.token_delay_s:
                end = time.monotonic() + self.token_delay_s
                while time.monotonic() < end:
                    if client_closed(handler.connection):
                        return "closed"
                    time.sleep(0.005)
            if client_closed(handler.connection):
                return "closed"
            if self.garbage:
                send(b"data: {not json\n\n")
                return "done"
            last = i == len(self.pieces) - 1
            send(b"data: " + json.dumps(self.event(i, text, last)).encode() + b"\n\n")
            text += self.pieces[i]
        if self.kind == "vllm":
            send(b"data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [],
                                         **self.final_fields(len(self.pieces))}).encode() + b"\n\n")
        if self.kind in ("vllm", "sglang"):
            send(b"data: [DONE]\n\n")
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
        return "done"
