"""The acceptance rule. Every strategy verifies drafts here and nowhere else.

Greedy: accept drafted tokens while each equals the target's argmax; the next token
is the target's argmax at the first mismatch (or the bonus position).

Sampling (Leviathan et al. / Chen et al.): accept drafted x with probability
min(1, p(x)/q(x)); on the first rejection draw from norm(max(0, p - q)); when all k
are accepted draw a bonus token from p. A drafter without probabilities is q = one-hot
at its token. The output is then distributed exactly as p.

Trees (verify_tree) generalise both. Greedy keeps the deepest node whose path is all
argmax. Sampling tries the children of a position in order and descends into the first
one accepted: sampled children follow SpecInfer's multi-step speculative sampling
(Sequoia's variant when drawn without replacement); deterministic children take q
one-hot at each child. A chain is the one-branch tree and
gets the same verdict from either function (tests/test_tree_acceptance.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.engine.sampling import SamplingConfig, probabilities, sample
from specdec.engine.tree import DETERMINISTIC, ROOT, WITHOUT_REPLACEMENT, Drawn, TokenTree


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


@dataclass
class TreeVerdict:
    """The accepted path, and the target's own next token: recovered (drawn from the
    residual after the last node's children were all rejected) or bonus (drawn from p
    after a leaf was accepted)."""

    path: list[int]  # accepted node indices, root's child first
    accepted_tokens: list[int]  # their tokens
    next_token: int
    bonus: bool  # True: next_token follows an accepted leaf; False: it is recovered

    @property
    def accepted(self) -> int:
        return len(self.path)

    def verdict(self) -> Verdict:
        """The chain view: how many tokens were kept and the token after them."""
        return Verdict(len(self.path), self.next_token)


def verify_tree(
    tree: TokenTree,
    target_logits: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
) -> TreeVerdict:
    """target_logits: [len(tree) + 1, vocab], one row per position: row 0 predicts the token
    after the root (the last verified token), row i + 1 the token after node i (its path)."""
    n = len(tree)
    assert target_logits.shape[0] == n + 1, (target_logits.shape, n)
    if config.greedy:
        # a node is on the greedy path when its token is the argmax after its parent and its
        # parent is too; take the deepest such node, so a duplicate sibling (drafts sampled with
        # replacement) whose subtree goes further is not shadowed by the first one
        choices = target_logits.argmax(-1).tolist()
        on_path = [False] * n
        best, best_depth = ROOT, 0
        for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):
            if token == choices[parent + 1] and (parent == ROOT or on_path[parent]):
                on_path[i] = True
                if tree.depths[i] > best_depth:
                    best, best_depth = i, tree.depths[i]
        path = tree.path(best)
        return TreeVerdict(path, [tree.tokens[i] for i in path], choices[best + 1], not tree.children(best))
    return verify_tree_probabilities(tree, probabilities(target_logits, config), generator)


def verify_tree_probabilities(
    tree: TokenTree,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> TreeVerdict:
    """The stochastic tree rule on already-processed distributions (rows: len(tree) + 1).

    Each node is tried at most once, so one uniform per node is drawn up front; on a
    chain this consumes the generator exactly as verify_probabilities does.
    """
    n = len(tree)
    vocab = target_probs.shape[-1]
    q_all = None if tree.child_probs is None else _match_vocab(tree.child_probs.float(), vocab)
    u = torch.rand(n, generator=generator, device="cpu").to(target_probs.device)
    path, node = [], ROOT
    while True:
        position = node + 1
        p = target_probs[position]
        children = tree.children(node)
        if not children:
            return TreeVerdict(path, [tree.tokens[i] for i in path], int(sample(p, generator)), True)
        drawn = tree.drawn[position]
        q = None if drawn == DETERMINISTIC else q_all[position]
        for child in children:
            x = tree.tokens[child]
            # u < p/q  <=>  u * q < p  (no division by zero where q(x) = 0); deterministic: q(x) = 1
            if (u[child] < p[x]) if q is None else (u[child] * q[x] < p[x]):
                path.append(child)
                node = child
                break
            p, q = _reject(p, q, x, drawn)
        else:
            return TreeVerdict(path, [tree.tokens[i] for i in path], int(sample(p, generator)), False)


def _reject(p: torch.Tensor, q: torch.Tensor | None, x: int, drawn: Drawn) -> tuple[torch.Tensor, torch.Tensor | None]:
    """After child x is rejected: the law the remaining children (then the recovered token) must correct to.

    Sampled: p <- norm(max(0, p - q)) (Leviathan's residual, SpecInfer's next round).
    Without replacement the next sibling was drawn from q with x removed, so q(x) <- 0,
    renormalised (Sequoia). Deterministic: q is one-hot at x, so the residual is p with
    p(x) <- 0, renormalised.
    """
    if q is None:
        residual = p.clone()
        residual[x] = 0
    else:
        residual = (p - q).clamp_min(0)
    total = residual.sum()
    if total <= 0:  # p == q up to rounding: the rejection had ~zero probability; p is the right law
        residual, total = p, 1.0
    p = residual / total
    if drawn == WITHOUT_REPLACEMENT:
        q = q.clone()
        q[x] = 0
        q = q / q.sum().clamp_min(1e-30)
    return p, q


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
