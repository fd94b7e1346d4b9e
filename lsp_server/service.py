"""Completion scheduling between the editor's requests and the engine.

Order of business for a request: type-ahead and cache answer at once; otherwise wait
out the debounce (a newer request for the document wins), cancel the document's
running generation, wait for the model (stale waiters are dropped: newest first), and
generate in the model's single worker thread with a cancel token the loop checks
between steps. `$/cancelRequest` cancels the awaiting task, which sets that token.

The host (lsp_server/hosts.py: the in-process models and their single worker, or a remote engine) computes; this
module decides when, and for which request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from lsp_server import source_metrics
from lsp_server.metrics import MetricsStore, RequestRecord
from lsp_server.online import OnlineAdaptation
from lsp_server.settings import Settings
from lsp_server.traces import TraceStore
from specdec.backends.base import UNRESOLVED, CompletionRequest
from specdec.completion import syntax

log = logging.getLogger("specdec.server")

MAX_WAITING = 2  # requests allowed to wait behind the running one; older ones are dropped
CACHE_SIZE = 512
MAX_DOCUMENTS = 64  # documents whose last suggestion is kept for type-ahead
ACCEPTED_CONTEXT_CHARS = 1000  # text before a suggestion kept with it, for the repository index if it is accepted


@dataclass
class EditorRequest:
    """An editor's request: the completion it asks for (the backends' one CompletionRequest, from the cursor down to
    the drafters) in the thin LSP envelope only the scheduler reads: the document, the trigger, the arrival."""

    uri: str
    completion: CompletionRequest  # text around the cursor, path, context; the host adds the settings' fields
    invoked: bool = False  # explicitly asked for (not automatic on typing)
    received: float = field(default_factory=time.perf_counter)
    adapter: str = ""  # name@version of the workspace's draft adapter, "" for the base draft
    # what the host's adapter_for returned for it (None: the base draft), looked up once: the host drafts with it
    resolved_adapter: object = field(default=UNRESOLVED, repr=False)

    @classmethod
    def at(cls, uri: str, language: str, workspace: str, prefix: str, suffix: str, invoked: bool = False,
           **fields) -> "EditorRequest":
        """The request at a cursor; fields: the CompletionRequest's others (path, context, document, chunks)."""
        return cls(uri, CompletionRequest(prefix, suffix, language=language, workspace=workspace, **fields), invoked)


@dataclass
class Suggestion:
    id: str
    text: str
    source: str  # "model" | "cache" | "typeahead"
    language: str
    workspace: str
    adapter: str = ""
    context: str = ""  # the end of the text before the cursor: an accepted suggestion is indexed with it
    document: str = ""  # the request's document (its index key): the file filter judges the accepted text by it


