"""Several drafters behind one: at each position, the one currently worth most that has something to propose."""

from __future__ import annotations

from specdec.engine.drafters.base import Draft, Drafter


class Composite:
    """Members in priority order (say repository index, prompt lookup, draft model); the last always drafts.

    Every member keeps a DraftLength (running acceptance, measured cost); their expected
    tokens per unit of cost rank them at each position, ties going to the earlier member.
    The best-ranked member that has a draft proposes, so a lookup without a match costs
    nothing and a lookup that keeps missing stops pre-empting a draft model that keeps
    hitting. A member that comes earlier in priority but was not asked, for its value, drifts
    back toward its prior, so it gets retried (a later one is asked whenever the earlier ones
    have nothing, and learns then). With two members this is the original rule: the first
    when it has a match and is worth at least the fallback, else the fallback.
    """

    def __init__(self, *members: Drafter):
        if len(members) < 2:
            raise ValueError("a composite needs at least two drafters")
        self._members = members
        self.first, self.fallback = members[0], members[-1]
        self.name = "+".join(m.name for m in members)
        self._priors = [m.length.acceptance for m in members]

    def propose(self, context, k, sampling, generator=None, request=None) -> Draft:
        """request: the request's context, handed to the member asked."""
        values = [m.length.value(k) for m in self._members]
        ranked = sorted(range(len(self._members)), key=lambda i: -values[i])  # stable: ties keep member order
        draft = Draft([], None, self._members[ranked[-1]].name)
        for place, i in enumerate(ranked):
            draft = self._members[i].propose(context, k, sampling, generator, request=request)
            if draft.tokens:
                for j in ranked[place + 1 :]:
                    if j < i:
                        self._members[j].length.forget(self._priors[j])
                return draft
        return draft

    def observe(self, draft, accepted, draft_seconds, target_pass_seconds, **feedback) -> None:
        """feedback: the session's extras for tree drafts (verdict=), passed on to the member as given."""
        member = next((m for m in self._members if m.name == draft.source), self.fallback)
        member.observe(draft, accepted, draft_seconds, target_pass_seconds, **feedback)

    def prefill(self, context, should_stop) -> tuple[int, int]:
        reused = computed = 0
        for member in self._members:
            a, b = member.prefill(context, should_stop)
            reused, computed = reused + a, computed + b
        return reused, computed

    def reset(self) -> None:
        for member in self._members:
            member.reset()

    def members(self) -> tuple[Drafter, ...]:
        return self._members
