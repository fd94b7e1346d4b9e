"""The draft model's view of a FIM prompt: the suffix section cut short, everything else as it is; the draft reads
the view wherever it syncs its cache, and output stays the target's."""

import pytest

from specdec.engine.cost_curve import CostCurve
from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.draft_model import DraftModel
from specdec.engine.drafters.draft_tree import DraftTree, TreeLimits
from specdec.engine.kv import KVModel
from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS, DraftView, suffix_section
from specdec.engine.sampling import SamplingConfig
from specdec.engine.session import GenerationConfig, Session, greedy_reference
from specdec.engine.strategies import make_drafter, make_session
from specdec.prompts import fim

MAX_NEW = 16
PREFIX = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self."
SUFFIX = "\n\ndef add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n" * 3
FLAT = CostCurve((1, 64), (1.0, 1.1))  # a GPU-like curve: the planner drafts wide trees


@pytest.fixture(scope="module")
def template(tok):
    return fim.detect(tok)


@pytest.fixture(scope="module")
def markers(tok, template):
    return fim.markers(tok, template)


def prompt_of(tok, template, prefix=PREFIX, suffix=SUFFIX, context=""):
    return fim.build(tok, template, prefix, suffix, path="a.py", context=context).ids


def test_psm_view_cuts_the_suffix_and_keeps_the_rest(tok, template, markers):
    prompt = prompt_of(tok, template, context="<|file_sep|>b.py\nimport os\n")
    generated = tok.encode(" y = y\n")
    s = prompt.index(markers.suffix)
    m = prompt.index(markers.middle)
    assert m - s - 1 > 20  # the suffix section is long enough to be cut
    assert suffix_section(prompt + generated, markers) == (s + 1, m)
    for n in (0, 8, 16):
        view = DraftView(markers, n)(prompt + generated)
        assert view == prompt[: s + 1 + n] + prompt[m:] + generated  # head, prefix, marker kept; middle and G too
        assert tok.decode(view[s + 1 : s + 1 + n]) == tok.decode(prompt[s + 1 : s + 1 + n])
    assert DraftView(markers, None)(prompt) == prompt  # None: the whole suffix
    assert DraftView(markers, m - s - 1)(prompt) == prompt  # a section that fits is kept whole


def test_view_is_the_context_without_the_fim_markers(tok, markers):
    plain = tok.encode("def add(a, b):\n    return a + b\n")
    assert DraftView(markers, 0)(plain) == plain
    half = [markers.prefix] + tok.encode("def f():") + [markers.suffix] + tok.encode("    return 1\n" * 4)
    assert DraftView(markers, 0)(half) == half  # no middle marker: the section has no end, nothing is cut
    assert DraftView(fim.markers(tok, fim.TEMPLATES["codellama"]), 0)(half) == half  # markers not in this vocab


def test_spm_view_cuts_the_suffix_before_the_prefix():
    import tiny

    tok = tiny.tokenizer(extra_specials=("[PREFIX]", "[SUFFIX]"))
    template = fim.detect(tok, "codestral")
    markers = fim.markers(tok, template)
    prompt = fim.build(tok, template, PREFIX, SUFFIX).ids
    s, p = prompt.index(markers.suffix), prompt.index(markers.prefix)
    assert s < p and p - s - 1 > 16
    generated = tok.encode(" y")
    assert DraftView(markers, 4)(prompt + generated) == prompt[: s + 5] + prompt[p:] + generated


def test_view_is_pure_across_generated_tokens_and_keystrokes(tok, template, markers):
    """view(prompt + G) == view(prompt) + G for every G, and two keystrokes' views share what their prompts share
    before the suffix: the draft cache's prefix reuse works on the view."""
    view = DraftView(markers, 8)
    prompt = prompt_of(tok, template)
    generated = tok.encode(" y = y\n        return self\n")
    for i in range(len(generated) + 1):
        assert view(prompt + generated[:i]) == view(prompt) + generated[:i]
    previous = prompt_of(tok, template, PREFIX[:-1])
    shared = next(i for i, (a, b) in enumerate(zip(previous, prompt)) if a != b)
    assert shared < prompt.index(markers.suffix)
    assert view(previous)[:shared] == view(prompt)[:shared] == prompt[:shared]
    assert view(prompt) == view(view(prompt))  # a view is its own view


def test_view_rejects_a_negative_count(markers):
    with pytest.raises(ValueError, match="non-negative"):
        DraftView(markers, -1)


def test_strategies_give_the_draft_model_the_view(target, unrelated_draft, markers):
    drafter = make_drafter("draft", unrelated_draft, prompt_markers=markers)
    assert drafter.view == DraftView(markers, DRAFT_SUFFIX_TOKENS)
    assert make_drafter("draft", unrelated_draft, prompt_markers=markers, draft_suffix_tokens=None).view.suffix_tokens \
        is None
    assert make_drafter("tree", unrelated_draft, prompt_markers=markers, cost_curve=FLAT).model.view == \
        DraftView(markers, DRAFT_SUFFIX_TOKENS)
    auto = make_drafter("auto", unrelated_draft, prompt_markers=markers, cost_curve=FLAT)
    assert [m.view for m in auto.members() if isinstance(m, DraftModel)] == [DraftView(markers, DRAFT_SUFFIX_TOKENS)]
    assert make_drafter("draft", unrelated_draft).view is None  # no FIM format known: the draft reads it all


