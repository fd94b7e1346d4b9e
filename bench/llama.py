"""llama.cpp's `llama-server` as the anchor in `specdec bench`: same GGUFs, same holes, same token ids.

The benchmark starts the server (specdec.backends.llama_server, the HTTP client) and sends each hole's prompt as
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
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from specdec.backends.llama_server import LlamaExited, LlamaResult, LlamaServer, exit_reason

STRATEGIES = ("llama-plain", "llama-draft", "llama-ngram")
REPACK_OFF_NOTE = "repack off"


def server_args(strategy: str, draft_gguf: Path | None) -> list[str]:
    """llama.cpp's own speculation at its fastest on these 2 cores (specdec_bench.llama_sweep, docs/benchmarks.md
    "llama.cpp's speculation at its best"): the draft model with llama.cpp's own draft length and 2 draft threads,
    and its default speculation (`--spec-default`: prompt n-grams, no draft model).

    This llama.cpp (b11434) loads `-md` without drafting unless `--spec-type draft-simple` names the draft as the
    speculation to run (`/props` does not tell; a reply's `timings.draft_n` does)."""
    if strategy == "llama-plain":
        return []
    if strategy == "llama-draft":
        if draft_gguf is None:
            raise ValueError("llama-draft needs the draft model's GGUF")
        return ["-md", str(draft_gguf), "--spec-type", "draft-simple", "-td", "2"]
    if strategy == "llama-ngram":
        return ["--spec-default"]
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
