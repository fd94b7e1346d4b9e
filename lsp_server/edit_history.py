"""The recent edits of each open document, as the user made them (issue #51 item 1): what a next-edit prompt shows
the model as original/updated pairs (specdec/prompts/next_edit.py's Hunk).

didChange deltas are coalesced into hunks: a change on the lines of the edit under way, or next to them, extends it;
a change elsewhere closes it. Lines here are the cursor's (split at \\n). A hunk keeps its lines' text before its
first change and, once closed, after its last, with one unchanged line of context on each side. Bounded per
document (MAX_HUNKS, the most recent kept; a hunk over MAX_HUNK_CHARS, a paste, is not kept) and dropped on close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lsp_server.documents import ChunkedText
from specdec.prompts.next_edit import Hunk

MAX_HUNKS = 16  # per document, the most recent
MAX_HUNK_CHARS = 4000  # a hunk's text before or after; a larger one (a paste, a reformat) is not an edit to imitate
CONTEXT_LINES = 1


def lines_text(text: ChunkedText, first: int, last: int, limit: int = MAX_HUNK_CHARS) -> str | None:
    """Lines first..last (0-based, inclusive, split at \\n) with their line breaks ("" for an empty range), or None
    when they hold more than `limit` characters: they are not read (a 10 MB line costs a chunk, not 10 MB)."""
    if last < first:
        return ""
    start = text.line_start(first)
    if start < 0:
        return ""
    end = text.line_start(last + 1)
    end = len(text) if end < 0 else end
    return text[start:end] if end - start <= limit else None


def joined(*parts: str | None) -> str | None:
    """The parts' text, or None (too big) when one of them is."""
    return None if any(p is None for p in parts) else "".join(parts)


@dataclass
class Open:
    """The edit under way: lines [first, last] of the current text, and what they held before its first change."""

    first: int
    last: int
    original: str | None  # None: too big to keep (lines_text)


@dataclass
class DocumentEdits:
    hunks: list[tuple[str, str]] = field(default_factory=list)  # (original, updated), the oldest first
    open: Open | None = None


class EditHistory:
    def __init__(self):
        self.documents: dict[str, DocumentEdits] = {}

    def change(self, uri: str, before: ChunkedText, start: int, end: int, inserted: str) -> None:
        """One change as pygls applied it: [start, end) of `before` (offsets) replaced by `inserted`."""
        edits = self.documents.setdefault(uri, DocumentEdits())
        first, last = before.line_of(start), before.line_of(end)
        added = inserted.count("\n") - (last - first)  # lines the change adds (negative: removes)
        edit = edits.open
        if edit is not None and edit.first - 1 <= first and last <= edit.last + 1:  # on or next to the edit
            if first < edit.first:  # a line above joins it: its text before is before's
                edit.original = joined(lines_text(before, first, edit.first - 1), edit.original)
                edit.first = first
            if last > edit.last:
                edit.original = joined(edit.original, lines_text(before, edit.last + 1, last))
                edit.last = last
            edit.last += added
            return
        if edit is not None:
            self._close(edits, before)
        edits.open = Open(first, last + added, lines_text(before, first, last))

    def replaced(self, uri: str, before: ChunkedText) -> None:
        """The whole text was sent again: the edit under way closes; the new text is no delta to learn from."""
        edits = self.documents.get(uri)
        if edits is not None and edits.open is not None:
            self._close(edits, before)

    def _close(self, edits: DocumentEdits, text: ChunkedText) -> None:
        edit, edits.open = edits.open, None
        pair = self._pair(edit, text)
        if pair is not None:
            edits.hunks.append(pair)
            del edits.hunks[:-MAX_HUNKS]

    @staticmethod
    def _pair(edit: Open, text: ChunkedText) -> tuple[str, str] | None:
        """The edit's (original, updated) in `text`, the current text, with its context lines; None when it changed
        nothing or is too big to be an edit to imitate."""
        updated = lines_text(text, edit.first, edit.last) if edit.original is not None else None
        if updated is None or updated == edit.original:
            return None
        above = lines_text(text, max(0, edit.first - CONTEXT_LINES), edit.first - 1)
        below = lines_text(text, edit.last + 1, edit.last + CONTEXT_LINES)
        original, updated = joined(above, edit.original, below), joined(above, updated, below)
        return None if original is None or updated is None else (original, updated)

    def hunks(self, uri: str, path: str, text: ChunkedText) -> list[Hunk]:
        """The document's recent edits, the oldest first, the one under way (as `text` has it now) last."""
        edits = self.documents.get(uri)
        if edits is None:
            return []
        pairs = list(edits.hunks)
        if edits.open is not None:
            pair = self._pair(edits.open, text)
            if pair is not None:
                pairs.append(pair)
        return [Hunk(path, original, updated) for original, updated in pairs[-MAX_HUNKS:]]

    def forget(self, uri: str) -> None:
        self.documents.pop(uri, None)
