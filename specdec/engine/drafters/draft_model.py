"""A small causal LM (optionally carrying a peft LoRA adapter) drafting for the target: a CachedLM, or a
transformers module the drafter wraps in KVModel.

It keeps its own KV cache; after a verification the context it is handed shares a
prefix with what it has seen, so `sync` recomputes only the tokens that changed.
With a `view` (draft_view.DraftView) the cache holds the view of the context, not the
context: the draft reads less, the target still verifies against everything.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft
from specdec.engine.cached_lm import as_cached_lm
from specdec.engine.sampling import SamplingConfig, probabilities, sample


class DraftModel:
    name = "draft"

    def __init__(self, model, length: DraftLength | None = None,
                 view: Callable[[list[int]], list[int]] | None = None):
        """view: what the draft reads of a context (None: all of it); pure, and view(c + g) == view(c) + g."""
        self.kv = as_cached_lm(model)
        self.length = length or DraftLength()
        self.view = view

    @property
    def model(self):
        """The module behind the cache (KVModel's transformers module; a native forward's model)."""
        return self.kv.model

    def reset(self) -> None:
        self.kv.reset()

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float) -> None:
        self.length.observe(len(draft.tokens), accepted, draft_seconds, target_pass_seconds)

    def seen(self, context: list[int]) -> list[int]:
        """The tokens the draft's cache holds for this context: every sync goes through here."""
        return self.view(context) if self.view is not None else context

    def prefill(self, context: list[int], should_stop=None) -> tuple[int, int]:
        _, reused, computed = self.kv.sync(self.seen(context), should_stop)
        return reused, computed

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None = None, request=None) -> Draft:
        k = self.length.next_k(k)
        if k <= 0:
            return Draft([], None, self.name)
        logits, _, _ = self.kv.sync(self.seen(context))
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = probabilities(logits, sampling)
                token = int(sample(q, generator))
                rows.append(q)
            tokens.append(token)
            if i < k - 1:
                logits = self.kv.extend([token])[-1]
        return Draft(tokens, torch.stack(rows) if rows else None, self.name)
