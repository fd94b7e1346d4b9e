"""The stochastic acceptance rule outputs exactly the target distribution (chi-square tests)."""

import pytest
import torch
from scipy.stats import chisquare

from specdec.engine.acceptance import Verdict, expected_tokens_per_pass, verify, verify_probabilities
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.draft_length import DraftLength
from specdec.engine.session import GenerationConfig, Session
from specdec.engine.drafters.prompt_lookup import PromptLookup
from specdec.engine.sampling import SamplingConfig, probabilities

N = 6000


def first_token_counts(p, q, n=N, one_hot=False, seed=0, rule=verify_probabilities):
    """Draw draft x ~ q (or a fixed token for one-hot), run the rule, count the first emitted token."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    for _ in range(n):
        if one_hot:
            x, probs = [int(torch.argmax(q[0]))], None
        else:
            x, probs = [int(torch.multinomial(q[0], 1, generator=gen))], q[:1]
        v = rule(x, probs, p[:2], gen)
        counts[x[0] if v.accepted >= 1 else v.next_token] += 1
    return counts


def assert_matches(counts, p, alpha=0.01):
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    expected = p[support] * counts.sum()
    assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > alpha


CASES = {
    "generic": ([0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]),
    "q zero where p positive": ([0.4, 0.4, 0.2, 0.0], [0.0, 0.5, 0.5, 0.0]),
    "p zero where q positive": ([0.0, 0.7, 0.3, 0.0], [0.4, 0.2, 0.2, 0.2]),
    "equal": ([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_first_token_follows_p(case):
    p_row, q_row = (torch.tensor(r) for r in CASES[case])
    p = torch.stack([p_row, p_row])
    q = torch.stack([q_row])
    assert_matches(first_token_counts(p, q), p_row)


@pytest.mark.parametrize("drafted", [0, 2])
def test_one_hot_draft_follows_p(drafted):
    p_row = torch.tensor([0.1, 0.2, 0.6, 0.1])
    q = torch.nn.functional.one_hot(torch.tensor([drafted]), 4).float()
    counts = first_token_counts(torch.stack([p_row, p_row]), q, one_hot=True)
    assert_matches(counts, p_row)


def test_rule_has_power_against_a_wrong_rule():
    """The same test rejects a rule that keeps every draft: the chi-square check is not vacuous."""
    p_row, q_row = (torch.tensor(r) for r in CASES["generic"])

    def always_accept(x, probs, p, gen):
        return Verdict(len(x), 0)

    counts = first_token_counts(torch.stack([p_row, p_row]), torch.stack([q_row]), rule=always_accept)
    with pytest.raises(AssertionError):
        assert_matches(counts, p_row)


def test_bonus_token_and_later_positions_follow_p():
    """With k drafts all accepted the bonus row is used; check the token emitted at position 2."""
    gen = torch.Generator().manual_seed(3)
    p = torch.tensor([[0.6, 0.4, 0.0], [0.2, 0.3, 0.5], [0.7, 0.1, 0.2]])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.3, 0.3, 0.4]])
    counts, total = torch.zeros(3), 0
    for _ in range(N):
        x = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        v = verify_probabilities(x, q, p, gen)
        emitted = x[: v.accepted] + [v.next_token]
        if len(emitted) >= 2:  # second token exists: given the first, it must follow p[1]
            counts[emitted[1]] += 1
            total += 1
    assert total > N / 2
    assert_matches(counts, p[1])


def test_temperature_and_top_p_applied_to_both():
    logits_p = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]] * 2)
    logits_q = torch.tensor([[0.0, 1.5, 0.2, 0.1, 0.0]])
    config = SamplingConfig(temperature=0.7, top_p=0.9, top_k=4)
    p = probabilities(logits_p, config)
    q = probabilities(logits_q, config)
    assert p[0, 4] == 0 and q[0].sum().item() == pytest.approx(1.0)
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(5)
    for _ in range(N):
        x = [int(torch.multinomial(q[0], 1, generator=gen))]
        v = verify(x, q, logits_p, config, gen)
        counts[x[0] if v.accepted else v.next_token] += 1
    assert_matches(counts, p[0])


def test_greedy_rule():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    assert verify([1, 0], None, logits, SamplingConfig()) == Verdict(2, 2)
    assert verify([1, 2], None, logits, SamplingConfig()) == Verdict(1, 0)
    assert verify([2, 0], None, logits, SamplingConfig()) == Verdict(0, 1)


def test_expected_tokens_formula():
    assert expected_tokens_per_pass(0.0, 5) == 1.0
    assert expected_tokens_per_pass(1.0, 5) == 6.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)


def exact_two_token_distribution(model, prompt, config):
    """The plain sampler's law of the first two tokens, computed from the model."""
    with torch.no_grad():
        p1 = probabilities(model(torch.tensor([prompt])).logits[0, -1], config)
        firsts = torch.nonzero(p1).flatten().tolist()
        batch = torch.tensor([prompt + [t] for t in firsts])
        p2 = probabilities(model(batch).logits[:, -1], config)
    return {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(firsts) for b in torch.nonzero(p2[i]).flatten().tolist()}


@pytest.mark.parametrize("drafter", ["draft", "lookup"])
def test_end_to_end_two_tokens_match_plain_sampling(target, unrelated_draft, tok, drafter):
    config = SamplingConfig(temperature=1.5, top_k=3)
    prompt = list(range(8, len(tok))) + tok.encode("a, b")  # every token occurs: lookup always drafts
    law = exact_two_token_distribution(target, prompt, config)
    if drafter == "lookup":
        lookup = PromptLookup(max_ngram=1, length=DraftLength(k_max=2, adaptive=False))
        make = lambda: lookup  # noqa: E731
    else:
        make = lambda: DraftModel(unrelated_draft, DraftLength(k_max=2, adaptive=False))  # noqa: E731
    session = Session(target, tok, make(), stop_on_eos=False)  # EOS is just another token here: every run yields 3
    counts = dict.fromkeys(law, 0)
    drafted = 0
    n = 1500
    for seed in range(n):
        # 3 new tokens: the first comes from prefill, the second is decided by verifying a draft
        out = session.generate(prompt,
                               GenerationConfig(max_new_tokens=3, max_draft=2,
                                                sampling=SamplingConfig(1.5, 3, 1.0, seed)))
        drafted += out.stats.drafted
        key = tuple(out.tokens[:2])
        assert key in counts, f"{key} has probability 0 under plain sampling"
        counts[key] += 1
    assert drafted > 0
    keys = [k for k in law if law[k] * n >= 5]
    observed = [counts[k] for k in keys] + [n - sum(counts[k] for k in keys)]
    expected = [law[k] * n for k in keys] + [n - sum(law[k] * n for k in keys)]
    assert chisquare(observed, expected).pvalue > 0.01
