"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the last n-gram.

Code repeats itself (identifiers, call patterns, the suffix of a FIM prompt that the
completion runs into), and a lookup costs microseconds instead of a model step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft


@dataclass
class PromptLookup:
    max_ngram: int = 3
    min_ngram: int = 1
    max_continuation: int = 10
    name: str = "lookup"
    length: DraftLength = field(default_factory=lambda: DraftLength(k_max=10, draft_cost=0.0, acceptance=0.5))

    def propose(self, context: list[int], k: int, sampling=None, generator=None, request=None) -> Draft:
        k = self.length.next_k(min(k, self.max_continuation))
        if k <= 0:
            return Draft([], None, self.name)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            pattern = context[-n:]
            # newest match first: nearby code is the best predictor; the match must end before the pattern itself
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == pattern:
                    continuation = context[start + n : start + n + k]
                    if continuation:
                        return Draft(list(continuation), None, self.name)
        return Draft([], None, self.name)

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float) -> None:
        self.length.observe(len(draft.tokens), accepted)  # drafting is free: no cost to learn

    def prefill(self, context: list[int], should_stop=None) -> tuple[int, int]:
        return 0, 0

    def reset(self) -> None:
        pass
