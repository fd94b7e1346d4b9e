"""Strategy names -> drafters. `plain` is no drafter at all; `repo` is the repository index alone; `auto` is the
repository index, then prompt lookup, then the draft model, each where it is worth most, the draft model drafting
a chain or a tree (or nothing) as Sequoia's program finds faster on this machine; `tree` merges the draft model's
tree with prompt lookup's and the repository index's continuations into one tree per step, sized by that
program."""

from __future__ import annotations

from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS
from specdec.errors import SpecdecError

STRATEGIES = ("plain", "draft", "lookup", "auto", "repo", "tree")  # importable without torch (the settings use it)
DRAFT_MODEL_STRATEGIES = ("draft", "auto", "tree")  # the strategies that load a draft model (auto falls back to lookup)
REPO_INDEX_STRATEGIES = ("repo", "auto", "tree")  # the strategies that use a repository index when one is given
COST_CURVE_STRATEGIES = ("tree", "auto")  # the strategies that plan with the target's measured cost curve
TREE_POINTS = (1, 2, 4, 8, 12, 16, 24, 33)  # pass sizes the cost curve is measured at: up to MAX_DRAFT + 1
# `specdec next-edit`'s: `edit` is the current window copied at the aligned position (drafters/edit_window.py) in
# front of the draft model (prompt lookup without one); there `auto` puts the window copy in front of its members
NEXT_EDIT_STRATEGIES = tuple(s for s in STRATEGIES if s != "repo") + ("edit",)  # no repository index there yet
EDIT_WINDOW_STRATEGIES = ("edit", "auto")  # the next-edit strategies with the window copy first


def needs_cost_curve(strategy: str, draft_model: bool = True) -> bool:
    """Whether a strategy's drafter needs the target's cost curve (measured at load, not mid-generation).

    draft_model: whether a draft model is loaded; `auto` plans only its draft model's drafts, so
    without one it needs no curve."""
    return strategy in COST_CURVE_STRATEGIES and (draft_model or strategy != "auto")


def target_cost_curve(target_kv, key: str | None = None, path=None):
    """The verify cost of 1..MAX_DRAFT + 1 tokens on this target (cached under key when given), as a
    LearnedCostCurve: the session's verify passes correct it from then on, and write it back under key.

    Runs real passes on target_kv and leaves its cache empty: call it while nothing generates."""
    from specdec.engine.cost_curve import load_cost_curve, measure_kv_cost_curve
    from specdec.engine.learned_cost import LearnedCostCurve

    def measure():
        return measure_kv_cost_curve(target_kv, None, points=TREE_POINTS)

    if key is None:
        return LearnedCostCurve(measure(), "measured")
    curve, source = load_cost_curve(key, measure, path=path)
    return LearnedCostCurve(curve, source, key=key, path=path)


def needs_draft_model(strategy: str) -> bool:
    """Whether a strategy uses the draft model: the one rule loaders follow before loading one."""
    return strategy in DRAFT_MODEL_STRATEGIES


def next_edit_base(strategy: str, draft_model: bool = True) -> str:
    """The strategy whose drafter a next-edit session builds (make_session) before `with_edit_window` puts the
    window copy in front of it (EDIT_WINDOW_STRATEGIES): `edit`'s is the draft model's, or prompt lookup's."""
    if strategy == "edit":
        return "draft" if draft_model else "lookup"
    return strategy


def uses_repo_index(strategy: str) -> bool:
    """Whether a strategy drafts from a repository index (`repo` needs one; `auto` and `tree` use one if given)."""
    return strategy in REPO_INDEX_STRATEGIES


