"""Strategies and the N-member composite: `repo` is the index alone, `auto` ranks index, lookup and draft model."""

from dataclasses import dataclass, field

import pytest

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft, RequestContext
from specdec.engine.drafters.composite import Composite
from specdec.engine.drafters.prompt_lookup import PromptLookup
from specdec.engine.drafters.repo import RepoDrafter
from specdec.engine.drafters.repo_index import RepoIndex
from specdec.engine.session import GenerationConfig, greedy_reference
from specdec.engine.strategies import STRATEGIES, make_drafter, make_session, needs_draft_model, repo_drafters
from specdec.errors import SpecdecError


@dataclass
class Fixed:
    """A drafter that proposes `tokens` (or nothing) with a set acceptance estimate."""

    name: str
    tokens: list[int]
    acceptance: float
    asked: int = 0
    observed: int = 0
    length: DraftLength = field(init=False)

    def __post_init__(self):
        self.length = DraftLength(k_max=4, draft_cost=0.0, acceptance=self.acceptance)

    def propose(self, context, k, sampling=None, generator=None, request=None):
        self.asked += 1
        return Draft(list(self.tokens[:k]), None, self.name)

    def observe(self, draft, accepted, draft_seconds, target_pass_seconds):
        self.observed += 1

    def prefill(self, context, should_stop=None):
        return 1, 2

    def reset(self):
        pass


def test_repo_is_a_strategy_that_needs_an_index_not_a_draft_model():
    assert "repo" in STRATEGIES and not needs_draft_model("repo") and needs_draft_model("auto")
    with pytest.raises(SpecdecError, match="repository index"):
        make_drafter("repo")
    drafter = make_drafter("repo", repo_index=RepoIndex(), max_draft=5)
    assert isinstance(drafter, RepoDrafter) and drafter.length.k_max == 5 and repo_drafters(drafter) == [drafter]


def test_auto_puts_the_index_before_lookup_and_the_draft_model(unrelated_draft):
    index = RepoIndex()
    assert make_drafter("auto", unrelated_draft, repo_index=index).name == "repo+lookup+draft"
    assert make_drafter("auto", None, repo_index=index).name == "repo+lookup"
    assert make_drafter("auto", unrelated_draft).name == "lookup+draft"  # no index: as before
    assert isinstance(make_drafter("auto"), PromptLookup)
    (repo,) = repo_drafters(make_drafter("auto", unrelated_draft, repo_index=index))
    assert repo.index is index and repo.min_match == 4


def test_the_member_worth_most_that_has_a_draft_proposes():
    index_, lookup, model = Fixed("repo", [], 0.9), Fixed("lookup", [7, 8], 0.6), Fixed("draft", [1, 2, 3], 0.3)
    composite = Composite(index_, lookup, model)
    draft = composite.propose([0], 4, None)
    assert draft.source == "lookup" and draft.tokens == [7, 8] and index_.asked == 1 and model.asked == 0
    composite.observe(draft, 1, 0.0, 0.0)
    assert lookup.observed == 1 and model.observed == 0
    assert composite.prefill([0], None) == (3, 6)

    lookup.length.acceptance = 0.1  # the lookup keeps missing: the draft model now outranks it
    before = lookup.length.acceptance
    draft = composite.propose([0], 4, None)
    assert draft.source == "draft" and lookup.asked == 1  # not asked: it ranks below the model
    assert lookup.length.acceptance > before  # and drifts back toward its prior, to be retried


def test_two_members_keep_the_original_rule():
    first, fallback = Fixed("lookup", [5], 0.9), Fixed("draft", [1], 0.5)
    composite = Composite(first, fallback)
    assert composite.members() == (first, fallback) and composite.name == "lookup+draft"
    assert composite.propose([0], 4, None).source == "lookup"
    first.tokens = []
    assert composite.propose([0], 4, None).source == "draft"  # no match: the fallback
    first.tokens, first.length.acceptance = [5], 0.1
    fallback_before = fallback.length.acceptance
    assert composite.propose([0], 4, None).source == "draft" and first.length.acceptance > 0.1
    first.length.acceptance = 0.95
    assert composite.propose([0], 4, None).source == "lookup" and fallback.length.acceptance == fallback_before


@pytest.mark.parametrize("strategy", ["repo", "auto"])
def test_repo_drafts_are_verified_like_any_other(target, unrelated_draft, tok, strategy):
    """The index holds the target's own continuation: it is drafted, accepted, and the output is plain greedy's."""
    prompt = tok.encode("class Point:\n    def")
    expected = greedy_reference(target, prompt, 20, {tok.eos_token_id})
    index = RepoIndex()
    index.add("/w/point.py", prompt + expected)
    session = make_session(target, tok, strategy, unrelated_draft, repo_index=index, max_draft=6)
    out = session.generate(prompt, GenerationConfig(max_new_tokens=20, max_draft=6))
    assert out.tokens == expected
    assert out.stats.drafted_by.get("repo", 0) > 0 and out.stats.accepted_by["repo"] >= len(expected) // 2
    assert out.stats.target_passes < len(expected)
    assert len(repo_drafters(session.drafter)) == 1
    this = RequestContext(document="/w/point.py")  # completing that very file: its own text is not a prediction
    session.reset()
    out = session.generate(prompt, GenerationConfig(max_new_tokens=20, max_draft=6), request=this)
    assert out.tokens == expected and "repo" not in out.stats.drafted_by
