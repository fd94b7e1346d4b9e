"""A remote engine behind the backend interface: llama-server, vLLM or SGLang over HTTP.

`complete` streams one completion and applies the caller's stop predicate after every streamed piece, as
the local engine does after every token; when it says stop, the connection is closed (the engine drops
the request) and the text is cut there, so the server's finalize and insert treat a remote suggestion
exactly like a local one. The editor's cancel closes the connection too. A reply is bounded by the request's
max_new_tokens, whatever the engine sends: no more tokens (or pieces) than that, no more than MAX_TOKEN_CHARS
characters a token; past either the stream is closed there. Every failure becomes an empty result within the
call's bounds (http.Bounds: the settings engine*Seconds) and a state change in `health` (one message per
outage, bounded backoff); nothing raises into the server, whatever the engine sends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from specdec.backends.base import CompletionRequest, CompletionResult
from specdec.backends.remote import API_KEY_ENV, KINDS
from specdec.backends.remote import prompt as fim_prompt
from specdec.backends.remote.engines import ENGINES, NOT_REPORTED, EngineRequest, Reading, Speculation, Vllm
from specdec.backends.remote.health import Health
from specdec.backends.remote.http import Bounds, Call, Cancelled, EngineError, Endpoint, get_json, get_text
from specdec.backends.remote.tokens import CHARS_PER_TOKEN, TokenCounter, target_tokenizer

log = logging.getLogger("specdec.engine")

PREDICT_MS = 5000  # llama-server's own cap on prediction time (t_max_predict_ms), a backstop
MAX_TOKEN_CHARS = 64  # characters of reply per token asked for at most (code models' longest tokens are shorter)
DISCOVERY = {"llama-server": "/props", "vllm": "/v1/models", "sglang": "/get_model_info"}  # what it serves


@dataclass
class EngineTrace:
    """A remote completion's trace: the engine's counts only (no per-pass record crosses the wire), in the
    place `specdec/trace` returns the local engine's per-pass Trace (specdec/engine/trace.py)."""

    engine: str
    speculation: str  # reported | prometheus | not reported
    drafted: int | None
    accepted: int | None
    target_passes: int | None
    new_tokens: int
    text: str = ""

    def as_dict(self, decode=None) -> dict:
        return {"engine": self.engine, "speculation": self.speculation, "drafted": self.drafted,
                "accepted": self.accepted, "target_passes": self.target_passes, "new_tokens": self.new_tokens,
                "text": self.text, "passes": []}


