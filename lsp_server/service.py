"""Completion scheduling between the editor's requests and the engine.

Order of business for a request: type-ahead and cache answer at once (answers.py); otherwise cancel the
document's running work for another prompt (its prefill stops within a layer, but for the lines above the
cursor) unless the user is typing through the suggestion it is making (then wait for it: type-ahead), start
prefilling this prompt on the model's worker while the debounce runs (a newer request for the document wins),
wait for the model (stale waiters are dropped: newest first), and generate in the model's single worker thread
with a cancel token the loop checks between steps. `$/cancelRequest` cancels the awaiting task, which sets that
token. What happens is told once as completion events (events.py) to whoever keeps something of it.

The first line first: while the user types, a multi-line suggestion is answered once its first line is
complete (and any request once `maxPredictMs` have passed, with its complete lines); the generation goes on
in the background into the cache and the type-ahead, and a `ready` event tells the editor the whole suggestion is
there. What is shown is always a prefix of the target's own answer for the prompt (syntax.ready_lines).

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
from dataclasses import dataclass, field, replace
from typing import Callable

from lsp_server import source_metrics
from lsp_server.events import CompletionEvents, Metrics, Online, Traces
from lsp_server.answers import Answers
from lsp_server.metrics import MetricsStore, RequestRecord
from lsp_server.online import OnlineAdaptation
from lsp_server.settings import Settings
from lsp_server.traces import TraceStore
from specdec.backends.base import UNRESOLVED, CompletionRequest
from specdec.completion import syntax

log = logging.getLogger("specdec.server")

MAX_WAITING = 2  # requests allowed to wait behind the running one; older ones are dropped
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
    prefetch: bool = False  # asked by the server itself (after an accept): no debounce, nobody waits on it
    started: float = 0.0  # when the model's worker began its generation (perf_counter), for the metrics

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
    request: EditorRequest | None = field(default=None, repr=False)  # what it answered: the prefetch after accept


@dataclass
class Prefilling:
    """An early prefill on the model's worker: `token` stops it once superseded, but for the lines above its cursor,
    which the next keystrokes share; `closed` stops those too (the document closed, or the cursor left them)."""

    request: EditorRequest
    key: tuple
    token: object
    closed: object


def lines_above(request: EditorRequest) -> str:
    """The text before the cursor's line: what typing on that line leaves as it is."""
    prefix = request.completion.prefix
    return prefix[: prefix.rfind("\n") + 1]


@dataclass
class Generating:
    """A generation on the model's worker: whose request, its cancel token and future, and the raw text it has made
    so far (the worker writes it), so a keystroke that types through it can wait for its suggestion."""

    request: EditorRequest
    key: tuple
    token: object
    job: asyncio.Future | None = None
    made: str = ""
    settled: asyncio.Future | None = None  # done once its text is in the cache and the type-ahead (or it failed)


def continues(old: EditorRequest, new: EditorRequest, made: str) -> bool:
    """Whether `new` is `old` with characters typed at the cursor that the old generation made, as far as it made
    them: the user is typing through the suggestion under way, whose type-ahead will answer. Nothing made yet
    says nothing: no."""
    a, b = old.completion, new.completion
    if not made or a.suffix != b.suffix or len(b.prefix) <= len(a.prefix) or not b.prefix.startswith(a.prefix):
        return False
    typed = b.prefix[len(a.prefix) :]
    return made.startswith(typed) or typed.startswith(made)


@dataclass
class Run:
    """A generation as the scheduler saw it: the editor's answer, and whether the generation goes on after it."""

    text: str | None  # what the editor is answered (the whole text, or the complete lines so far); None: nothing
    whole: object | None  # the CompletionResult where the generation ended before the answer, else None
    job: asyncio.Future | None  # the generation's (text, result), where it goes on after an early answer
    answered_ms: float  # request received -> answer
    gen: Generating | None = None  # settled by whoever handles its end


