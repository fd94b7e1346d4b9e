"""The exact law of a target's first three sampled tokens, and the chi-square test of drafted sampling against it."""

from scipy.stats import chisquare

from specdec.engine.kv import KVModel
from specdec.engine.sampling import SamplingConfig, probabilities


def three_token_law(target, prompt: list[int], sampling: SamplingConfig) -> dict[tuple[int, int, int], float]:
    """P(x1, x2, x3) under `sampling` (top-k keeps it to a few cells), from fresh full passes."""

    def law_after(context):
        return probabilities(KVModel(target).extend(context)[-1], sampling)

    law = {}
    p1 = law_after(prompt)
    for x1 in p1.nonzero().flatten().tolist():
        p2 = law_after(prompt + [x1])
        for x2 in p2.nonzero().flatten().tolist():
            p3 = law_after(prompt + [x1, x2])
            for x3 in p3.nonzero().flatten().tolist():
                law[x1, x2, x3] = (p1[x1] * p2[x2] * p3[x3]).item()
    return law


def pooled_pvalue(counts: dict, law: dict, n: int) -> float:
    """Chi-square p-value of `n` draws' counts per cell against `law` (unnormalised); cells expecting
    fewer than 5 draws are pooled into one."""
    total = sum(law.values())
    expected = {cell: p / total * n for cell, p in law.items()}
    big = [cell for cell in law if expected[cell] >= 5]
    small = [cell for cell in law if expected[cell] < 5]
    observed = [counts[c] for c in big] + [sum(counts[c] for c in small)]
    wanted = [expected[c] for c in big] + [sum(expected[c] for c in small)]
    wanted[-1] += sum(observed) - sum(wanted)
    return chisquare(observed, wanted).pvalue
