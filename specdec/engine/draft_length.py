"""Choose the draft length from running acceptance and measured costs.

With per-token acceptance a and k drafts a target pass yields (1 - a^(k+1)) / (1 - a)
tokens and costs k * t_draft + t_verify(k). Picking the k that maximises tokens per
second means a draft that keeps failing shrinks to one token and costs little, and a
draft that keeps succeeding grows up to k_max.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.engine.acceptance import expected_tokens_per_pass
from specdec.engine.limits import MAX_DRAFT  # whatever a caller asks



@dataclass
class DraftLength:
    k_max: int = 8
    k_min: int = 1
    adaptive: bool = True  # False: always k_max
    decay: float = 0.8  # weight of history in the acceptance estimate, per observed token
    acceptance: float = 0.7  # prior, refined after every verification
    draft_cost: float = 0.4  # one draft step in units of a 1-token target pass, refined from timings
    verify_slope: float = 0.04  # extra target cost per verified token (8 tokens ~ 1.3x one)

    def tokens_per_cost(self, k: int) -> float:
        """Expected tokens per target pass divided by the pass's cost (1 = a plain decoding step)."""
        a = min(self.acceptance, 0.99)
        return expected_tokens_per_pass(a, k) / (1 + k * (self.draft_cost + self.verify_slope))

    def next_k(self, cap: int) -> int:
        """The best k in [k_min, min(cap, k_max, MAX_DRAFT)].

        tokens_per_cost is concave over affine in k, so unimodal: the scan stops past the peak.
        """
        hi = max(0, min(cap, self.k_max, MAX_DRAFT))
        if not self.adaptive or hi <= self.k_min:
            return hi
        best, best_value = self.k_min, self.tokens_per_cost(self.k_min)
        for k in range(self.k_min + 1, hi + 1):
            value = self.tokens_per_cost(k)
            if value <= best_value:
                break
            best, best_value = k, value
        return best

    def value(self, cap: int) -> float:
        """What drafting is worth right now, at the best k: comparable across drafters."""
        return self.tokens_per_cost(self.next_k(cap)) if cap > 0 else 0.0

    def forget(self, prior: float, rate: float = 0.02) -> None:
        """Drift back toward the prior while unused, so a drafter that was benched gets retried."""
        self.acceptance += rate * (prior - self.acceptance)

    def observe(self, drafted: int, accepted: int, draft_seconds: float = 0.0, target_pass_seconds: float = 0.0) -> None:
        """Fold in one verification: `accepted` successes, one failure unless all were accepted."""
        if drafted <= 0:
            return
        trials = accepted + (1 if accepted < drafted else 0)
        weight = self.decay**trials
        self.acceptance = weight * self.acceptance + (1 - weight) * (accepted / trials)
        if draft_seconds > 0 and target_pass_seconds > 0:
            one_pass = target_pass_seconds / (1 + drafted * self.verify_slope)
            measured = draft_seconds / drafted / one_pass
            self.draft_cost = 0.7 * self.draft_cost + 0.3 * measured
