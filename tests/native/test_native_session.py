"""On the native target (Qwen2 and Llama), greedy speculative output equals plain greedy output for every
strategy, bit for bit: Session, the drafters, trees and the planner run unchanged on the CachedLM protocol, with
a native draft or a transformers one."""

import pytest
import torch
from native_models import ARCHS, VOCAB, kernels_or_skip, native_model

import tiny
from specdec.engine.cost_curve import CostCurve
from specdec.engine.drafters.repo_index import RepoIndex
from specdec.engine.session import GenerationConfig
from specdec.engine.strategies import STRATEGIES, make_session

# the last one repeats itself, so prompt lookup has n-grams to draft from
PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def",
           "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10):\n"]
MAX_NEW = 20
# a flat verify curve, so the planner drafts trees and chains rather than nothing
CURVE = CostCurve((1, 2, 4, 8, 16, 33), (1.0, 1.02, 1.05, 1.1, 1.2, 1.5))


@pytest.fixture(scope="module", params=ARCHS)
def target(request):
    kernels_or_skip()
    return native_model(seed=0, capacity=256, arch=request.param)


@pytest.fixture(scope="module", params=["native-draft", "shortlist-draft", "transformers-draft"])
def draft(request):
    if request.param == "native-draft":
        return native_model(seed=1, layers=1, capacity=256)
    if request.param == "shortlist-draft":  # scores 3 tiles of 16 ids and its context's (specdec.native.shortlist)
        from specdec.native.shortlist import Shortlist

        model = native_model(seed=1, layers=1, capacity=256)
        model.shortlist = Shortlist(model.model.weights.output, always=[0], tiles=3)
        return model
    return tiny.model(seed=2, layers=1, hidden=32, vocab_size=VOCAB)


def plain_greedy(target, prompt: list[int], n: int, eos: int) -> list[int]:
    """Token by token on a fresh cache, argmax each step: the reference every strategy must reproduce."""
    lm = target.new_cached_lm()
    logits = lm.extend(prompt)[-1]
    out = []
    for _ in range(n):
        token = int(torch.argmax(logits))
        if token == eos:
            break
        out.append(token)
        logits = lm.extend([token])[-1]
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_gives_plain_greedy_output(target, draft, tok, strategy):
    index = RepoIndex()
    expected = {}
    for i, text in enumerate(PROMPTS):
        prompt = tok.encode(text)
        expected[text] = plain_greedy(target, prompt, MAX_NEW, tok.eos_token_id)
        index.add(f"/w/{i}.py", prompt + expected[text][: MAX_NEW // 2])  # the repo drafter gets something right
    session = make_session(target, tok, strategy, draft, max_draft=8, repo_index=index, cost_curve=CURVE)
    drafted = 0
    for text in PROMPTS + PROMPTS[:1]:  # the last one again: served from the session's cache
        out = session.generate(tok.encode(text), GenerationConfig(max_new_tokens=MAX_NEW, max_draft=8))
        assert out.tokens == expected[text], (strategy, text)
        drafted += out.stats.drafted
    if strategy != "plain":
        assert drafted > 0, f"{strategy} never drafted: the test would prove nothing"


@pytest.mark.parametrize("strategy", ["draft", "tree"])
def test_the_drafts_view_of_a_fim_prompt_gives_plain_greedy_output(target, draft, tok, strategy):
    """With the FIM markers the draft reads the prompt's suffix cut short (draft_view.py) in its own cache, native
    or not; output is still the target's, and every sync of the draft's cache is of the view."""
    from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS, suffix_section
    from specdec.prompts import fim

    template = fim.detect(tok)
    markers = fim.markers(tok, template)
    session = make_session(target, tok, strategy, draft, max_draft=8, prompt_markers=markers, cost_curve=CURVE)
    drafter = session.drafter.model if strategy == "tree" else session.drafter
    synced = []
    sync = drafter.kv.sync

    def recorded(context, should_stop=None):
        synced.append(list(context))
        return sync(context, should_stop)

    drafter.kv.sync = recorded
    for prefix in ("class Point:\n    def", "class Point:\n    def _"):  # a keystroke: the second reuses the first
        prompt = fim.build(tok, template, prefix, "\n        return self\n" + PROMPTS[2] * 2).ids
        out = session.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW, max_draft=8))
        assert out.tokens == plain_greedy(target, prompt, MAX_NEW, tok.eos_token_id), (strategy, prefix)
        assert out.stats.drafted > 0
    sections = [suffix_section(context, markers) for context in synced]
    assert sections and all(end - start == DRAFT_SUFFIX_TOKENS for start, end in sections)
