"""Speculative decoding: a drafter proposes, the target verifies all proposals in one pass.

A `Session` owns the target's KV cache and the drafter, and keeps both between calls:
an editor's consecutive requests share almost all of their prompt, so only the new
suffix is prefilled. Every strategy (plain included: no drafter) runs the same loop,
and every token, drafted or not, is chosen by `acceptance.verify_tree`: a linear draft
is the one-branch tree, so chains and trees take one path through the target
(`CachedLM.extend_tree`, then `keep_path` of the accepted branch). The target is a CachedLM
(engine/cached_lm.py): a forward of our own, or a transformers module wrapped in KVModel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

from specdec.engine.acceptance import verify_tree
from specdec.engine.drafters.base import NO_REQUEST, Draft, Drafter, RequestContext
from specdec.engine.cached_lm import Cancelled, as_cached_lm
from specdec.engine.sampling import SamplingConfig, probabilities
from specdec.engine.trace import PLAIN, PassRecord, Trace, next_kind, probabilities_of
from specdec.engine.tree import ROOT, TokenTree

StopPredicate = Callable[[str], "int | None"]
"""Given the decoded completion so far, return a cut position to stop there, or None to go on."""


class CancelToken:
    """Set from any thread; the decode loop checks it between steps."""

    def __init__(self):
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass
class GenerationConfig:
    max_new_tokens: int = 64
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_draft: int = 8  # cap on drafted tokens per target pass
    trace: bool = False  # record the target's p and the draft's q of every drafted token (a softmax per pass)


@dataclass
class GenerationStats:
    strategy: str = ""
    target_passes: int = 0  # the prefill pass counts: it yields the first token
    drafted: int = 0  # draft tokens verified: a tree's nodes
    accepted: int = 0  # of them, kept: the accepted path's length
    drafted_depth: int = 0  # the drafts' depths (longest path) summed: what could have been kept; drafted, for chains
    tree_passes: int = 0  # passes whose draft branched (more nodes than depth)
    new_tokens: int = 0
    produced: int = 0  # tokens the passes yielded: new_tokens plus a stop token, if one ended the call
    prefill_computed: int = 0  # target prompt tokens run through the model
    prefill_reused: int = 0  # target prompt tokens served from the session's KV cache
    draft_prefill_computed: int = 0
    draft_prefill_reused: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    seconds: float = 0.0
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    # target passes that verified a draft of that source (a merged tree's pass counts for each source in it)
    passes_by: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_trace(cls, trace: Trace) -> GenerationStats:
        """The counters as folds of the pass trace (trace.py): computed once, from the records."""
        by_source = trace.by_source()
        return cls(trace.strategy, trace.target_passes, trace.drafted, trace.accepted, trace.drafted_depth,
                   trace.tree_passes, trace.new_tokens, trace.produced, trace.prefill_computed, trace.prefill_reused,
                   trace.draft_prefill_computed, trace.draft_prefill_reused, trace.prefill_seconds,
                   trace.draft_seconds, trace.verify_seconds, trace.seconds,
                   {name: s.drafted for name, s in by_source.items()},
                   {name: s.accepted for name, s in by_source.items()},
                   {name: s.passes for name, s in by_source.items()})

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.produced / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate, "tokens_per_pass": self.tokens_per_pass,
                "tokens_per_second": self.tokens_per_second}


@dataclass
class Generation:
    tokens: list[int]
    text: str
    stop_reason: str  # "eos" | "max_tokens" | "stop" | "cancelled"
    stats: GenerationStats
    trace: Trace | None = None  # the passes the stats were folded from (None: not made by a Session)


class Session:
    """The decode loop over one target and one drafter. Its configuration (drafter, strategy, stop ids, cost
    curve) is given once, at construction (strategies.make_session builds one for a strategy), and never
    re-targeted: another drafter or stop set is another Session over the same target, KV cache and lock
    (`derive`). What one request tells the drafters (the document, excluded files) is the `request` argument of
    `generate`, never state set on them."""

    def __init__(self, target, tokenizer, drafter: Drafter | None = None, stop_token_ids: Iterable[int] = (),
                 strategy: str | None = None, cost_curve=None, stop_on_eos: bool = True, lock=None):
        """cost_curve: the target's verify cost per pass size (a LearnedCostCurve) when a strategy plans; every
        timed pass corrects it. stop_on_eos: the tokenizer's EOS stops too (False: only stop_token_ids). lock: a
        session over the same target's lock (derive), since the caches are shared state."""
        self.target = as_cached_lm(target)
        self.tokenizer = tokenizer
        self._drafter = drafter
        self._strategy = strategy or (drafter.name if drafter else "plain")
        self._stop_token_ids = stop_ids(tokenizer, stop_token_ids) if stop_on_eos else frozenset(stop_token_ids)
        self._cost_curve = cost_curve
        self.lock = lock or threading.Lock()  # one generation at a time: the caches are shared state

    @property
    def drafter(self) -> Drafter | None:
        return self._drafter

    @property
    def strategy(self) -> str:
        return self._strategy

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop_token_ids

    @property
    def cost_curve(self):
        """The target's verify cost per pass size (a LearnedCostCurve), when a strategy plans; else None."""
        return self._cost_curve

    def derive(self, **changes) -> Session:
        """Another Session over this one's target, with its KV cache and its lock (a cache reused, not rebuilt),
        the tokenizer and, unless changed, the drafter, strategy, stop ids and cost curve. changes: drafter,
        strategy (with a new drafter and no strategy: the drafter's name, or plain), stop_token_ids (the whole
        set: EOS is not added), cost_curve. This session is left as it was."""
        unknown = set(changes) - {"drafter", "strategy", "stop_token_ids", "cost_curve"}
        if unknown:
            raise TypeError(f"Session.derive: unknown fields {sorted(unknown)}")
        drafter = changes.get("drafter", self._drafter)
        strategy = changes.get("strategy", None if "drafter" in changes else self._strategy)
        return Session(self.target, self.tokenizer, drafter, changes.get("stop_token_ids", self._stop_token_ids),
                       strategy, changes.get("cost_curve", self._cost_curve), stop_on_eos=False, lock=self.lock)

    def reset(self) -> None:
        self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()

    def prefill(self, prompt: list[int], cancel: CancelToken | None = None, stable: int = 0,
                closed: CancelToken | None = None) -> bool:
        """The prompt into the target's and the drafter's caches, nothing generated: what `generate` does first,
        done ahead (the editor's debounce), so a generate of this prompt then reuses all of it but the last token.
        False when cancel stopped it (between chunks; the native forward: between layers). The first `stable`
        tokens (what the next prompts share, fim.FimPrompt.stable) are prefilled even once cancel is set, so a
        superseded request's work is kept for the next one; `closed` stops those too."""
        cancelled = (lambda: cancel.cancelled) if cancel else (lambda: False)
        hard = (lambda: closed.cancelled) if closed else None
        with self.lock:
            try:
                models = [self.target.sync] + ([self.drafter.prefill] if self.drafter is not None else [])
                if 0 < stable < len(prompt) and self.target.shared_prefix(prompt[:stable]) < stable:
                    for prefill in models:
                        prefill(prompt[:stable], hard)
                for prefill in models:
                    prefill(prompt, cancelled)
            except Cancelled:
                return False
        return True

    def generate(self, prompt: list[int], config: GenerationConfig | None = None,
                 stop: StopPredicate | None = None, cancel: CancelToken | None = None,
                 request: RequestContext | None = None) -> Generation:
        """request: what this request tells the drafters (the document being completed...), handed to every
        propose; None: nothing (RequestContext())."""
        with self.lock:
            return self._generate(list(prompt), config or GenerationConfig(), stop, cancel, request or NO_REQUEST)

    def _generate(self, prompt, config, stop, cancel, request: RequestContext) -> Generation:
        started = time.perf_counter()
        trace = Trace(len(prompt), self.strategy, probabilities=config.trace)
        passes = trace.passes
        sampling = config.sampling
        generator = sampling.generator()
        cancelled = (lambda: cancel.cancelled) if cancel else (lambda: False)
        out: list[int] = []

        def finish(reason: str, text: str | None = None) -> Generation:
            trace.new_tokens, trace.stop_reason = len(out), reason
            trace.text = self.tokenizer.decode(out) if text is None else text
            trace.seconds = time.perf_counter() - started
            return Generation(out, trace.text, reason, GenerationStats.from_trace(trace), trace)

        if config.max_new_tokens <= 0:
            return finish("max_tokens")
        try:
            logits, trace.prefill_reused, trace.prefill_computed = self.target.sync(prompt, cancelled)
            t0 = time.perf_counter()
            if self.drafter is not None:
                trace.draft_prefill_reused, trace.draft_prefill_computed = self.drafter.prefill(prompt, cancelled)
        except Cancelled:
            return finish("cancelled")
        t1 = time.perf_counter()
        trace.prefill_seconds = t1 - started
        empty = TokenTree([], [])
        verdict = verify_tree(empty, logits[None], sampling, generator)
        passes.append(PassRecord(empty.tokens, empty.parents, "", None, verdict.path, verdict.next_token, PLAIN, 0,
                                 t1 - t0, t0 - started, prefill=True, p=[] if config.trace else None,
                                 q=[] if config.trace else None))
        new = [verdict.next_token]
        while True:
            reason, text = self._accept(new, out, config, stop)
            if reason:
                return finish(reason, text)
            if cancelled():
                return finish("cancelled")
            budget = config.max_new_tokens - len(out) - 1  # the pass itself always adds one token
            draft = Draft([])
            t0 = time.perf_counter()
            if self.drafter is not None and budget > 0:
                draft = self.drafter.propose(prompt + out, min(config.max_draft, budget), sampling, generator,
                                             request=request)
            tree = draft.as_tree()
            t1 = time.perf_counter()
            # the root (the last verified token, not yet in the cache) is slot 0; node i is slot i + 1
            target_logits = self.target.extend_tree([out[-1]] + tree.tokens, [ROOT] + [p + 1 for p in tree.parents])
            verdict = verify_tree(tree, target_logits, sampling, generator)
            t2 = time.perf_counter()
            if self._cost_curve is not None:  # every timed pass corrects the planner's curve (learned_cost.py)
                self._cost_curve.observe(1 + len(tree), t2 - t1)
            self.target.keep_path([0] + [node + 1 for node in verdict.path])
            if draft.tokens:
                feedback = {"verdict": verdict} if draft.tree is not None else {}
                self.drafter.observe(draft, verdict.accepted, t1 - t0, t2 - t1, **feedback)
            record = PassRecord(tree.tokens, tree.parents, draft.source if draft.tokens else "", draft.sources,
                                verdict.path, verdict.next_token, next_kind(tree, verdict.bonus), tree.depth,
                                t1 - t0, t2 - t1, plan=None if draft.plan is None else (draft.plan.parents,
                                                                                       draft.plan.ranks))
            if config.trace:
                record.p, record.q = probabilities_of(tree, self._law(target_logits, sampling))
            passes.append(record)
            new = verdict.accepted_tokens + [verdict.next_token]

    @staticmethod
    def _law(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """The target's law for the trace's p: the sampling law, or under greedy (a one-hot law) the plain softmax."""
        return logits.float().softmax(-1) if sampling.greedy else probabilities(logits, sampling)

    def _accept(self, new: list[int], out: list[int], config: GenerationConfig,
                stop: StopPredicate | None) -> tuple[str, str | None]:
        return accept_tokens(new, out, self.stop_token_ids, self.tokenizer, config.max_new_tokens, stop)


def stop_ids(tokenizer, extra: Iterable[int] = ()) -> frozenset[int]:
    """The stop ids a Session takes from these: extra and the tokenizer's EOS."""
    ids = set(extra)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def accept_tokens(new: Iterable[int], out: list[int], stop_token_ids, tokenizer, max_new_tokens: int,
                  stop: StopPredicate | None) -> tuple[str, str | None]:
    """Append verified tokens to out one at a time, checking what plain decoding checks after each.

    A pass can verify several tokens; the stop predicate must still see every
    intermediate text, or a stop token later in the batch would end the call with
    text the predicate would have cut one token earlier (output must not depend on
    how many tokens a pass verified). Returns (reason, cut text): ("", None) to go on.
    The benchmarks apply it to another server's tokens too, so both end a completion alike.
    """
    for token in new:
        if token in stop_token_ids:
            return "eos", None
        out.append(token)
        if stop is not None:
            text = tokenizer.decode(out)
            cut = stop(text)
            if cut is not None:
                return "stop", text[:cut]
        if len(out) >= max_new_tokens:
            return "max_tokens", None
    return "", None


def greedy_reference(model, prompt: list[int], max_new_tokens: int, stop_token_ids: Iterable[int] = ()) -> list[int]:
    """Plain token-by-token greedy decoding with HF's own cache handling, for tests and benchmarks."""
    stops = set(stop_token_ids)
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         num_beams=1, eos_token_id=sorted(stops) or None, pad_token_id=0)[0, len(prompt):].tolist()
    for i, token in enumerate(out):
        if token in stops:
            return out[:i]
    return out