class CompletionService:
    def __init__(self, host, metrics: MetricsStore, settings: Settings):
        self.host = host
        self.metrics = metrics
        self._settings = settings
        self.cache: OrderedDict[tuple, str] = OrderedDict()
        # uri -> (prefix, suffix, suggestion, settings.output_key()) for type-ahead; bounded, and dropped
        # when the document closes
        self.last: OrderedDict[str, tuple[str, str, str, tuple]] = OrderedDict()
        self.latest: dict[str, int] = {}  # uri -> newest request number
        self.running: dict[str, object] = {}  # uri -> CancelToken of its generation
        self.shown: OrderedDict[str, Suggestion] = OrderedDict()  # id -> suggestion, for acceptance
        self.inflight: dict[tuple, asyncio.Future] = {}  # key -> text of the generation under way
        self._numbers = itertools.count(1)
        self._model_turn = asyncio.Lock()
        self._waiting: list[int] = []
        self.counters = {"cancelled": 0, "superseded": 0, "dropped": 0, "errors": 0}
        self.on_accept: Callable[[Suggestion], None] = lambda suggestion: None  # e.g. index what the user took
        self.online = OnlineAdaptation(host, metrics, settings)  # the draft adapter learns from accepted completions
        self.traces = TraceStore()  # the pass traces of each document's latest model completions (specdec/trace)
        self._syntax = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-syntax")

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, new: Settings) -> None:
        """A change of any setting that can change a suggestion drops what was computed under the old one."""
        if new.output_key() != self._settings.output_key():
            self.cache.clear()
            self.last.clear()
        self._settings = new
        self.online.configure(new)

    def _key(self, request: EditorRequest) -> tuple:
        """Everything a suggestion depends on: the request, and every output-affecting setting (from the schema)."""
        c = request.completion
        return (c.language, c.prefix[-4000:], c.suffix[:2000], c.context[-2000:], request.adapter,
                self.settings.output_key())

    def forget(self, uri: str) -> None:
        """didClose: a closed document's text must not stay in memory (the cache holds only bounded windows)."""
        self.last.pop(uri, None)
        self.latest.pop(uri, None)
        self.online.forget(uri)
        self.traces.forget(uri)
        token = self.running.get(uri)
        if token is not None:
            token.cancel()

    def _typeahead(self, request: EditorRequest) -> str | None:
        last = self.last.get(request.uri)
        if not last:
            return None
        prefix, suffix, text, made_under = last
        if made_under != self.settings.output_key():  # a generation that finished after a settings change
            return None
        if request.completion.suffix != suffix or not request.completion.prefix.startswith(prefix):
            return None
        typed = request.completion.prefix[len(prefix) :]
        if typed and text.startswith(typed) and len(typed) < len(text):
            return text[len(typed) :]
        return None

    def _finish(self, request: EditorRequest, text: str, source: str, generation=None) -> Suggestion | None:
        latency_ms, c = (time.perf_counter() - request.received) * 1000, request.completion
        record = RequestRecord(time.time(), c.language, c.workspace, source, latency_ms,
                               shown=bool(text), adapter=request.adapter)
        if generation is not None:  # a backend's CompletionResult: the engine's GenerationStats fields, or a remote
            s = generation.stats    # engine's counts (with "engine", "speculation" and its adapter)
            record.engine, record.speculation = s.get("engine", "local"), s.get("speculation", "reported")
            record.new_tokens, record.produced = s.get("new_tokens") or 0, s.get("produced") or 0
            record.drafted, record.accepted = s.get("drafted") or 0, s.get("accepted") or 0
            record.target_passes = s.get("target_passes") or 0
            record.decode_seconds = s.get("seconds", 0.0) - s.get("prefill_seconds", 0.0)
            record.prefill_reused, record.prefill_computed = s.get("prefill_reused", 0), s.get("prefill_computed", 0)
            record.by_source = source_metrics.from_stats(s)
            record.adapter = s.get("adapter") or record.adapter
        self.metrics.add(record)
        if not text:
            return None
        suggestion = Suggestion(uuid.uuid4().hex[:12], text, source, c.language, c.workspace, request.adapter,
                                c.prefix[-ACCEPTED_CONTEXT_CHARS:], c.document)
        self.shown[suggestion.id] = suggestion
        self.online.served(suggestion, request, generation)
        while len(self.shown) > 256:
            self.shown.popitem(last=False)
        return suggestion

    def accept(self, suggestion_id: str) -> bool:
        suggestion = self.shown.pop(suggestion_id, None)
        if suggestion is None:
            return False
        self.metrics.accepted(suggestion.language, suggestion.workspace, suggestion.adapter)
        self.on_accept(suggestion)
        self.online.accepted_suggestion(suggestion_id)
        return True

    async def complete(self, request: EditorRequest) -> Suggestion | None:
        self.online.begin_request(request)  # an online refresh stops before any generation
        try:
            return await self._complete(request)
        except asyncio.CancelledError:  # $/cancelRequest, while debouncing, waiting or generating
            self.counters["cancelled"] += 1
            raise
        finally:
            self.online.end_request()

    async def _complete(self, request: EditorRequest) -> Suggestion | None:
        settings = self.settings
        if not settings.language_enabled(request.completion.language):
            return None
        adapter = self.host.adapter_for(request.completion.workspace)  # hits are attributed to it, not the last run's
        request.adapter, request.resolved_adapter = (adapter.name if adapter else ""), adapter
        text = self._typeahead(request)
        if text is not None:
            return self._finish(request, text, "typeahead")
        key = self._key(request)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self._finish(request, self.cache[key], "cache")
        if not self.host.ready:
            log.info("no completion for %s: model %s%s", request.uri, self.host.state,
                     f" ({self.host.error})" if self.host.error else "")
            return None
        ctx = await self._analyze(request)
        if ctx.in_string_or_comment and not request.invoked:
            return None

        number = next(self._numbers)
        self.latest[request.uri] = number
        if settings.debounce_ms and not request.invoked:
            await asyncio.sleep(settings.debounce_ms / 1000)
            if self.latest.get(request.uri) != number:
                self.counters["superseded"] += 1
                return None
        shared = self.inflight.get(key)
        if shared is not None:  # the same prompt is being generated (e.g. completion + inline): share it
            text = await asyncio.shield(shared)
            return self._finish(request, text, "cache") if text else None
        previous = self.running.get(request.uri)
        if previous is not None:
            previous.cancel()  # the newer request supersedes the running generation
        outcome = asyncio.get_running_loop().create_future()
        self.inflight[key] = outcome
        generation = None
        request.completion.trace = self.traces.asked  # p and q in the pass trace, once a client asked for traces
        try:
            generation = await self._generate(request, ctx, settings, number)
        finally:
            del self.inflight[key]
            # an engine failure (remote) answers empty and, like a cancel, leaves nothing in the cache
            done = generation is not None and generation[1].stop_reason not in ("cancelled", "error")
            outcome.set_result(generation[0] if done else "")
        if not done:
            return None
        text, result = generation
        if getattr(result, "trace", None) is not None:
            tokenizer = self.host.tokenizer()  # a remote engine's trace holds its counts only: no ids to decode
            self.traces.add(request.uri, result.trace, tokenizer.decode if tokenizer is not None else None, text)
        self.cache[key] = text
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        self.last[request.uri] = (request.completion.prefix, request.completion.suffix, text, settings.output_key())
        self.last.move_to_end(request.uri)
        while len(self.last) > MAX_DOCUMENTS:
            self.last.popitem(last=False)
        return self._finish(request, text, "model", result)

    async def _analyze(self, request: EditorRequest) -> syntax.CursorContext:
        """tree-sitter parses up to 40,000 characters around the cursor (tens of ms in a big document), off the event
        loop: in one thread of its own, so requests are analysed, and go on, in the order they came."""
        c = request.completion
        return await asyncio.get_running_loop().run_in_executor(self._syntax, syntax.analyze, c.language, c.prefix,
                                                                c.suffix)

    async def _generate(self, request, ctx, settings, number):
        from specdec.engine.session import CancelToken

        self._waiting.append(number)
        try:
            async with self._model_turn:
                newer = sum(1 for n in self._waiting if n > number)
                if self.latest.get(request.uri) != number or newer >= MAX_WAITING:
                    self.counters["dropped"] += 1
                    return None
                token = CancelToken()
                self.running[request.uri] = token
                loop = asyncio.get_running_loop()
                job = loop.run_in_executor(self.host.executor, self.host.generate, request, ctx, settings, token)
                try:
                    return await asyncio.shield(job)
                except asyncio.CancelledError:
                    token.cancel()  # $/cancelRequest: the decode loop stops at its next step
                    await asyncio.wait([job])  # keep the model turn until the worker has stopped
                    raise
                except Exception as exc:  # a model failure answers empty; the server stays up
                    self.counters["errors"] += 1
                    log.error("generation failed for %s: %s", request.uri, exc)
                    return None
                finally:
                    if self.running.get(request.uri) is token:
                        del self.running[request.uri]
        finally:
            self._waiting.remove(number)
