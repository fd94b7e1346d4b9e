"""Repository lookup: draft what followed the longest earlier occurrence of the text before the cursor, anywhere
in the workspace's other files or the completions the user accepted.

Like prompt lookup it costs a lookup instead of a model step, and its tokens are
deterministic (q one-hot); unlike it, it sees the whole repository (repo_index.py), and
it weighs continuations by how often each followed the match.

The index holds plain source, but the context is a fill-in-the-middle prompt: the text
before the cursor sits between the prefix and suffix markers, and the completion so far
after the middle marker. `left_context` stitches the two back together, so the match runs
across the cursor as it would in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import NO_REQUEST, Draft, RequestContext
from specdec.engine.drafters.repo_index import RepoIndex


@dataclass(frozen=True)
class PromptMarkers:
    """Token ids of a fill-in-the-middle prompt's markers (None where the format has none)."""

    prefix: int | None = None
    suffix: int | None = None
    middle: int | None = None


def left_context(context: list[int], markers: PromptMarkers | None, keep: int) -> list[int]:
    """The last `keep` tokens of (text before the cursor + completion so far).

    PSM: ... <prefix> P <suffix> S <middle> G  ->  P + G
    SPM: ... <suffix> S <prefix> P <middle> G  ->  P + G
    A context without a prefix marker is plain text: its own tail.
    """
    if markers is None or markers.prefix is None or markers.prefix not in context:
        return context[-keep:]
    start = len(context) - context[::-1].index(markers.prefix)
    after = context[start:]
    if markers.middle is not None and markers.middle in after:
        cut = after.index(markers.middle)
        before, generated = after[:cut], after[cut + 1 :]
    else:
        before, generated = after, []
    if markers.suffix is not None and markers.suffix in before:  # PSM: the suffix section follows the prefix
        before = before[: before.index(markers.suffix)]
    return (before + generated)[-keep:]


@dataclass
class RepoDrafter:
    index: RepoIndex
    min_match: int = 2  # a shorter match is mostly noise in a whole repository
    min_probability: float = 0.2  # stop the chain where its path's frequency falls below this
    markers: PromptMarkers | None = None
    name: str = "repo"
    length: DraftLength = field(default_factory=lambda: DraftLength(k_max=8, draft_cost=0.0, acceptance=0.5))

    def propose(self, context: list[int], k: int, sampling=None, generator=None,
                request: RequestContext | None = None) -> Draft:
        """request: the document being completed (its own tail is not a prediction: skipped) and whose token ids
        the context is (no match in another tokenizer's index)."""
        k = self.length.next_k(k)
        found = self._lookup(context, k, request or NO_REQUEST) if k > 0 else None
        tokens = found.chain(k, self.min_probability)[0] if found else []
        return Draft(tokens, None, self.name)

    def propose_tree(self, context: list[int], k: int, nodes: int, request: RequestContext | None = None):
        """The continuations as a TokenTree (deterministic children, most frequent first), <= nodes nodes and
        <= k deep; None without a match. For tree speculation; `propose` gives its best chain."""
        found = self._lookup(context, k, request or NO_REQUEST) if k > 0 and nodes > 0 else None
        return found.tree(k, nodes, self.min_probability) if found else None

    def _lookup(self, context: list[int], k: int, request: RequestContext):
        return self.index.query(left_context(context, self.markers, self.index.depth), request.document or None,
                                self.min_match, horizon=k, vocabulary=request.vocabulary)

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float) -> None:
        self.length.observe(len(draft.tokens), accepted, draft_seconds, target_pass_seconds)  # a lookup's cost is measured

    def prefill(self, context: list[int], should_stop=None) -> tuple[int, int]:
        return 0, 0

    def reset(self) -> None:
        pass
