"""Greedy speculative decoding is token-identical to plain greedy, for every drafter."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.drafters.composite import Composite
from specdec.engine.session import CancelToken, GenerationConfig, Session, greedy_reference
from specdec.engine.drafters.prompt_lookup import PromptLookup
from specdec.engine.strategies import make_session

MAX_NEW = 24


def drafters(target, unrelated, kind, adaptive=True):
    length = lambda: DraftLength(k_max=5, adaptive=adaptive)  # noqa: E731
    return {
        "same": lambda: DraftModel(target, length()),
        "unrelated": lambda: DraftModel(unrelated, length()),
        "lookup": lambda: PromptLookup(length=length()),
        "composite": lambda: Composite(PromptLookup(length=length()), DraftModel(unrelated, length())),
    }[kind]()


def generate(session, prompt, max_new=MAX_NEW, **kw):
    return session.generate(prompt, GenerationConfig(max_new_tokens=max_new, max_draft=5), **kw)


@pytest.fixture(scope="module")
def reference(target, tok):
    cache = {}

    def ref(prompt):
        key = tuple(prompt)
        if key not in cache:
            cache[key] = greedy_reference(target, prompt, MAX_NEW, {tok.eos_token_id})
        return cache[key]

    return ref


def test_plain_equals_hf_generate(target, tok, reference):
    prompt = tok.encode("def add(a, b):\n    return")
    out = generate(Session(target, tok), prompt)
    assert out.tokens == reference(prompt)
    assert out.stats.tokens_per_pass == 1.0


@pytest.mark.parametrize("kind", ["same", "unrelated", "lookup", "composite"])
@pytest.mark.parametrize("adaptive", [True, False])
def test_speculative_greedy_equals_plain(target, unrelated_draft, tok, reference, kind, adaptive):
    session = Session(target, tok, drafters(target, unrelated_draft, kind, adaptive))
    for text in ["def add(a, b):\n    return", "class Point:\n    def", "for i in range(10):\n  "]:
        prompt = tok.encode(text)
        out = generate(session, prompt)
        assert out.tokens == reference(prompt), (kind, text)
        assert out.stats.target_passes <= len(out.tokens) + 1


def test_draft_equal_to_target_accepts_everything(target, tok):
    session = Session(target, tok, DraftModel(target, DraftLength(k_max=4, adaptive=False)))
    out = generate(session, tok.encode("import os\nimport"), max_new=21)
    s = out.stats
    assert s.drafted > 0 and s.accepted == s.drafted
    assert s.tokens_per_pass > 3.5  # 5 tokens per verify pass, one from prefill


def test_unrelated_draft_is_mostly_rejected_and_shrinks(target, unrelated_draft, tok):
    draft = DraftModel(unrelated_draft, DraftLength(k_max=8))
    out = generate(Session(target, tok, draft), tok.encode("fn main() {"), max_new=30)
    assert out.stats.acceptance_rate < 0.3
    assert draft.length.next_k(8) <= 2  # adaptation made the bad draft cheap


def test_draft_length_work_is_bounded_whatever_k_max(monkeypatch):
    """Issue #30 item 3: maxDraft 1e9 made next_k scan range(1e9) inside one decode step."""
    from specdec.engine.limits import MAX_DRAFT

    assert DraftLength(k_max=10**9, adaptive=False).next_k(10**9) == MAX_DRAFT
    calls = []
    original = DraftLength.tokens_per_cost

    def counted(self, k):
        calls.append(k)
        assert len(calls) <= 2 * MAX_DRAFT, "next_k does work in proportion to k_max"
        return original(self, k)

    monkeypatch.setattr(DraftLength, "tokens_per_cost", counted)
    assert 1 <= DraftLength(k_max=10**9, acceptance=0.999, draft_cost=0.0).next_k(10**9) <= MAX_DRAFT
    monkeypatch.setattr(DraftLength, "tokens_per_cost", original)
    for a in (0.0, 0.2, 0.5, 0.8, 0.95, 0.99, 1.0):  # the early stop finds the same k as a full scan
        for cost in (0.0, 0.05, 0.4, 2.0):
            length = DraftLength(k_max=MAX_DRAFT, acceptance=a, draft_cost=cost)
            assert length.next_k(MAX_DRAFT) == max(range(1, MAX_DRAFT + 1), key=length.tokens_per_cost), (a, cost)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(min_value=8, max_value=360), min_size=1, max_size=40),
       kind=st.sampled_from(["same", "unrelated", "lookup", "composite"]),
       reuse=st.booleans())
