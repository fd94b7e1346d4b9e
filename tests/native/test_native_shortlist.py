"""The draft's output layer over a shortlist (specdec.native.shortlist): it scores the first tiles, the always ids'
and its context's tiles exactly as the whole layer does and nothing else; a cache covers its context's ids as
they arrive and starts again when they grow past its bound; a draft is given one only where it pays."""

import pytest
import torch
from native_models import VOCAB, kernels_or_skip, native_model

from specdec.native import lm as native_lm
from specdec.native import shortlist
from specdec.native.shortlist import Shortlist, draft_shortlist

HIDDEN_ROWS = 3


@pytest.fixture(scope="module")
def model():
    kernels_or_skip()
    return native_model(seed=1, layers=1, capacity=256)


def scored(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).all(0).nonzero().flatten().tolist())


def test_the_shortlist_scores_its_ids_as_the_whole_layer_does_and_no_other(model):
    output = model.model.weights.output
    assert output.kernel in ("w4a8", "w8a8")
    head = Shortlist(output, always=[VOCAB - 1], tiles=2).for_context()
    head.cover([100, 101, 200])
    x = torch.randn(HIDDEN_ROWS, output.in_features, generator=torch.Generator().manual_seed(0))
    full, got = output(x), head(x)
    expected = set(range(32)) | set(range(96, 112)) | set(range(192, 208)) | set(range(VOCAB - 16, VOCAB))
    assert scored(got) == expected
    ids = torch.tensor(sorted(expected))
    assert torch.equal(got[:, ids], full[:, ids])
    assert torch.isneginf(got[:, [i for i in range(VOCAB) if i not in expected]]).all()


def test_a_cache_covers_its_context_as_tokens_arrive(model):
    model.shortlist = Shortlist(model.model.weights.output, always=[], tiles=1)
    try:
        lm = model.new_cached_lm()
        logits = lm.extend([3, 250, 5])[-1]
        assert scored(logits[None]) == set(range(16)) | set(range(240, 256))
        logits = lm.extend([70])[-1]
        assert 70 in scored(logits[None]) and 130 not in scored(logits[None])
        lm.reset()  # another context: its ids only
        assert scored(lm.extend([130])[-1][None]) == set(range(16)) | set(range(128, 144))
    finally:
        model.shortlist = None


def test_a_cache_starts_again_from_its_context_when_its_tiles_grow_past_the_bound(model, monkeypatch):
    monkeypatch.setattr(native_lm, "MAX_CONTEXT_TILES", 2)
    model.shortlist = Shortlist(model.model.weights.output, always=[], tiles=1)
    try:
        lm = model.new_cached_lm()
        lm.extend([20, 40])
        lm.truncate(0)
        lm.extend([60])  # tiles 1, 2, 3 were covered: past the bound, so only the context's (tile 3) stay
        assert lm.head.extra_tiles == [3]
    finally:
        model.shortlist = None


def test_a_draft_gets_a_shortlist_only_for_a_big_vocabulary_and_with_the_switch_on(model, monkeypatch):
    class Tok:
        added_tokens_decoder = {VOCAB - 1: "<|endoftext|>"}
        all_special_ids = [VOCAB - 1]

    output = model.model.weights.output
    assert draft_shortlist(output, Tok()) is None  # 384 ids: the whole layer is cheap
    monkeypatch.setattr(shortlist, "MIN_VOCABULARY", VOCAB)
    made = draft_shortlist(output, Tok())
    assert made is not None and made.first.out_features == VOCAB  # 2,048 tiles hold all 24 of this one
    monkeypatch.setenv("SPECDEC_DRAFT_SHORTLIST", "0")
    assert draft_shortlist(output, Tok()) is None


def test_sampled_speculation_with_a_shortlisted_draft_runs_clean(model):
    """Sampling: the draft's q is 0 outside its shortlist, so it never proposes there; every drafted token is one it
    scores, and the run (acceptance rule, residual) produces tokens of the vocabulary."""
    import tiny
    from specdec.engine.sampling import SamplingConfig
    from specdec.engine.session import GenerationConfig
    from specdec.engine.strategies import make_session

    kernels_or_skip()
    target = native_model(seed=0, capacity=256)
    model.shortlist = Shortlist(model.model.weights.output, always=[0], tiles=2)
    try:
        tok = tiny.tokenizer()
        session = make_session(target, tok, "draft", model, max_draft=4)
        config = GenerationConfig(max_new_tokens=24, max_draft=4, sampling=SamplingConfig(temperature=0.8, seed=3))
        out = session.generate(tok.encode("def add(a, b):\n    return"), config)
        assert out.tokens and all(0 <= t < VOCAB for t in out.tokens)
        assert out.stats.drafted > 0
    finally:
        model.shortlist = None
