"""The exact law of a target's first three sampled tokens, for chi-square tests of drafted sampling."""

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
