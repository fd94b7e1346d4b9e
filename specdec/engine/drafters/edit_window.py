"""Speculative edits: draft the updated window by copying the current one from where the output stands.

A next-edit prompt (specdec/prompts/next_edit.py) ends with the current window and the header of the updated one,
which the model writes: mostly the same lines, a few changed. So the current window's tokens are the draft:
from the aligned position (the output so far matched against the window), as long a chain as the pass allows,
so unchanged lines are copied a whole line or more per target pass. Where the output leaves the window (the
edit itself: a renamed identifier, an inserted or deleted line) the drafter re-aligns as prompt lookup does after
a mismatch: the longest recent n-gram of the output found in the window, nearest after where it was, and copies
on from there; a single differing token right after a run of matches is first taken for a replacement of the
window's token (the copy goes on after it); while it finds nothing it has nothing to propose, and a composite's
next member (the draft model) drafts. The target verifies every token, so greedy output is plain greedy output.

The window is found in the prompt, not handed in: the tokens between the last two file separators, after the
first newline (the `original/PATH` header line). A prompt without two separators is no next-edit prompt and gets
no drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.engine.draft_length import DraftLength
from specdec.engine.drafters.base import Draft
from specdec.engine.limits import MAX_DRAFT


@dataclass(frozen=True)
class EditMarkers:
    """The file separator's id and a newline's ids (`next_edit.markers` makes them from the tokenizer)."""

    file_sep: int
    newline: tuple[int, ...]


def window_tokens(prompt: list[int], markers: EditMarkers) -> list[int] | None:
    """The current window's tokens in a next-edit prompt: after the header line of the next-to-last separator's
    block, up to the last separator; None where the prompt has no such block."""
    seps = [i for i in range(len(prompt) - 1, -1, -1) if prompt[i] == markers.file_sep][:2]
    if len(seps) < 2:
        return None
    last, before = seps
    n = len(markers.newline)
    for i in range(before + 1, last - n + 1):
        if tuple(prompt[i : i + n]) == markers.newline:
            return prompt[i + n : last]
    return None


@dataclass
class EditWindow:
    """Drafts the current window's continuation at the output's aligned position (module docstring)."""

    markers: EditMarkers
    min_ngram: int = 2  # the shortest output tail that re-aligns (a 1-token match is mostly indentation)
    max_ngram: int = 12
    near: int = 4  # a single token re-aligns within this many tokens after the anchor
    name: str = "edit"
    length: DraftLength = field(default_factory=lambda: DraftLength(k_max=MAX_DRAFT, draft_cost=0.0,
                                                                    acceptance=0.9))
    window: list[int] = field(default_factory=list, repr=False)
    _start: int = 0  # where the output begins in the context (the prompt's length)
    _seen: int = 0  # output tokens already walked
    _at: int | None = 0  # the window position the output is aligned to (None: not aligned)
    _run: int = 0  # tokens matched in a row up to _at: a mismatch after a real run is taken for a replacement
    _anchor: int = 0  # the last aligned position: re-alignment looks forward from it first

    def prefill(self, context: list[int], should_stop=None) -> tuple[int, int]:
        """A new prompt: find its window; the output starts aligned to the window's first token (the header line
        before both windows is the run that makes a first-token replacement a replacement)."""
        self.window = window_tokens(context, self.markers) or []
        self._start, self._seen, self._at, self._run, self._anchor = len(context), 0, 0, 2, 0
        return 0, 0

    def aligned(self, context: list[int]) -> int | None:
        """The window position the output in `context` is aligned to, walking the tokens added since last asked.

        A token that differs from the window ends the alignment. Then the output's longest recent n-gram (at least
        min_ngram tokens) in the window re-aligns it; where none matches and the differing token is the output's
        last, after a run of matches, it is taken to replace the window's token there (a renamed identifier, a
        changed operator: the commonest edit) and the copy goes on after that token, once; otherwise nothing is
        aligned until an n-gram matches."""
        out = context[self._start :]
        if len(out) < self._seen:  # not this prompt's output: start over
            self._seen, self._at, self._run, self._anchor = 0, 0, 2, 0
        window = self.window
        replaced = None  # the position after the window token the output's last token replaced
        for token in out[self._seen :]:
            if self._at is not None and self._at < len(window) and window[self._at] == token:
                self._at += 1
                self._run += 1
                self._anchor = self._at
            else:
                replaced = self._at + 1 if self._at is not None and self._run >= 2 and self._at < len(window) else None
                self._at, self._run = None, 0
        self._seen = len(out)
        if self._at is None:
            found = self._realign(out)
            if found is not None:
                self._at, self._run = found
                self._anchor = self._at
            else:
                self._at = replaced
        return self._at

    def _realign(self, out: list[int]) -> tuple[int, int] | None:
        """(where, n): where the output's longest recent n-gram ends in the window, the first such place at or after
        the anchor, else the last before it; else where its last token is within `near` tokens after the anchor;
        None where neither matches."""
        window = self.window
        for n in range(min(self.max_ngram, len(out)), self.min_ngram - 1, -1):
            tail = out[-n:]
            ends = [i + n for i in range(len(window) - n + 1) if window[i] == tail[0] and window[i : i + n] == tail]
            if ends:
                ahead = [e for e in ends if e >= self._anchor]
                return (ahead[0] if ahead else ends[-1]), n
        if out:  # one token, only just ahead of the anchor: a replacement longer than what it replaced, ending
            for end in range(self._anchor + 1, min(len(window), self._anchor + self.near) + 1):
                if window[end - 1] == out[-1]:
                    return end, 1
        return None

    def propose(self, context: list[int], k: int, sampling=None, generator=None, request=None) -> Draft:
        at = self.aligned(context) if self.window else None
        if at is None or at >= len(self.window):
            return Draft([], None, self.name)
        k = self.length.next_k(k)
        return Draft(self.window[at : at + k] if k > 0 else [], None, self.name)

    def observe(self, draft: Draft, accepted: int, draft_seconds: float, target_pass_seconds: float) -> None:
        self.length.observe(len(draft.tokens), accepted)  # drafting is free: no cost to learn

    def reset(self) -> None:
        self.window, self._start, self._seen, self._at, self._run, self._anchor = [], 0, 0, 0, 2, 0


def with_edit_window(drafter, markers: EditMarkers, max_draft: int = MAX_DRAFT, adaptive: bool = True):
    """The edit drafter in front of a strategy's drafter (next-edit's `edit` and `auto`): a Composite of the window
    copy and the drafter's members, so where the window has no aligned proposal the next member (prompt lookup,
    the draft model) drafts; the window alone where there is no drafter."""
    from specdec.engine.drafters.composite import Composite

    edit = EditWindow(markers, length=DraftLength(k_max=max_draft, draft_cost=0.0, acceptance=0.9,
                                                  adaptive=adaptive))
    if drafter is None:
        return edit
    members = drafter.members() if hasattr(drafter, "members") else (drafter,)
    return Composite(edit, *members)
