"""Two drafters behind one: prompt lookup when it has a match and is worth more, else the draft model."""

from __future__ import annotations

from specdec.engine.drafters.base import Draft, Drafter


class Composite:
    """Prompt lookup when it has a match and is currently worth more than the draft model; else the draft model.

    Both members keep a DraftLength (running acceptance, measured cost); their
    expected tokens per unit of cost decide, so a lookup that keeps missing stops
    pre-empting a draft model that keeps hitting, and gets retried as its estimate relaxes.
    """

    def __init__(self, first: Drafter, fallback: Drafter):
        self.first, self.fallback = first, fallback
        self.name = f"{first.name}+{fallback.name}"
        self._prior = first.length.acceptance

    def propose(self, context, k, sampling, generator=None) -> Draft:
        if self.first.length.value(k) >= self.fallback.length.value(k):
            draft = self.first.propose(context, k, sampling, generator)
            if draft.tokens:
                return draft
        else:
            self.first.length.forget(self._prior)
        return self.fallback.propose(context, k, sampling, generator)

    def observe(self, draft, accepted, draft_seconds, target_pass_seconds, **feedback) -> None:
        """feedback: the session's extras for tree drafts (verdict=), passed on to the member as given."""
        member = self.first if draft.source == self.first.name else self.fallback
        member.observe(draft, accepted, draft_seconds, target_pass_seconds, **feedback)

    def prefill(self, context, should_stop) -> tuple[int, int]:
        a, b = self.first.prefill(context, should_stop), self.fallback.prefill(context, should_stop)
        return a[0] + b[0], a[1] + b[1]

    def reset(self) -> None:
        self.first.reset()
        self.fallback.reset()

    def members(self) -> tuple[Drafter, Drafter]:
        return self.first, self.fallback