def make_drafter(strategy: str, draft_model=None, adaptive: bool = True, max_draft: int = 8, repo_index=None,
                 prompt_markers=None, cost_curve=None, draft_suffix_tokens: int | None = DRAFT_SUFFIX_TOKENS):
    """repo_index: a RepoIndex for `repo`, `auto` and `tree`; prompt_markers: the FIM format's PromptMarkers, so the
    index matches the text before the cursor (without them it matches the context's raw tail) and the draft model
    reads the prompt's suffix section cut to its first draft_suffix_tokens tokens (draft_view.py; None: all of
    it); cost_curve: the target's (target_cost_curve), needed by `tree`; with it `auto`'s draft model plans its
    drafts (without it, or where the draft's attention takes no tree mask, it drafts chains)."""
    from specdec.engine.draft_length import DraftLength
    from specdec.engine.drafters.composite import Composite
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.drafters.draft_view import DraftView
    from specdec.engine.drafters.prompt_lookup import PromptLookup
    from specdec.engine.drafters.repo import RepoDrafter

    if strategy not in STRATEGIES:
        raise SpecdecError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if strategy == "plain":
        return None
    if strategy in ("draft", "tree") and draft_model is None:
        raise SpecdecError(f"strategy {strategy!r} needs a draft model (--draft)")
    view = DraftView(prompt_markers, draft_suffix_tokens) if prompt_markers is not None else None
    if strategy == "tree":
        from specdec.engine.drafters.draft_tree import DraftTree
        from specdec.engine.drafters.lookup_tree import LookupTree
        from specdec.engine.drafters.union_tree import UnionTree
        from specdec.engine.tree_plan import TreePlanner

        if cost_curve is None:
            raise SpecdecError("strategy 'tree' needs the target's measured cost curve (strategies.target_cost_curve)")
        model = DraftTree(draft_model, length=DraftLength(k_max=max_draft, adaptive=adaptive), view=view)
        # as in auto: beside a draft model, a lookup speaks only on a real repeat (it spends the tree's budget)
        repo = None if repo_index is None else RepoDrafter(repo_index, min_match=4, markers=prompt_markers)
        return UnionTree(model, TreePlanner(cost_curve, max_nodes=max_draft), LookupTree(max_ngram=4, min_ngram=3),
                         repo)
    if strategy == "repo":
        if repo_index is None:
            raise SpecdecError("strategy 'repo' needs a repository index (the server's repoIndex setting)")
        return RepoDrafter(repo_index, markers=prompt_markers,
                           length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.5, adaptive=adaptive))
    if strategy == "lookup" or (draft_model is None and repo_index is None):  # auto without either: lookup alone
        return PromptLookup(length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.5, adaptive=adaptive))
    if strategy == "draft":
        return DraftModel(draft_model, DraftLength(k_max=max_draft, adaptive=adaptive), view)
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
        members.append(_planned_draft(draft_model, DraftLength(k_max=max_draft, adaptive=adaptive), max_draft,
                                      cost_curve, view))
    return Composite(*members)


def _planned_draft(draft_model, length, max_draft: int, cost_curve, view=None):
    """auto's draft-model member: with the target's cost curve, a DraftTree whose planner (Sequoia's program)
    picks a chain where trees do not pay, a tree where they do, nothing where drafting does not; without one,
    or where the draft's attention takes no tree mask, the chain drafter."""
    from specdec.engine.cached_lm import as_cached_lm
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.drafters.draft_tree import DraftTree
    from specdec.engine.tree_plan import TreePlanner

    draft_model = as_cached_lm(draft_model)  # one cache: the check's wrapper is the drafter's
    if cost_curve is not None:
        try:
            draft_model.check_tree_attention()
        except SpecdecError:
            pass
        else:
            member = DraftTree(draft_model, length=length, planner=TreePlanner(cost_curve, max_nodes=max_draft),
                               view=view)
            member.name = DraftModel.name  # chain or tree, the draft model's drafts: one source in the statistics
            return member
    return DraftModel(draft_model, length, view)


def make_session(target, tokenizer, strategy: str, draft_model=None, stop_token_ids=(), adaptive: bool = True,
                 max_draft: int = 8, repo_index=None, prompt_markers=None, cost_curve=None,
                 cost_key: str | None = None):
    """The one builder of a strategy's Session, its configuration given once (a Session is never re-targeted:
    `Session.derive` makes another over the same target and cache). cost_key: where `tree` (and `auto` with a
    draft model) caches the target's cost curve when none is given (cost_curve.cost_curve_key); that curve is
    then learnt from the session's verify passes. A plain CostCurve given is held fixed (tests, a known
    machine)."""
    from specdec.engine.cached_lm import as_cached_lm
    from specdec.engine.learned_cost import LearnedCostCurve
    from specdec.engine.session import Session

    target = as_cached_lm(target)  # the session's own: the cost curve is measured on it, its cache then empty
    if needs_cost_curve(strategy, draft_model is not None) and cost_curve is None:
        cost_curve = target_cost_curve(target, cost_key)
    elif cost_curve is not None and not isinstance(cost_curve, LearnedCostCurve):
        cost_curve = LearnedCostCurve(cost_curve, "given", learn=False)  # the caller's machine, held as given
    drafter = make_drafter(strategy, draft_model, adaptive, max_draft, repo_index, prompt_markers, cost_curve)
    return Session(target, tokenizer, drafter, stop_token_ids, strategy=strategy, cost_curve=cost_curve)


def repo_drafters(drafter) -> list:
    """The repository drafters in a drafter (itself or a composite's members); what they read of a request comes
    with each proposal (drafters.base.RequestContext)."""
    from specdec.engine.drafters.repo import RepoDrafter

    members = drafter.members() if hasattr(drafter, "members") else (drafter,)
    return [m for m in members if isinstance(m, RepoDrafter)]