def served_adapter_name(repo_key: str) -> str:
    """The name an engine serves a workspace's adapter under (vLLM --lora-modules NAME=..., SGLang
    --lora-paths NAME=..., llama-server's --lora file named NAME.gguf): the registry's repository key."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in repo_key).strip(".-")


class RemoteBackend:
    """kind: llama-server | vllm | sglang. Settings read: engine_url (else the URL it was made with), target,
    fim_family, max_prefix_tokens, max_suffix_tokens, max_snippet_tokens (the repository context's budget),
    adapters, engine_{connect,first_byte,stall,total}_seconds (http.Bounds; at every request)."""

    def __init__(self, kind: str, url: str = "", on_status=lambda state, message: None):
        """Made by specdec.backends.make_backend, which checks the kind and the URL. url: the engine's base URL,
        unless `load`'s settings name one (the server's engineUrl)."""
        if kind not in KINDS:
            raise ValueError(f"unknown engine {kind!r}; known: {', '.join(KINDS)}")
        self.kind, self.engine, self.url = kind, ENGINES[kind](), url
        self.state, self.error, self.progress = "idle", "", ""
        self.on_status = on_status  # (state, one-line message): the server shows it and sets its status bar
        self.health = Health(lambda state, message: self.on_status(state, message))
        self.endpoint: Endpoint | None = None
        self.settings = None
        self.model = ""  # what the engine says it serves
        self.adapters: dict[str, int | None] = {}  # served adapter name -> llama-server's id (None elsewhere)
        self._discovered = False
        self._counters: dict | None = None  # vLLM's last Prometheus scrape, for the fallback deltas
        self._prometheus = kind == "vllm"  # False once /metrics turned out not to have the counters
        self.predict_ms = PREDICT_MS  # llama-server's own time cap per completion; 0: none (the benchmark)
        self.speculation_source = NOT_REPORTED  # how the last request's speculation was known
        # a workspace folder -> its repository's key in the adapter registry (the server's registry lookup;
        # specdec itself does not import the registry)
        self.repo_key_of: Callable[[str], str] = lambda workspace: ""
        self._counter: TokenCounter | None = None  # the target's tokens (or the estimate), built once per target
        self._counter_target: str | None = None
        self._counter_lock = threading.Lock()
        self.repo_index = None  # the RepoIndex in the target's tokens whose best chunks are the engine's context
        self._index_lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def bounds(self) -> Bounds:
        """The time bounds of a call, from the settings in force (a change applies at the next request)."""
        return Bounds.of(self.settings)

    # -- load: check the settings, ask the engine what it serves ------------------------------------------
    def load(self, settings, report=lambda message, percent: None) -> None:
        """Never raises. A bad URL fails the load; an engine that does not answer yet does not: completions
        start when it does (health.py). A load is a new configuration (another engineUrl, say): the old one's
        outage and backoff end with it, and its discovery is the first try."""
        try:
            url = (getattr(settings, "engine_url", "") or self.url).strip()
            self.endpoint = Endpoint(url, os.environ.get(API_KEY_ENV, "").strip())
        except ValueError as exc:
            self.state, self.error = "failed", str(exc)
            return
        self.settings, self._discovered = settings, False
        self.health.reset()
        report(f"asking {self.kind} at {self.endpoint.shown}", 50)
        if self.discover():
            self.health.succeeded()  # says completions resume where an outage had been said
        self.state, self.error, self.progress = "ready", "", ""

    def discover(self) -> bool:
        """The served model and adapters (llama-server /props and /lora-adapters, vLLM /v1/models, SGLang
        /get_model_info and /get_server_info). False, and a health state with one line saying why, where the
        engine did not answer or answered as no engine of this kind would (another kind's 404, a 500, HTML, a
        JSON list); the adapters' endpoints are optional."""
        ep, path = self.endpoint, DISCOVERY[self.kind]
        timeout = self.bounds.connect_s
        try:
            info = get_json(ep, path, timeout)
            if not isinstance(info, dict):
                raise EngineError("shape", f"{ep.shown}{path}: a JSON {type(info).__name__}, not what a {self.kind} "
                                           "answers; is engine the kind of server at engineUrl?")
            if self.kind == "llama-server":
                self.model = str(info.get("model_path") or info.get("model_alias") or "")
            elif self.kind == "vllm":
                models = info.get("data")
                if not isinstance(models, list):
                    raise EngineError("shape", f"{ep.shown}{path}: no model list in the reply")
                base = [m for m in models if isinstance(m, dict) and not m.get("parent")]
                self.model = str(base[0].get("id", "")) if base else ""
                self.adapters = {str(m.get("id")): None for m in models if isinstance(m, dict) and m.get("parent")}
            else:
                self.model = str(info.get("model_path") or "")
        except EngineError as exc:
            reason = ep.describe(exc)
            if exc.status == 404:
                reason += f"; not a {self.kind}? (engine {self.kind} asks {path})"
            self.health.failed(exc.kind, reason, exc.retry_after)
            return False
        except Exception as exc:  # noqa: BLE001 - a reply of a shape no engine sends: one line, never a raise
            self.health.failed("shape", f"{ep.shown}{path}: a reply not understood ({type(exc).__name__})")
            return False
        self.adapters = self._served_adapters(timeout) if self.kind != "vllm" else self.adapters
        if self.kind == "vllm" and self._prometheus:
            self._scrape()
        self._discovered = True
        return True

    def _served_adapters(self, timeout: float) -> dict[str, int | None]:
        """llama-server's /lora-adapters (name -> id), SGLang's /get_server_info lora_paths; {} where the engine
        has none or says nothing readable."""
        ep = self.endpoint
        try:
            if self.kind == "llama-server":
                loras = get_json(ep, "/lora-adapters", timeout)
                return {Path(str(a.get("path", ""))).stem: int(a["id"]) for a in loras
                        if isinstance(a, dict) and "id" in a}
            server = get_json(ep, "/get_server_info", timeout) or {}
            paths = server.get("lora_paths") or {}
            names = paths.keys() if isinstance(paths, dict) else [str(p).split("=")[0] for p in paths]
            return {str(n): None for n in names}
        except (EngineError, AttributeError, TypeError, ValueError, OverflowError):
            return {}

    def token_counter(self, wait: bool = True) -> TokenCounter:
        """The target's tokens: its tokenizer built here on first need (blocking: a GGUF's vocabulary takes
        10-30 s the first time, under a second from the cache after; the server builds it on its loading thread),
        else the CHARS_PER_TOKEN estimate, said once in the log per target. The prompt's windows and the repository
        context's budget are cut in them. wait=False: while another thread builds it, the estimate (a completion
        does not wait)."""
        target = getattr(self.settings, "target", "") or ""
        counter = self._counter
        if counter is not None and self._counter_target == target:
            return counter
        if not self._counter_lock.acquire(blocking=wait):
            return TokenCounter()
        try:
            if self._counter is None or self._counter_target != target:
                tokenizer, why = target_tokenizer(target)
                if tokenizer is None:
                    log.warning("%s: no tokenizer for %r here (%s): the prompt's budgets (prefix, suffix, "
                                "repository context) are estimated at %d characters a token", self.kind, target, why,
                                CHARS_PER_TOKEN)
                self._counter, self._counter_target = TokenCounter(tokenizer), target
            return self._counter
        finally:
            self._counter_lock.release()

    def tokenizer(self):
        """The target's tokenizer where one was built (token_counter), else None (an estimate counts)."""
        counter = self._counter
        return counter.tokenizer if counter is not None and counter.exact else None

    def template(self):
        if self.settings is None:
            return None
        family = self.settings.fim_family or fim_prompt.family_of(self.model, self.settings.target)
        return fim_prompt.template_for(family, self.settings.fim_order)

    def index_for(self, settings):
        """The repository index (its chunks are the engine's context), or None: off, or no tokenizer for its ids."""
        counter = self._counter
        if not settings.repo_index or (counter is not None and not counter.exact):
            return None
        with self._index_lock:
            if self.repo_index is None:
                from specdec.engine.drafters.repo_index import RepoIndex

                self.repo_index = RepoIndex(settings.repo_index_max_tokens)
            return self.repo_index

    def repository_context(self, request: CompletionRequest) -> CompletionRequest:
        """The request with its chunks best first: the index's for the cursor (specdec/repository/context.py), else
        the ones it came with (the server's heads of other open files, most recently opened first)."""
        tokenizer, index = self.tokenizer(), self.repo_index
        if tokenizer is not None and index is not None:
            from specdec.repository.context import best_chunks

            found = best_chunks(index, tokenizer, request.prefix, request.document or None, request.workspace)
            if found:
                return replace(request, chunks=found)
        return replace(request, chunks=list(request.chunks)[::-1])

    def adapter_for(self, workspace: str) -> str:
        """The served adapter for the workspace's repository, or "" (none registered, or not served)."""
        if not workspace or not self.adapters or not getattr(self.settings, "adapters", True):
            return ""
        try:
            name = served_adapter_name(self.repo_key_of(workspace))
        except Exception:  # noqa: BLE001 - no registry, no git: the base model completes
            return ""
        return name if name in self.adapters else ""

    def engine_request(self, request: CompletionRequest) -> EngineRequest:
        s = self.settings
        template = self.template()
        counter = self.token_counter(wait=False)
        prefix, suffix = counter.window(request.prefix, request.suffix, s.max_prefix_tokens, s.max_suffix_tokens)
        chunks = fim_prompt.chunks_within(list(request.chunks), s.max_snippet_tokens, counter)
        workspace = request.workspace
        adapter = self.adapter_for(workspace)
        text = fim_prompt.build(template, prefix, suffix, request.path, chunks,
                                Path(workspace).name if workspace else "")
        return EngineRequest(prefix, suffix, text, chunks, list(template.stop_tokens), request.max_new_tokens,
                             self.predict_ms, request.temperature, request.top_p, request.seed, adapter or self.model,
                             adapter, self.adapters.get(adapter) if adapter else None)

    # -- one completion -----------------------------------------------------------------------------------
    def complete(self, request: CompletionRequest, stop=None, cancel=None) -> CompletionResult:
        """Stream one completion. request.chunks: repository context [{filename, text}], best first; as many as fit
        maxSnippetTokens (in the target's tokens) go to the engine, best last (prompt.chunks_within). Never
        raises: whatever goes wrong is an empty result and a health state with one line."""
        started = time.perf_counter()
        if not self.health.may_try():
            return self._empty("error", started)
        try:
            if not self._discovered and not self.discover():
                return self._empty("error", started)
            return self._stream(request, stop, cancel, started)
        except Exception as exc:  # noqa: BLE001 - an engine's reply we did not foresee: one line, never a raise
            reason = f"{self.endpoint.shown}{self.engine.path}: a reply not understood ({type(exc).__name__})"
            log.warning("%s: %s", self.kind, reason)
            self.health.failed("shape", reason)
            return self._empty("error", started)

    def _stream(self, request: CompletionRequest, stop, cancel, started: float) -> CompletionResult:
        req = self.engine_request(request)
        reading, pieces, reason = Reading(), 0, ""
        most_chars = req.max_tokens * MAX_TOKEN_CHARS
        try:
            with Call(self.endpoint, "POST", self.engine.path, self.engine.body(req), cancel, self.bounds,
                      stream=True) as call:
                call.check_status()
                for event in call.events():
                    before = len(reading.text)
                    if self.engine.read(event, reading):
                        pieces += 1
                    if max(len(reading.tokens), pieces) > req.max_tokens:  # the engine ignored its cap
                        reading.text, reason = reading.text[:before], "max_tokens"
                    if len(reading.text) > most_chars:
                        reading.text, reason = reading.text[:most_chars], "max_tokens"
                    del reading.tokens[req.max_tokens:]
                    cut = stop(reading.text) if stop is not None and reading.text else None
                    if cut is not None:
                        reading.text, reason = reading.text[:cut], "stop"
                    if reason:
                        break  # leaving the block closes the connection: the engine drops the request
                if not reason and not reading.finish:
                    raise EngineError("ended", f"{self.endpoint.shown}{self.engine.path}: the stream ended "
                                               "before the engine said it was done")
        except Cancelled:
            self.health.released()
            return self._result(reading, "cancelled", pieces, started, req.lora)
        except EngineError as exc:
            line = self.endpoint.describe(exc)
            log.warning("%s: %s", self.kind, line)
            self.health.failed(exc.kind, line, exc.retry_after)
            return self._empty("error", started)
        result = self._result(reading, reason or self.engine.stop_reason(reading), pieces, started, req.lora)
        self.health.succeeded()
        return result

    def _speculation(self, reading: Reading) -> Speculation:
        spec = self.engine.speculation(reading)
        if spec.source == NOT_REPORTED and self._prometheus and reading.finish:
            before = self._counters
            after = self._scrape()
            if before is not None and after is not None:
                spec = Vllm.delta(before, after)
        return spec

    def _scrape(self) -> dict | None:
        try:
            counters = Vllm.counters(get_text(self.endpoint, "/metrics", min(1.0, self.bounds.total_s)))
        except EngineError:
            counters = None
        if counters is None:
            self._prometheus = False  # the engine does not count speculation there: stop asking
        self._counters = counters
        return counters

    def _result(self, reading: Reading, reason: str, pieces: int, started: float, adapter: str = "") -> CompletionResult:
        spec = self._speculation(reading) if reason != "cancelled" else Speculation()
        self.speculation_source = spec.source
        finished = reason not in ("stop", "cancelled") and reading.completion_tokens is not None
        tokens = reading.completion_tokens if finished else (len(reading.tokens) or pieces)
        stats = {"engine": self.kind, "adapter": adapter, "new_tokens": tokens, "produced": tokens,
                 "seconds": time.perf_counter() - started, "prefill_seconds": 0.0, **spec.as_stats()}
        trace = EngineTrace(self.kind, spec.source, spec.drafted, spec.accepted, spec.passes, tokens, reading.text)
        return CompletionResult(reading.text, reason, stats, list(reading.tokens), trace)

    def _empty(self, reason: str, started: float) -> CompletionResult:
        return CompletionResult("", reason, {"engine": self.kind, "new_tokens": 0, "produced": 0,
                                         "seconds": time.perf_counter() - started, "prefill_seconds": 0.0,
                                         "speculation": NOT_REPORTED, "drafted": None, "accepted": None,
                                         "target_passes": None, "engine_state": self.health.state})

    def stats(self) -> dict:
        """For specdec/stats: which engine, where (no credentials), what it serves, its health."""
        return {"kind": self.kind, "url": self.endpoint.shown if self.endpoint else "", "model": self.model,
                "adapters": sorted(self.adapters), "speculation": self.speculation_source,
                "key": bool(self.endpoint and self.endpoint.api_key), **self.health.status()}