def test_the_draft_proposes_from_the_view(unrelated_draft, tok, template, markers):
    """A drafter with a view proposes what one without proposes from the viewed context: the view is what it reads."""
    view = DraftView(markers, 4)
    context = prompt_of(tok, template) + tok.encode(" y")
    chain = DraftModel(unrelated_draft, DraftLength(k_max=6, adaptive=False), view)
    alone = DraftModel(unrelated_draft, DraftLength(k_max=6, adaptive=False))
    assert chain.propose(context, 6, SamplingConfig()).tokens == alone.propose(view(context), 6, SamplingConfig()).tokens
    assert chain.kv.tokens[: len(view(context))] == view(context)
    limits = TreeLimits(budget=8, depth=3, branch=2, width=2)
    tree = DraftTree(unrelated_draft, limits, view=view)
    reference = DraftTree(unrelated_draft, limits)
    assert tree.propose(context, 8, SamplingConfig()).tree == reference.propose(view(context), 8, SamplingConfig()).tree
    assert tree.kv.tokens == view(context)


def spy_on_syncs(drafter):
    """Record every context the draft cache syncs to, and how many tokens each sync computed."""
    synced = []
    sync = drafter.kv.sync

    def recorded(context, should_stop=None):
        result = sync(context, should_stop)
        synced.append((list(context), result[2]))
        return result

    drafter.kv.sync = recorded
    return synced


def drafters(target, unrelated_draft, view):
    yield "chain", DraftModel(target, DraftLength(k_max=6, adaptive=False), view)
    yield "chain-unrelated", DraftModel(unrelated_draft, DraftLength(k_max=6, adaptive=False), view)
    yield "tree", DraftTree(target, TreeLimits(budget=8, depth=4, branch=2, width=2), view=view)
    yield "tree-unrelated", DraftTree(unrelated_draft, TreeLimits(budget=8, depth=4, branch=2, width=2), view=view)


class ReadsTheView:
    """A target that reads the view as the draft does: the draft (the same weights) then agrees with it, so long
    branches are accepted and kept in the draft's cache. A random tiny model's argmax moves with any change of its
    context, so against a target that reads everything nothing would be accepted."""

    def __init__(self, model, view):
        self.kv, self.view = KVModel(model), view

    def __getattr__(self, name):
        return getattr(self.kv, name)

    def sync(self, context, should_stop=None):
        return self.kv.sync(self.view(context), should_stop)


@pytest.mark.parametrize("n", [0, 4])
@pytest.mark.parametrize("target_reads", ["all", "view"])
def test_speculative_greedy_with_the_view_is_plain_greedy(target, unrelated_draft, tok, template, markers, n,
                                                          target_reads):
    """Output is the target's whatever the draft reads; and the draft's cache holds the view at every sync, kept in
    step: after the prefill each sync computes only the bonus token and a leaf the draft never ran. A drafter that
    synced the full context anywhere (prefill, propose or the tree's) would recompute the suffix there and fail."""
    view = DraftView(markers, n)
    prompts = [prompt_of(tok, template, PREFIX[:-1]), prompt_of(tok, template),  # two keystrokes, warm
               prompt_of(tok, template, "def add(a, b):\n    return", "\n\nprint(add(1, 2))\n" * 6)]
    read = view if target_reads == "view" else (lambda context: context)
    references = [greedy_reference(target, read(p), MAX_NEW, {tok.eos_token_id}) for p in prompts]
    for name, drafter in drafters(target, unrelated_draft, view):
        session = Session(ReadsTheView(target, read), tok, drafter)
        synced = spy_on_syncs(drafter)
        accepted = 0
        for prompt, expected in zip(prompts, references):
            synced.clear()
            out = session.generate(prompt, GenerationConfig(MAX_NEW, max_draft=6))
            assert out.tokens == expected, (name, tok.decode(prompt))
            accepted += out.stats.accepted
            for context, _ in synced:
                section = suffix_section(context, markers)
                assert section is not None and section[1] - section[0] <= n, name
                assert context[: len(view(prompt))] == view(prompt)
            assert max((computed for _, computed in synced[1:]), default=0) <= 2, (name, [c for _, c in synced])
            assert synced[0][1] < len(view(prompt)) or prompt is prompts[0]  # a later keystroke reuses the cache
        if target_reads == "view" and not name.endswith("unrelated"):
            assert accepted >= len(prompts) * MAX_NEW // 2, name  # the draft's view is the target's: long branches


@pytest.mark.parametrize("strategy", ["draft", "tree", "auto"])
def test_strategies_with_the_view_give_plain_greedy(target, unrelated_draft, tok, template, markers, strategy):
    session = make_session(target, tok, strategy, target, prompt_markers=markers, cost_curve=FLAT, max_draft=6)
    for prompt in (prompt_of(tok, template), prompt_of(tok, template, "for i in", "\n" + SUFFIX)):
        out = session.generate(prompt, GenerationConfig(MAX_NEW, max_draft=6))
        assert out.tokens == greedy_reference(target, prompt, MAX_NEW, {tok.eos_token_id}), strategy
        assert out.trace.draft_prefill_computed <= len(DraftView(markers)(prompt))  # the view was prefilled
