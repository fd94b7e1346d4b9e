"""Strategy names -> drafters. `plain` is no drafter at all; `auto` is lookup, then the draft model."""

from __future__ import annotations

from specdec.errors import SpecdecError

STRATEGIES = ("plain", "draft", "lookup", "auto")  # importable without torch (the server's settings use it)
DRAFT_MODEL_STRATEGIES = ("draft", "auto")  # the strategies that load a draft model (auto falls back to lookup)


def needs_draft_model(strategy: str) -> bool:
    """Whether a strategy uses the draft model: the one rule loaders follow before loading one."""
    return strategy in DRAFT_MODEL_STRATEGIES


def make_drafter(strategy: str, draft_model=None, adaptive: bool = True, max_draft: int = 8):
    from specdec.engine.draft_length import DraftLength
    from specdec.engine.drafters.draft_model import DraftModel
    from specdec.engine.drafters.composite import Composite
    from specdec.engine.drafters.prompt_lookup import PromptLookup

    if strategy not in STRATEGIES:
        raise SpecdecError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if strategy == "plain":
        return None
    if strategy == "draft" and draft_model is None:
        raise SpecdecError("strategy 'draft' needs a draft model (--draft)")
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
                 max_draft: int = 8):
    from specdec.engine.session import Session

    drafter = make_drafter(strategy, draft_model, adaptive, max_draft)
    return Session(target, tokenizer, drafter, stop_token_ids, strategy=strategy)