class CompletionService:
    def __init__(self, host, metrics: MetricsStore, settings: Settings):
        self.host = host
        self.metrics = metrics
        self._settings = settings
        self.answers = Answers()  # the answer cache and the type-ahead
        # uri -> (number, key, request) of its newest request: replaced whole, so the worker reads it in one go
        self.latest: dict[str, tuple[int, tuple, EditorRequest]] = {}
        self.generating: dict[str, Generating] = {}  # uri -> its generation on the model's worker
        self._prefilling: dict[str, Prefilling] = {}  # uri -> its early prefill
        self.shown: OrderedDict[str, Suggestion] = OrderedDict()  # id -> suggestion, for acceptance
        self.inflight: dict[tuple, asyncio.Future] = {}  # key -> text of the generation under way
        self._numbers = itertools.count(1)
        self._model_turn = asyncio.Lock()
        self._waiting: list[int] = []
        self.counters = {"cancelled": 0, "superseded": 0, "dropped": 0, "errors": 0, "prefetched": 0}
        self._background: set[asyncio.Future] = set()  # generations going on after their early answer, prefetches
        self.online = OnlineAdaptation(host, metrics, settings)  # the draft adapter learns from accepted completions
        self.traces = TraceStore()  # the pass traces of each document's latest model completions (specdec/trace)
        # what happens to completions, told once to whoever keeps something of it (the server subscribes the
        # repository index and the editor's notification)
        self.events = CompletionEvents(Metrics(metrics), Online(self.online),
                                       Traces(self.traces, lambda: self.host.tokenizer()))
        self._syntax = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-syntax")

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, new: Settings) -> None:
        """A change of any setting that can change a suggestion drops what was computed under the old one."""
        if new.output_key() != self._settings.output_key():
            self.answers.clear()
        self._settings = new
        self.events.configured(new)

    def forget(self, uri: str) -> None:
        """didClose: a closed document's text must not stay in memory (the cache holds only bounded windows)."""
        self.answers.forget(uri)
        self.latest.pop(uri, None)
        self.events.forgot(uri)
        self._supersede(uri, None)

    def cancel_all(self) -> None:
        """Every generation and prefill stops at its next step (the server is exiting)."""
        for gen in list(self.generating.values()):
            gen.token.cancel()
        for prefilling in list(self._prefilling.values()):
            prefilling.token.cancel()
            prefilling.closed.cancel()

    def _finish(self, request: EditorRequest, text: str, source: str, generation=None,
                early: bool = False) -> Suggestion | None:
        """The suggestion the editor is answered (None for no text), and its metrics record unless it was answered
        early (the background records it when the generation ends, with its stats)."""
        if request.prefetch:  # nobody was answered: the cache and the type-ahead hold it (_done)
            self.counters["prefetched"] += bool(text)
            return None
        if not early:
            self._record(request, source, generation, shown=bool(text))
        if not text:
            return None
        c = request.completion
        suggestion = Suggestion(uuid.uuid4().hex[:12], text, source, c.language, c.workspace, request.adapter,
                                c.prefix[-ACCEPTED_CONTEXT_CHARS:], c.document, request)
        self.shown[suggestion.id] = suggestion
        self.events.served(suggestion, request, generation)
        while len(self.shown) > 256:
            self.shown.popitem(last=False)
        return suggestion

    def _record(self, request: EditorRequest, source: str, generation=None, shown: bool = False,
                latency_ms: float | None = None, early: bool = False) -> None:
        """One metrics record: latency_ms is what the editor waited (now - received unless given); a backend's
        CompletionResult adds the engine's GenerationStats fields, or a remote engine's counts (with "engine",
        "speculation" and its adapter), and where the time went (queue: debounce and waiting for the model)."""
        if latency_ms is None:
            latency_ms = (time.perf_counter() - request.received) * 1000
        c = request.completion
        record = RequestRecord(time.time(), c.language, c.workspace, source, latency_ms, shown=shown,
                               adapter=request.adapter, early=early)
        if generation is not None:
            s = generation.stats
            record.engine, record.speculation = s.get("engine", "local"), s.get("speculation", "reported")
            record.new_tokens, record.produced = s.get("new_tokens") or 0, s.get("produced") or 0
            record.drafted, record.accepted = s.get("drafted") or 0, s.get("accepted") or 0
            record.target_passes = s.get("target_passes") or 0
            record.decode_seconds = s.get("seconds", 0.0) - s.get("prefill_seconds", 0.0)
            record.prefill_seconds = s.get("prefill_seconds", 0.0)
            record.prefill_reused, record.prefill_computed = s.get("prefill_reused", 0), s.get("prefill_computed", 0)
            record.by_source = source_metrics.from_stats(s)
            record.adapter = s.get("adapter") or record.adapter
        if request.started:
            record.queue_ms = (request.started - request.received) * 1000
        self.events.recorded(record)

    def accept(self, suggestion_id: str) -> bool:
        suggestion = self.shown.pop(suggestion_id, None)
        if suggestion is None:
            return False
        self.events.accepted(suggestion)
        self._prefetch_after(suggestion)
        return True

    def _prefetch_after(self, accepted: Suggestion) -> None:
        """The suggestion at the cursor the accept leaves (the text before it plus the accepted text), generated
        now into the cache: the editor's next request there is answered from it (llama.vscode's "cache future
        suggestion"). Nothing where no event loop runs (a caller outside the server)."""
        origin = accepted.request
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if origin is None or not self.settings.language_enabled(accepted.language):
            return
        c = origin.completion
        ahead = EditorRequest(origin.uri, replace(c, prefix=c.prefix + accepted.text, trace=False), prefetch=True)
        self._in_background(self.complete(ahead))

    def _in_background(self, work) -> None:
        """Run a coroutine nobody awaits (a prefetch, the rest of an early answer), held until it ends."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def complete(self, request: EditorRequest) -> Suggestion | None:
        self.events.began(request)
        try:
            return await self._complete(request)
        except asyncio.CancelledError:  # $/cancelRequest, while debouncing, waiting or generating
            self.counters["cancelled"] += 1
            raise
        finally:
            self.events.ended(request)

    async def _complete(self, request: EditorRequest) -> Suggestion | None:
        settings = self.settings
        if not settings.language_enabled(request.completion.language):
            return None
        adapter = self.host.adapter_for(request.completion.workspace)  # hits are attributed to it, not the last run's
        request.adapter, request.resolved_adapter = (adapter.name if adapter else ""), adapter
        text = self.answers.typeahead(request, settings)
        if text is not None:
            return self._finish(request, text, "typeahead")
        key = self.answers.key(request, settings)
        text = self.answers.cached(key)
        if text is not None:
            return self._finish(request, text, "cache")
        if not self.host.ready:
            log.info("no completion for %s: model %s%s", request.uri, self.host.state,
                     f" ({self.host.error})" if self.host.error else "")
            return None
        ctx = await self._analyze(request)
        if ctx.in_string_or_comment and not request.invoked:
            return None

        number = next(self._numbers)
        self.latest[request.uri] = (number, key, request)
        # the document's work for another prompt is out of date now, unless this keystroke types through the
        # suggestion its generation is making (the worker stops it the moment it makes something else)
        through = self._typed_through(request, key)
        self._supersede(request.uri, key, keep=through, newest=request)
        if settings.debounce_ms and not request.invoked and not request.prefetch:
            if through is None:
                self._prefill_early(request, key, settings)  # the debounce's wait is the prefill's time
            await asyncio.sleep(settings.debounce_ms / 1000)
            if self.latest.get(request.uri, (None,))[0] != number:
                self.counters["superseded"] += 1
                return None
        through = self._typed_through(request, key)
        if through is not None:  # its suggestion answers by type-ahead once it is whole
            await asyncio.shield(through.settled)
            text = self.answers.typeahead(request, self.settings)
            if text is not None:
                return self._finish(request, text, "typeahead")
            if self.latest.get(request.uri, (None,))[0] != number:
                self.counters["superseded"] += 1
                return None
        shared = self.inflight.get(key)
        if shared is not None:  # the same prompt is being generated (e.g. completion + inline): share it
            text = await asyncio.shield(shared)
            return self._finish(request, text, "cache") if text else None
        outcome = asyncio.get_running_loop().create_future()  # the first answer, for requests sharing it
        self.inflight[key] = outcome
        request.completion.trace = self.traces.asked  # p and q in the pass trace, once a client asked for traces
        run = None
        try:
            run = await self._generate(request, ctx, settings, number, key)
        finally:
            answered = run is not None and run.text is not None
            outcome.set_result(run.text if answered else "")
            if run is None or run.job is None:  # else the background holds it until the generation ends
                del self.inflight[key]
        if run is not None and run.job is None:  # the generation ended before any early answer
            try:
                return self._done(request, key, run.text, run.whole, settings) if answered else None
            finally:
                self._settle(run.gen)
        if not answered:
            return None
        # answered early: the type-ahead serves the shown lines now, the rest when the background ends
        self.answers.remember(request, run.text, settings)
        suggestion = self._finish(request, run.text, "model", early=True)
        self._in_background(self._complete_in_background(request, key, run, settings, suggestion))
        return suggestion

    def _done(self, request: EditorRequest, key: tuple, text: str, result, settings: Settings,
              record: bool = True) -> Suggestion | None:
        """A whole generation: into the cache, the type-ahead and the traces; the suggestion (record: made here)."""
        self.events.generated(request, text, result)
        self.answers.store(key, request, text, settings)
        return self._finish(request, text, "model", result) if record else None

    async def _complete_in_background(self, request: EditorRequest, key: tuple, run, settings: Settings,
                                      shown: Suggestion | None) -> None:
        """The rest of a suggestion answered early: the whole one into the cache and the type-ahead (unless the
        document moved on: its next request cancelled it), the request's metrics record, and the `ready` event."""
        try:
            try:
                generation = await run.job
            except Exception as exc:  # noqa: BLE001 - a model failure: the early answer stays what was shown
                generation = None
                self.counters["errors"] += 1
                log.error("generation failed for %s: %s", request.uri, exc)
            finally:
                del self.inflight[key]
            done = generation is not None and generation[1].stop_reason not in ("cancelled", "error")
            self._record(request, "model", generation[1] if generation else None, shown=True,
                         latency_ms=run.answered_ms, early=True)
            if not done:
                return
            text, result = generation
            if shown is not None and not text.startswith(shown.text):  # ready_lines' promise broken: a bug
                log.warning("a suggestion answered early is not the start of the whole one (%r, %r)", shown.text,
                            text)
            self._done(request, key, text, result, settings, record=False)
            if shown is not None and text != shown.text:
                shown.text = text  # an accept after this counts (and indexes) the whole suggestion
                self.events.ready(request.uri)
        finally:
            self._settle(run.gen)

    def _typed_through(self, request: EditorRequest, key: tuple) -> Generating | None:
        """The document's generation under way for another prompt that this request types through (continues)."""
        gen = self.generating.get(request.uri)
        if gen is None or gen.key == key or not continues(gen.request, request, gen.made):
            return None
        return gen

    def _supersede(self, uri: str, key: tuple | None, keep: Generating | None = None,
                   newest: EditorRequest | None = None) -> None:
        """Cancel the document's generation (but `keep`) and early prefill unless they are for this very prompt
        (key None: whatever they are for). The prefill keeps the lines above its cursor where `newest` shares them."""
        gen = self.generating.get(uri)
        if gen is not None and gen is not keep and gen.key != key:
            gen.token.cancel()
        prefilling = self._prefilling.get(uri)
        if prefilling is not None and prefilling.key != key:
            prefilling.token.cancel()
            if newest is None or not newest.completion.prefix.startswith(lines_above(prefilling.request)):
                prefilling.closed.cancel()

    def _settle(self, gen: Generating | None) -> None:
        """The generation's outcome is in the cache and the type-ahead (or it failed): its waiters go on."""
        if gen is None:
            return
        if self.generating.get(gen.request.uri) is gen:
            del self.generating[gen.request.uri]
        if not gen.settled.done():
            gen.settled.set_result(None)

    def _prefill_early(self, request: EditorRequest, key: tuple, settings: Settings) -> None:
        """Start the prompt's prefill on the model's worker now, cancelled by the document's next request: the
        generation after the debounce then finds the prompt in the KV cache."""
        from specdec.engine.session import CancelToken

        prefilling = Prefilling(request, key, CancelToken(), CancelToken())
        self._prefilling[request.uri] = prefilling

        def forget(_) -> None:
            if self._prefilling.get(request.uri) is prefilling:
                del self._prefilling[request.uri]

        job = asyncio.get_running_loop().run_in_executor(self.host.executor, self.host.prefill, request, settings,
                                                         prefilling.token, prefilling.closed)
        job.add_done_callback(forget)
        job.add_done_callback(lambda done: done.cancelled() or done.exception())  # failures show in the generation

    async def _analyze(self, request: EditorRequest) -> syntax.CursorContext:
        """tree-sitter parses up to 40,000 characters around the cursor (tens of ms in a big document), off the event
        loop: in one thread of its own, so requests are analysed, and go on, in the order they came."""
        c = request.completion
        return await asyncio.get_running_loop().run_in_executor(self._syntax, syntax.analyze, c.language, c.prefix,
                                                                c.suffix)

    async def _generate(self, request: EditorRequest, ctx: syntax.CursorContext, settings: Settings, number: int,
                        key: tuple) -> Run | None:
        """Wait for the model's turn (dropped when the document's newest request asks another prompt, or newer ones
        wait), then generate on its worker until the whole text, or an early answer (_watch), is there. The turn is
        held until the worker has stopped, whatever the caller does; the caller settles the Run's generation."""
        from specdec.engine.session import CancelToken

        self._waiting.append(number)
        try:
            await self._model_turn.acquire()
            newer = sum(1 for n in self._waiting if n > number)
        finally:
            self._waiting.remove(number)
        if self.latest.get(request.uri, (None, None))[1] != key or newer >= MAX_WAITING:
            self._model_turn.release()
            self.counters["dropped"] += 1
            return None
        loop = asyncio.get_running_loop()
        gen = Generating(request, key, CancelToken(), settled=loop.create_future())
        self.generating[request.uri] = gen
        early = loop.create_future()
        watch = self._watch(gen, ctx, settings, early, loop)

        def work():
            request.started = time.perf_counter()
            return self.host.generate(request, ctx, settings, gen.token, watch)

        gen.job = loop.run_in_executor(self.host.executor, work)
        gen.job.add_done_callback(lambda _: self._model_turn.release())
        try:
            await asyncio.wait([gen.job, early], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            gen.token.cancel()  # $/cancelRequest: the decode loop stops at its next step
            await asyncio.wait([gen.job])  # answered once the worker has stopped
            self._settle(gen)
            raise
        answered_ms = (time.perf_counter() - request.received) * 1000
        if not gen.job.done():
            return Run(early.result(), None, gen.job, answered_ms, gen)
        try:
            text, result = gen.job.result()
        except Exception as exc:  # a model failure answers empty; the server stays up
            self.counters["errors"] += 1
            log.error("generation failed for %s: %s", request.uri, exc)
            return Run(None, None, None, answered_ms, gen)
        # an engine failure (remote) answers empty and, like a cancel, leaves nothing in the cache
        done = result.stop_reason not in ("cancelled", "error")
        return Run(text if done else None, result if done else None, None, answered_ms, gen)

    def _watch(self, gen: Generating, ctx: syntax.CursorContext, settings: Settings, early: asyncio.Future,
               loop) -> Callable[[str], None]:
        """What the worker tells each text the stop rules let go on (on its thread): the text is kept as what the
        generation made; a generation the document's newest request no longer types through is cancelled; and once
        the text holds complete lines (ready_lines) the editor is answered with them: at the first while the user
        types (firstLineFirst), else once maxPredictMs have passed since the request came."""
        request, uri = gen.request, gen.request.uri
        multiline = ctx.multiline and settings.multiline
        first_line = settings.first_line_first and multiline and not request.invoked and not request.prefetch
        deadline = request.received + settings.max_predict_ms / 1000 if settings.max_predict_ms else None
        answers = multiline and not request.prefetch and (first_line or deadline is not None)
        said = False

        def progress(text: str) -> None:
            nonlocal said
            gen.made = text
            newest = self.latest.get(uri)  # one read: the loop thread replaces the triple whole
            if newest is not None and newest[1] != gen.key and not continues(request, newest[2], text):
                gen.token.cancel()  # the user typed something else
                return
            if said or not answers or not (first_line or time.perf_counter() >= deadline):
                return
            lines = syntax.ready_lines(ctx, text)
            if lines:
                said = True
                loop.call_soon_threadsafe(lambda: early.done() or early.set_result(lines))

        return progress
