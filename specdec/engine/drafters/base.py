"""The one small interface every drafter implements.

A drafter looks at the context (prompt + generated so far) and proposes up to k next
tokens. If it drew them from a distribution q it returns q (one row per token) so the
acceptance rule can correct for it; deterministic drafters return probs=None, which the
rule treats as q = one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.engine.draft_length import DraftLength
from specdec.engine.sampling import SamplingConfig


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
