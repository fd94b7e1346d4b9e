"""The draft model's view of the context: the FIM prompt with its suffix section cut short.

The draft only proposes; the target verifies every token against the full prompt, so the
draft may read a different context and the output stays the target's. What the draft
reads it must prefill, and in a fill-in-the-middle prompt the suffix section is re-prefilled
on every keystroke (it follows the changed end of the prefix in PSM):

    PSM: ... <prefix> P <suffix> S <middle> G   ->  ... <prefix> P <suffix> S[:n] <middle> G
    SPM: ... <suffix> S <prefix> P <middle> G   ->  ... <suffix> S[:n] <prefix> P <middle> G

The text right after the cursor is what a completion must meet; the rest of the suffix
mostly costs draft prefill (docs/benchmarks.md, "Round 3"). Everything else, and the
generated tokens G, stay as they are. The view is a pure function of the context and
view(prompt + G) == view(prompt) + G, so the draft cache's prefix reuse (CachedLM.sync) and
its kept tree branches work on the view as they would on the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-free at run time: the strategies and the bench flags read DRAFT_SUFFIX_TOKENS
    from specdec.engine.drafters.repo import PromptMarkers

# suffix tokens the draft reads (bench-measured on the default pair; None: the whole suffix)
DRAFT_SUFFIX_TOKENS: int | None = 16


def suffix_section(context: list[int], markers: PromptMarkers) -> tuple[int, int] | None:
    """[start, end) of the suffix section's tokens in the context's last FIM prompt (located by its last prefix
    marker, as repo.left_context does); None where the context holds no complete one (plain text, or a format
    whose markers are not single tokens)."""
    if markers.prefix is None or markers.suffix is None or markers.prefix not in context:
        return None
    prefix_at = len(context) - 1 - context[::-1].index(markers.prefix)
    suffix_at = _find(context, markers.suffix, prefix_at + 1)
    if suffix_at >= 0:  # PSM: the suffix section runs from its marker to the middle marker
        end = _find(context, markers.middle, suffix_at + 1) if markers.middle is not None else -1
        return (suffix_at + 1, end) if end >= 0 else None  # no end: a cut could reach into the generated tokens
    before = context[:prefix_at]
    if markers.suffix in before:  # SPM: the suffix section comes first and ends at the prefix marker
        return len(before) - before[::-1].index(markers.suffix), prefix_at
    return None


def _find(context: list[int], token: int, start: int) -> int:
    """The first index >= start holding token, or -1."""
    try:
        return context.index(token, start)
    except ValueError:
        return -1


@dataclass(frozen=True)
class DraftView:
    """What the draft model reads of a context: the FIM suffix section cut to its first `suffix_tokens` tokens
    (None: all of it, the context itself)."""

    markers: PromptMarkers
    suffix_tokens: int | None = DRAFT_SUFFIX_TOKENS

    def __post_init__(self) -> None:
        if self.suffix_tokens is not None and (not isinstance(self.suffix_tokens, int) or self.suffix_tokens < 0):
            raise ValueError(f"draft suffix tokens must be a non-negative integer or None, got {self.suffix_tokens!r}")

    def __call__(self, context: list[int]) -> list[int]:
        if self.suffix_tokens is None:
            return context
        section = suffix_section(context, self.markers)
        if section is None or section[1] - section[0] <= self.suffix_tokens:
            return context
        start, end = section
        return context[: start + self.suffix_tokens] + context[end:]
