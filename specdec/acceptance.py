"""The acceptance rule. Every strategy verifies drafts here and nowhere else.

Greedy: accept drafted tokens while each equals the target's argmax; the next token
is the target's argmax at the first mismatch (or the bonus position).

Sampling (Leviathan et al. / Chen et al.): accept drafted x with probability
min(1, p(x)/q(x)); on the first rejection draw from norm(max(0, p - q)); when all k
are accepted draw a bonus token from p. A drafter without probabilities is q = one-hot
at its token. The output is then distributed exactly as p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.sampling import SamplingConfig, probabilities, sample


@dataclass
class Verdict:
    accepted: int  # how many drafted tokens were kept
    next_token: int  # the target's own token after them (correction or bonus)


def verify(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
) -> Verdict:
    """target_logits has len(draft_tokens) + 1 rows: row i predicts the token after drafts[:i]."""
    k = len(draft_tokens)
    assert target_logits.shape[0] == k + 1, (target_logits.shape, k)
    if config.greedy:
        choices = target_logits.argmax(-1).tolist()
        accepted = 0
        while accepted < k and draft_tokens[accepted] == choices[accepted]:
            accepted += 1
        return Verdict(accepted, choices[accepted])
    return verify_probabilities(draft_tokens, draft_probs, probabilities(target_logits, config), generator)


def verify_probabilities(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """The stochastic rule on already-processed distributions (rows of target_probs: k + 1)."""
    k = len(draft_tokens)
    vocab = target_probs.shape[-1]
    drafted = torch.tensor(draft_tokens, dtype=torch.long, device=target_probs.device)
    if draft_probs is None:
        q = torch.nn.functional.one_hot(drafted, vocab).float()
    else:
        q = _match_vocab(draft_probs.float(), vocab)
    rows = torch.arange(k, device=target_probs.device)
    p_x = target_probs[rows, drafted]
    q_x = q[rows, drafted]
    u = torch.rand(k, generator=generator, device="cpu").to(target_probs.device)
    # u < p/q  <=>  u * q < p  (no division by zero where q(x) = 0)
    ok = (u * q_x < p_x).tolist()
    accepted = next((i for i, good in enumerate(ok) if not good), k)
    if accepted == k:
        return Verdict(k, int(sample(target_probs[k], generator)))
    residual = (target_probs[accepted] - q[accepted]).clamp_min(0)
    total = residual.sum()
    if total <= 0:  # p == q up to rounding: the rejection had ~zero probability; p is the right law
        residual, total = target_probs[accepted], 1.0
    return Verdict(accepted, int(sample(residual / total, generator)))


def _match_vocab(q: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft and target heads may be padded to different sizes; real tokens share ids."""
    if q.shape[-1] == vocab:
        return q
    if q.shape[-1] > vocab:
        q = q[..., :vocab]
        return q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))


def expected_tokens_per_pass(acceptance: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens one target pass yields with k drafts accepted i.i.d. at rate a."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)