def test_property_greedy_lossless(target, unrelated_draft, tok, prompt, kind, reuse):
    """Any prompt, any drafter, cold or with the cache of a previous prompt sharing a prefix."""
    expected = greedy_reference(target, prompt, 12, {tok.eos_token_id})
    session = Session(target, tok, drafters(target, unrelated_draft, kind))
    if reuse:
        generate(session, prompt[: max(1, len(prompt) // 2)] + [17, 18], max_new=6)
    out = generate(session, prompt, max_new=12)
    assert out.tokens == expected
    if reuse and len(prompt) >= 4:
        assert out.stats.prefill_reused >= len(prompt) // 2 - 1


def test_prefix_reuse_prefills_only_the_new_suffix(target, unrelated_draft, tok, reference):
    session = make_session(target, tok, "auto", unrelated_draft)
    first = tok.encode("class Point:\n    def __init__(self, x, y):\n        self.x = x\n")
    generate(session, first, max_new=4)
    second = first + tok.encode("        self")
    out = generate(session, second)
    assert out.stats.prefill_reused == len(first)
    assert out.stats.prefill_computed == len(second) - len(first)
    assert out.stats.draft_prefill_computed <= len(second) - len(first) + MAX_NEW
    assert out.tokens == reference(second)


@pytest.mark.parametrize("strategy", ["plain", "draft", "lookup", "auto", "tree"])
def test_stop_tokens_and_predicate_honoured_by_every_strategy(target, unrelated_draft, tok, reference, strategy):
    prompt = tok.encode("def add(a, b):\n    return")
    full = reference(prompt)
    stop_at = full[5]
    first = full.index(stop_at)
    session = make_session(target, tok, strategy, unrelated_draft, stop_token_ids={stop_at})
    out = generate(session, prompt)
    assert out.stop_reason == "eos" and out.tokens == full[:first]

    session = make_session(target, tok, strategy, unrelated_draft)
    cut_text = tok.decode(full[:4])
    out = generate(session, prompt, stop=lambda text: len(cut_text) if len(text) >= len(cut_text) else None)
    assert out.stop_reason == "stop" and out.text == cut_text


@pytest.mark.parametrize("strategy", ["plain", "draft", "lookup", "auto", "tree"])
def test_cancel_returns_within_one_step(target, unrelated_draft, tok, strategy):
    cancel = CancelToken()
    seen, passes = [], []

    def stop(text):  # called after every verified token; cancel from "outside" at the 3rd
        seen.append(text)
        if len(seen) == 3:
            cancel.cancel()
        return None

    session = make_session(target, tok, strategy, unrelated_draft)
    extend, extend_tree = session.target.extend, session.target.extend_tree
    session.target.extend = lambda ids, keep_logits=None: passes.append(cancel.cancelled) or extend(ids, keep_logits)
    session.target.extend_tree = lambda ids, parents: passes.append(cancel.cancelled) or extend_tree(ids, parents)
    out = generate(session, tok.encode("for i in range(10):"), max_new=200, stop=stop, cancel=cancel)
    assert out.stop_reason == "cancelled"
    assert len(passes) >= 2 and True not in passes  # passes were seen (prefill, verify), none after the cancel
    assert out.text == seen[-1]  # what was verified before it is kept


SHAPES = [("python", "def f(x):\n    ", "\n"), ("python", "    y = ", "\nreturn y\n"), ("python", "if x:\n", "    pass\n"),
          ("javascript", "function f() {\n  ", "\n}\n"), ("python", "", "    else:\n")]


@pytest.fixture(scope="module")
def cut_cases(target, tok):
    """(prompt, predicate, index of the token at which plain greedy's real stop predicate cuts)."""
    import random

    from specdec.completion import syntax

    rng, cases = random.Random(0), []
    predicates = [syntax.stop_predicate(syntax.analyze(*shape)) for shape in SHAPES]
    while len(cases) < 12:
        prompt = [rng.randint(8, 360) for _ in range(rng.randint(1, 24))]
        reference = greedy_reference(target, prompt, MAX_NEW)
        for predicate in predicates:
            cut = next((i for i in range(len(reference)) if predicate(tok.decode(reference[: i + 1])) is not None), None)
            if cut is not None and cut + 1 < len(reference):
                cases.append((prompt, predicate, cut, reference))
    return cases


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.integers(min_value=0, max_value=11), kind=st.sampled_from(["same", "unrelated", "lookup", "composite"]),
       budget=st.integers(min_value=1, max_value=MAX_NEW), stop_after_cut=st.integers(min_value=-1, max_value=6))
def test_drafted_output_equals_plain_for_every_stop_rule(target, unrelated_draft, tok, cut_cases, case, kind, budget,
                                                        stop_after_cut):
    """The server's real stop predicate, stop tokens and budgets: a drafter never changes the output,
    even when one verified pass holds both the token the predicate cuts at and a stop token after it."""
    prompt, predicate, cut, reference = cut_cases[case]
    after = cut + stop_after_cut
    stops = {reference[after]} if stop_after_cut >= 0 and after < len(reference) else set()
    config = GenerationConfig(max_new_tokens=budget, max_draft=5)
    plain = Session(target, tok, None, stops).generate(prompt, config, stop=predicate)
    drafted = Session(target, tok, drafters(target, unrelated_draft, kind), stops).generate(prompt, config,
                                                                                          stop=predicate)
    assert (drafted.tokens, drafted.text, drafted.stop_reason) == (plain.tokens, plain.text, plain.stop_reason)


def test_cancel_during_long_prefill(target, tok):
    cancel = CancelToken()
    cancel.cancel()
    out = Session(target, tok).generate(list(range(10, 360)) * 2, GenerationConfig(8), cancel=cancel)
    assert out.stop_reason == "cancelled" and out.tokens == []


def test_max_new_tokens_is_exact_even_mid_draft(target, tok):
    session = Session(target, tok, DraftModel(target, DraftLength(k_max=6, adaptive=False)))
    for n in (1, 2, 5, 7):
        out = session.generate(tok.encode("import os"), GenerationConfig(max_new_tokens=n))
        assert len(out.tokens) == n or out.stop_reason == "eos"


def test_prompt_lookup_proposes_latest_continuation():
    lookup = PromptLookup(max_ngram=2, length=DraftLength(k_max=3, adaptive=False))
    context = [1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 5, 1, 2]
    assert lookup.propose(context, 3).tokens == [3, 7, 8]
    assert lookup.propose([5, 6, 7], 3).tokens == []


def test_adaptive_length_tracks_acceptance():
    length = DraftLength(k_max=8)
    for _ in range(20):
        length.observe(8, 8)
    assert length.next_k(8) >= 6
    for _ in range(20):
        length.observe(length.next_k(8), 0)
    assert length.next_k(8) == 1


def test_per_source_counters_count_each_pass_by_the_drafter_that_drafted_it(target, unrelated_draft, tok):
    """passes_by feeds the per-source stats (issue #34 item 4): one pass per non-empty draft, to its source."""
    drafter = drafters(target, unrelated_draft, "composite")
    proposed = []
    propose = drafter.propose
    drafter.propose = lambda *a, **kw: proposed.append(propose(*a, **kw)) or proposed[-1]
    out = generate(Session(target, tok, drafter), tok.encode("x = 1\ny = 2\nx = 1\ny = 2\nx ="), max_new=20)
    s = out.stats
    drafted = [d for d in proposed if d.tokens]
    assert s.passes_by == {src: sum(d.source == src for d in drafted) for src in {d.source for d in drafted}}
    assert sum(s.passes_by.values()) == len(drafted) <= s.target_passes - 1  # the prefill pass drafts nothing
    assert s.drafted_by == {src: sum(len(d.tokens) for d in drafted if d.source == src) for src in s.passes_by}
    assert sum(s.accepted_by.values()) == s.accepted and set(s.accepted_by) == set(s.passes_by)
    assert "lookup" in s.passes_by
