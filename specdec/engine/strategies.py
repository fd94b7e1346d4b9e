"""Strategy names -> drafters. `plain` is no drafter at all; `repo` is the repository index alone; `auto` is the
repository index, then prompt lookup, then the draft model, each where it is worth most; `tree` is the draft
model drafting token trees sized by Sequoia's program for this machine."""

from __future__ import annotations

from specdec.errors import SpecdecError

STRATEGIES = ("plain", "draft", "lookup", "auto", "repo", "tree")  # importable without torch (the settings use it)
DRAFT_MODEL_STRATEGIES = ("draft", "auto", "tree")  # the strategies that load a draft model (auto falls back to lookup)
REPO_INDEX_STRATEGIES = ("repo", "auto")  # the strategies that use a repository index when one is given
COST_CURVE_STRATEGIES = ("tree",)  # the strategies that plan with the target's measured cost curve
TREE_POINTS = (1, 2, 4, 8, 12, 16, 24, 33)  # pass sizes the cost curve is measured at: up to MAX_DRAFT + 1


def needs_cost_curve(strategy: str) -> bool:
    """Whether a strategy's drafter needs the target's cost curve (measured at load, not mid-generation)."""
    return strategy in COST_CURVE_STRATEGIES


def target_cost_curve(target_kv, key: str | None = None):
    """The verify cost of 1..MAX_DRAFT + 1 tokens on this target (cached under key when given).

    Runs real passes on target_kv and leaves its cache empty: call it while nothing generates."""
    from specdec.engine.cost_curve import measure_kv_cost_curve

    return measure_kv_cost_curve(target_kv, key, points=TREE_POINTS)


def needs_draft_model(strategy: str) -> bool:
    """Whether a strategy uses the draft model: the one rule loaders follow before loading one."""
    return strategy in DRAFT_MODEL_STRATEGIES


def uses_repo_index(strategy: str) -> bool:
    """Whether a strategy drafts from a repository index (`repo` needs one; `auto` uses one if given)."""
    return strategy in REPO_INDEX_STRATEGIES


def make_drafter(strategy: str, draft_model=None, adaptive: bool = True, max_draft: int = 8, repo_index=None,
                 prompt_markers=None, cost_curve=None):
    """repo_index: a RepoIndex for `repo` and `auto`; prompt_markers: the FIM format's PromptMarkers, so the index
    matches the text before the cursor (without them it matches the context's raw tail); cost_curve: the
    target's (target_cost_curve), needed by `tree`."""
    from specdec.engine.draft_length import DraftLength
    from specdec.engine.drafters.composite import Composite
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.drafters.prompt_lookup import PromptLookup
    from specdec.engine.drafters.repo import RepoDrafter

    if strategy not in STRATEGIES:
        raise SpecdecError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if strategy == "plain":
        return None
    if strategy in ("draft", "tree") and draft_model is None:
        raise SpecdecError(f"strategy {strategy!r} needs a draft model (--draft)")
    if strategy == "tree":
        from specdec.engine.drafters.draft_tree import DraftTree
        from specdec.engine.tree_plan import TreePlanner

        if cost_curve is None:
            raise SpecdecError("strategy 'tree' needs the target's measured cost curve (strategies.target_cost_curve)")
        planner = TreePlanner(cost_curve, max_nodes=max_draft)
        return DraftTree(draft_model, length=DraftLength(k_max=max_draft, adaptive=adaptive), planner=planner)
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
                 max_draft: int = 8, repo_index=None, prompt_markers=None, cost_curve=None,
                 cost_key: str | None = None):
    """cost_key: where `tree` caches the target's cost curve when none is given (cost_curve.cost_curve_key)."""
    from specdec.engine.session import Session

    session = Session(target, tokenizer, None, stop_token_ids, strategy=strategy)
    if needs_cost_curve(strategy) and cost_curve is None:
        cost_curve = target_cost_curve(session.target, cost_key)
    session.cost_curve = cost_curve
    session.drafter = make_drafter(strategy, draft_model, adaptive, max_draft, repo_index, prompt_markers, cost_curve)
    return session


def repo_drafters(drafter) -> list:
    """The repository drafters in a drafter (itself or a composite's members): the caller tells them which
    document is being completed."""
    from specdec.engine.drafters.repo import RepoDrafter

    members = drafter.members() if hasattr(drafter, "members") else (drafter,)
    return [m for m in members if isinstance(m, RepoDrafter)]
