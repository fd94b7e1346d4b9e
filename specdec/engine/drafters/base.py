"""The one small interface every drafter implements, and the composite drafter.

A drafter looks at the context (prompt + generated so far) and proposes up to k next
tokens. If it drew them from a distribution q it returns q (one row per token) so the
acceptance rule can correct for it; deterministic drafters return probs=None, which the
rule treats as q = one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.adaptive import DraftLength
from specdec.sampling import SamplingConfig


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), vocab] or None for one-hot proposals
    source: str = ""  # which drafter produced it (the composite reports its member)


class Drafter(Protocol):
    name: str
    length: "DraftLength"  # its draft-length policy: running acceptance and cost

    def propose(self, context: list[int], k: int, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> Draft:
        """Up to k tokens; the drafter's own DraftLength may choose fewer."""

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float) -> None:
        """Feedback after verification, for adaptive draft length."""

    def prefill(self, context: list[int], should_stop) -> tuple[int, int]:
        """Bring any model state up to the prompt (cancellable); returns (reused, computed) tokens."""

    def reset(self) -> None: ...


class Composite:
    """Prompt lookup when it has a match and is currently worth more than the draft model; else the draft model.

    Both members keep a DraftLength (running acceptance, measured cost); their
    expected tokens per unit of cost decide, so a lookup that keeps missing stops
    pre-empting a draft model that keeps hitting, and gets retried as its estimate relaxes.
    """

    def __init__(self, first: Drafter, fallback: Drafter):
        self.first, self.fallback = first, fallback
        self.name = f"{first.name}+{fallback.name}"
        self._prior = first.length.acceptance

    def propose(self, context, k, sampling, generator=None) -> Draft:
        if self.first.length.value(k) >= self.fallback.length.value(k):
            draft = self.first.propose(context, k, sampling, generator)
            if draft.tokens:
                return draft
        else:
            self.first.length.forget(self._prior)
        return self.fallback.propose(context, k, sampling, generator)

    def observe(self, draft, accepted, draft_seconds, target_pass_seconds) -> None:
        member = self.first if draft.source == self.first.name else self.fallback
        member.observe(draft, accepted, draft_seconds, target_pass_seconds)

    def prefill(self, context, should_stop) -> tuple[int, int]:
        a, b = self.first.prefill(context, should_stop), self.fallback.prefill(context, should_stop)
        return a[0] + b[0], a[1] + b[1]

    def reset(self) -> None:
        self.first.reset()
        self.fallback.reset()

    def members(self) -> tuple[Drafter, Drafter]:
        return self.first, self.fallback
