"""Strategy names -> drafters. `plain` is no drafter at all; `repo` is the repository index alone; `auto` is the
repository index, then prompt lookup, then the draft model, each where it is worth most."""

from __future__ import annotations

from specdec.errors import SpecdecError

STRATEGIES = ("plain", "draft", "lookup", "auto", "repo")  # importable without torch (the server's settings use it)
DRAFT_MODEL_STRATEGIES = ("draft", "auto")  # the strategies that load a draft model (auto falls back to lookup)
REPO_INDEX_STRATEGIES = ("repo", "auto")  # the strategies that use a repository index when one is given


def needs_draft_model(strategy: str) -> bool:
    """Whether a strategy uses the draft model: the one rule loaders follow before loading one."""
    return strategy in DRAFT_MODEL_STRATEGIES


def uses_repo_index(strategy: str) -> bool:
    """Whether a strategy drafts from a repository index (`repo` needs one; `auto` uses one if given)."""
    return strategy in REPO_INDEX_STRATEGIES


def make_drafter(strategy: str, draft_model=None, adaptive: bool = True, max_draft: int = 8, repo_index=None,
                 prompt_markers=None):
    """repo_index: a RepoIndex for `repo` and `auto`; prompt_markers: the FIM format's PromptMarkers, so the index
    matches the text before the cursor (without them it matches the context's raw tail)."""
    from specdec.engine.draft_length import DraftLength
    from specdec.engine.drafters.composite import Composite
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.drafters.prompt_lookup import PromptLookup
    from specdec.engine.drafters.repo import RepoDrafter

    if strategy not in STRATEGIES:
        raise SpecdecError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if strategy == "plain":
        return None
    if strategy == "draft" and draft_model is None:
        raise SpecdecError("strategy 'draft' needs a draft model (--draft)")
    if strategy == "repo":
        if repo_index is None:
            raise SpecdecError("strategy 'repo' needs a repository index (the server's repoIndex setting)")
        return RepoDrafter(repo_index, markers=prompt_markers,
                           length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.5, adaptive=adaptive))
    if strategy == "lookup" or (draft_model is None and repo_index is None):  # auto without either: lookup alone
        return PromptLookup(length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.5, adaptive=adaptive))
    if strategy == "draft":
        return DraftModel(draft_model, DraftLength(k_max=max_draft, adaptive=adaptive))
    # auto. In front of a draft model, lookups speak only on a real repeat: a 1-2 token match is mostly noise.
    members = []
    if repo_index is not None:
        members.append(RepoDrafter(repo_index, min_match=4, markers=prompt_markers, length=DraftLength(
            k_max=max_draft, draft_cost=0.0, acceptance=0.6, adaptive=adaptive)))
    if draft_model is None:
        members.append(PromptLookup(length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.5,
                                                       adaptive=adaptive)))
    else:
        members.append(PromptLookup(max_ngram=4, min_ngram=3, length=DraftLength(
            k_max=max_draft, draft_cost=0.0, acceptance=0.6, adaptive=adaptive)))
        members.append(DraftModel(draft_model, DraftLength(k_max=max_draft, adaptive=adaptive)))
    return Composite(*members)


def make_session(target, tokenizer, strategy: str, draft_model=None, stop_token_ids=(), adaptive: bool = True,
                 max_draft: int = 8, repo_index=None, prompt_markers=None):
    from specdec.engine.session import Session

    drafter = make_drafter(strategy, draft_model, adaptive, max_draft, repo_index, prompt_markers)
    return Session(target, tokenizer, drafter, stop_token_ids, strategy=strategy)


def repo_drafters(drafter) -> list:
    """The repository drafters in a drafter (itself or a composite's members): the caller tells them which
    document is being completed."""
    from specdec.engine.drafters.repo import RepoDrafter

    members = drafter.members() if hasattr(drafter, "members") else (drafter,)
    return [m for m in members if isinstance(m, RepoDrafter)]
