"""Strategy names -> drafters. `plain` is no drafter at all; `auto` is lookup, then the draft model;
`tree` is the draft model drafting token trees sized by Sequoia's program for this machine."""

from __future__ import annotations

from specdec.errors import SpecdecError

STRATEGIES = ("plain", "draft", "lookup", "auto", "tree")  # importable without torch (the server's settings use it)
DRAFT_MODEL_STRATEGIES = ("draft", "auto", "tree")  # the strategies that load a draft model (auto falls back to lookup)
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


def make_drafter(strategy: str, draft_model=None, adaptive: bool = True, max_draft: int = 8, cost_curve=None):
    """cost_curve: the target's (target_cost_curve), needed by `tree`."""
    from specdec.engine.draft_length import DraftLength
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.drafters.composite import Composite
    from specdec.engine.drafters.prompt_lookup import PromptLookup

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
    if strategy == "lookup" or draft_model is None:  # auto without a draft model is lookup alone
        return PromptLookup(length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.5, adaptive=adaptive))
    model = DraftModel(draft_model, DraftLength(k_max=max_draft, adaptive=adaptive))
    if strategy == "draft":
        return model
    # In front of a draft model, lookup speaks only on a real repeat: a 1-2 token match is mostly noise.
    confident = PromptLookup(max_ngram=4, min_ngram=3,
                             length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.6, adaptive=adaptive))
    return Composite(confident, model)


def make_session(target, tokenizer, strategy: str, draft_model=None, stop_token_ids=(), adaptive: bool = True,
                 max_draft: int = 8, cost_curve=None, cost_key: str | None = None):
    """cost_key: where `tree` caches the target's cost curve when none is given (cost_curve.cost_curve_key)."""
    from specdec.engine.session import Session

    session = Session(target, tokenizer, None, stop_token_ids, strategy=strategy)
    if needs_cost_curve(strategy) and cost_curve is None:
        cost_curve = target_cost_curve(session.target, cost_key)
    session.cost_curve = cost_curve
    session.drafter = make_drafter(strategy, draft_model, adaptive, max_draft, cost_curve)
    return session
