"""The server's open documents, kept in chunks: an edit, a cursor lookup and the completion window cost
the edit and the window, not the document.

pygls' TextDocument splits the whole text into lines, converts the edited lines to UTF-16 a character at a
time and copies the document for every change: a 10 MB one-line file cost ~6 s of event-loop time per
keystroke (issue #40 item 5). Here the text is a one-level rope, `ChunkedText`: chunks of about CHUNK
characters, each with its counts (line breaks of both kinds below, UTF-16 and UTF-8 units), and running
totals over the chunks. A position is found by bisecting the totals and reading one chunk; an edit
rebuilds the one or two chunks it touches and shares the rest. A chunk whose units equal its length (ASCII,
or no character beyond the BMP for UTF-16) converts positions by arithmetic, without reading it.

Two notions of a line meet here, each kept exactly as before:
- pygls' lines (`str.splitlines` boundaries: \\n, \\r\\n, \\r, \\v, \\f, \\x1c-\\x1e, \\x85, \\u2028, \\u2029) place
  didChange ranges; `Document` applies changes as pygls' TextDocument does, its clamping and quirks
  included (tests/lsp_server/test_documents.py compares the two on random edits);
- the cursor's lines (split at \\n, a \\r before it not part of the line) find the completion's cursor.

ChunkedText is immutable: an edit returns a new one, so the object handed to another thread (the
repository indexer) is a snapshot as it is.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate

from lsprotocol import types
from pygls.workspace import TextDocument, Workspace

CHUNK = 8192  # characters per chunk: an edit rewrites one or two of them
MAX_CHANGES = 256  # a Document's changes not yet taken (take_changes), the newest kept
NEWLINE, LINES = "newline", "lines"  # the cursor's lines (split at \n); pygls' lines (str.splitlines)
BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines' boundaries ("\r\n" counts once)
_ASCII_BREAKS = b"\n\r\v\f\x1c\x1d\x1e"
_WIDE_BREAKS = (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # U+0085, U+2028, U+2029 in UTF-8
_ALL_BUT_ASCII_BREAKS = bytes(b for b in range(256) if b not in _ASCII_BREAKS)
_ALL_BUT_FOUR_BYTE_LEADS = bytes(b for b in range(256) if not 0xF0 <= b <= 0xF7)
_CONTINUATIONS = bytes(range(0x80, 0xC0))
_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")


@dataclass
class Work:
    """What a document's store did (for tests and specdec/stats): edits applied, characters written into new
    chunks, characters read to find positions or slice windows."""

    edits: int = 0
    copied: int = 0
    read: int = 0


def unit_kind(encoding) -> str:
    """The client's position encoding: utf-8, utf-32, or utf-16 (LSP's default, and pygls' for anything else)."""
    if encoding == types.PositionEncodingKind.Utf8:
        return "utf8"
    return "utf32" if encoding == types.PositionEncodingKind.Utf32 else "utf16"


def count_units(text: str, kind: str) -> int:
    if kind == "utf8":
        return len(text.encode("utf-8", "surrogatepass"))
    if kind == "utf16":
        return len(text.encode("utf-16-le", "surrogatepass")) // 2  # a lone surrogate is one unit, as in pygls
    return len(text)


def index_at_units(text: str, units: int, kind: str, up: bool) -> int:
    """The index in `text` after `units` code units; one that falls inside a character rounds after it (up)
    or before it. O(len(text)) at C speed, plus a step per character beyond the BMP (UTF-16)."""
    if kind == "utf32":
        return min(units, len(text))
    if kind == "utf16":
        astral = 0
        for match in _ASTRAL.finditer(text):
            before = match.start() + astral  # units before this character
            if before >= units:
                break
            if before + 1 == units:  # between the two halves of its surrogate pair
                return match.start() + (1 if up else 0)
            astral += 1
        return min(units - astral, len(text))
    data = text.encode("utf-8", "surrogatepass")
    started = len(data[:units].translate(None, _CONTINUATIONS))  # characters that start before `units`
    inside = units < len(data) and 0x80 <= data[units] < 0xC0
    return started - 1 if inside and not up else started


class Chunk:
    """A piece of the text with its counts, made once."""

    __slots__ = ("text", "newlines", "breaks", "utf16", "utf8")

    def __init__(self, text: str):
        data = text.encode("utf-8", "surrogatepass")
        found = data.translate(None, _ALL_BUT_ASCII_BREAKS)  # the ASCII line-break bytes, in order
        self.text = text
        self.newlines = found.count(b"\n")
        self.breaks = len(found) - (data.count(b"\r\n") if b"\r" in found else 0)
        self.utf8 = len(data)
        self.utf16 = len(text)
        if len(data) != len(text):  # beyond ASCII
            self.breaks += sum(map(data.count, _WIDE_BREAKS))
            self.utf16 += len(data.translate(None, _ALL_BUT_FOUR_BYTE_LEADS))  # two units beyond the BMP

    def units(self, kind: str) -> int:
        return self.utf16 if kind == "utf16" else self.utf8 if kind == "utf8" else len(self.text)


def split(text: str, work: Work) -> list[Chunk]:
    """Chunks of at most CHUNK + 1 characters and of even sizes (none small unless the text is); a "\\r\\n" is
    never cut (one line break, in one chunk)."""
    work.copied += len(text)
    count = -(-len(text) // CHUNK)
    chunks, start = [], 0
    for piece in range(1, count + 1):
        end = len(text) * piece // count
        if end < len(text) and text[end - 1] == "\r" and text[end] == "\n":
            end += 1
        if end > start:
            chunks.append(Chunk(text[start:end]))
            start = end
    return chunks


class ChunkedText:
    """Immutable text in chunks, with running totals per chunk (characters, line breaks, code units).

    Reads like a str where the server needs one: len(), slices, find(); str() joins it (a copy: only where the
    whole text is wanted, off the event loop).
    """

    __slots__ = ("chunks", "ends", "newlines", "breaks", "utf16", "utf8", "work")

    def __init__(self, chunks: list[Chunk], work: Work):
        self.chunks = chunks
        self.ends = list(accumulate(len(c.text) for c in chunks))  # offset after each chunk
        self.newlines = list(accumulate(c.newlines for c in chunks))  # totals up to and with each chunk
        self.breaks = list(accumulate(c.breaks for c in chunks))
        self.utf16 = list(accumulate(c.utf16 for c in chunks))
        self.utf8 = list(accumulate(c.utf8 for c in chunks))
        self.work = work

    @classmethod
    def of(cls, text: str, work: Work | None = None) -> ChunkedText:
        work = work or Work()
        return cls(split(text, work), work)

    # -- as a string --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __str__(self) -> str:
        return "".join(c.text for c in self.chunks)

    def _start(self, index: int) -> int:
        return self.ends[index - 1] if index else 0

    def __getitem__(self, key) -> str:
        if isinstance(key, int):
            index = key + len(self) if key < 0 else key
            if not 0 <= index < len(self):
                raise IndexError("ChunkedText index out of range")
            chunk = bisect_right(self.ends, index)
            return self.chunks[chunk].text[index - self._start(chunk)]
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("ChunkedText slices take no step")
        if stop <= start:
            return ""
        self.work.read += stop - start
        chunk = bisect_right(self.ends, start)
        base, parts = self._start(chunk), []
        while base < stop:
            text = self.chunks[chunk].text
            parts.append(text[max(0, start - base) : stop - base])
            base += len(text)
            chunk += 1
        return "".join(parts)

    def find(self, sub: str, start: int = 0, end: int | None = None) -> int:
        """str.find over [start, end): reads that span only."""
        start, end, _ = slice(start, end).indices(len(self))
        found = self[start:end].find(sub) if end >= start else -1
        return found + start if found >= 0 else -1

    # -- lines ------------------------------------------------------------------------------------
    def line_start(self, line: int, kind: str = NEWLINE) -> int:
        """Offset where 0-based `line` starts, or -1 past the last line: a bisection and one chunk read."""
        if line <= 0:
            return 0
        totals = self.newlines if kind == NEWLINE else self.breaks
        chunk = bisect_left(totals, line)  # the chunk holding the line's break
        if chunk == len(totals):
            return -1
        text = self.chunks[chunk].text
        nth = line - (totals[chunk - 1] if chunk else 0)
        self.work.read += len(text)
        if kind == NEWLINE:
            local = sum(map(len, text.split("\n", nth)[:nth])) + nth
        else:
            local = sum(map(len, text.splitlines(True)[:nth]))
        return self._start(chunk) + local

    def line_of(self, offset: int) -> int:
        """The 0-based line (split at \n) holding `offset`: a bisection and one partial chunk read."""
        offset = max(0, min(offset, len(self)))
        chunk = bisect_right(self.ends, offset) if offset < len(self) else len(self.chunks) - 1
        if chunk < 0:
            return 0
        base = self._start(chunk)
        self.work.read += offset - base
        return (self.newlines[chunk - 1] if chunk else 0) + self.chunks[chunk].text.count("\n", 0, offset - base)

    def line_count(self) -> int:
        """len(text.splitlines()): pygls' number of lines."""
        if not self.chunks:
            return 0
        return self.breaks[-1] + (self.chunks[-1].text[-1] not in BREAKS)

    # -- code units ---------------------------------------------------------------------------------
    def units_before(self, offset: int, kind: str) -> int:
        """Code units of the text before `offset`: a bisection, and one partial chunk read where it is not ASCII."""
        offset = max(0, min(offset, len(self)))
        if kind == "utf32" or offset == 0:
            return offset
        totals = self.utf16 if kind == "utf16" else self.utf8
        if offset == len(self):
            return totals[-1]
        chunk = bisect_right(self.ends, offset)
        local = offset - self._start(chunk)
        before = totals[chunk - 1] if chunk else 0
        if self.chunks[chunk].units(kind) == len(self.chunks[chunk].text):
            return before + local
        self.work.read += local
        return before + count_units(self.chunks[chunk].text[:local], kind)

    def offset_at_units(self, units: int, kind: str, up: bool) -> int:
        """The offset after `units` code units of the whole text (inside a character: after it if up)."""
        if kind == "utf32" or units <= 0:
            return max(0, min(units, len(self)))
        totals = self.utf16 if kind == "utf16" else self.utf8
        chunk = bisect_left(totals, units)
        if chunk == len(totals):
            return len(self)
        text, base = self.chunks[chunk].text, self._start(chunk)
        want = units - (totals[chunk - 1] if chunk else 0)
        if self.chunks[chunk].units(kind) == len(text):
            return base + want
        self.work.read += len(text)
        return base + index_at_units(text, want, kind, up)

    def advance(self, start: int, units: int, kind: str, up: bool, limit: int) -> int:
        """The offset `units` code units after `start`, at most `limit`."""
        return min(limit, self.offset_at_units(self.units_before(start, kind) + units, kind, up))

    # -- positions --------------------------------------------------------------------------------
    def cursor_offset(self, position: types.Position, encoding) -> int:
        """The completion's cursor: lines split at \\n; past the last line, the end; past the line's end, its end
        (before a \\r\\n's \\r); never inside a character (a surrogate pair, a UTF-8 sequence): before it."""
        line = max(0, position.line)
        start = self.line_start(line)
        if start < 0:
            return len(self)
        following = self.line_start(line + 1)
        end = len(self) if following < 0 else following - 1
        if end > start and self[end - 1] == "\r":
            end -= 1
        return self.advance(start, max(0, position.character), unit_kind(encoding), up=False, limit=end)

    def pygls_position(self, position: types.Position, encoding) -> tuple[int, int]:
        """(line, offset) of a didChange position exactly as pygls' PositionCodec.position_from_client_units and
        TextDocument._apply_incremental_change place it: past the last line, the end of the text; past a line's
        end, its last character (the break, or for the last line without one, before its last character); inside
        a character, after it; a \\r\\n line measured as if it ended in \\n alone."""
        count = self.line_count()
        if count == 0:
            return 0, 0
        if position.line >= count:
            return count - 1, len(self)
        line = max(0, position.line)
        start = self.line_start(line, LINES)
        following = self.line_start(line + 1, LINES)
        stop = len(self) if following < 0 else following
        crlf = stop - start >= 2 and self[stop - 2 : stop] == "\r\n"
        content_end = stop - 2 if crlf else stop
        kind = unit_kind(encoding)
        client_len = self.units_before(content_end, kind) - self.units_before(start, kind) + crlf
        character = position.character
        if character > client_len:
            character = client_len - 1
        if character <= 0:
            return line, start
        if crlf and character == client_len:
            return line, content_end + 1  # pygls measures "abc\n" for "abc\r\n": its last index falls after the \r
        return line, self.advance(start, character, kind, up=True, limit=content_end if crlf else stop)

    # -- editing ------------------------------------------------------------------------------------
    def edit(self, start: int, end: int, text: str) -> ChunkedText:
        """The text with [start, end) replaced by `text`: the chunks the span touches are rebuilt (with a
        neighbour when they would get small, or to keep a \\r\\n in one chunk), every other chunk is shared."""
        work = self.work
        work.edits += 1
        start = max(0, min(start, len(self)))
        end = max(start, min(end, len(self)))
        chunks = self.chunks
        if not chunks:
            return ChunkedText(split(text, work), work)
        first = min(bisect_right(self.ends, start), len(chunks) - 1)
        last = min(bisect_right(self.ends, end - 1), len(chunks) - 1) if end > start else first
        head, tail = chunks[first].text, chunks[last].text
        region = head[: start - self._start(first)] + text + tail[end - self._start(last) :]
        low, high = first, last + 1  # chunks[low:high] are replaced by the region's
        if len(region) < CHUNK // 4 and high < len(chunks):
            region, high = region + chunks[high].text, high + 1
        elif len(region) < CHUNK // 4 and low > 0:
            region, low = chunks[low - 1].text + region, low - 1
        if low > 0 and region.startswith("\n") and chunks[low - 1].text.endswith("\r"):
            region, low = chunks[low - 1].text + region, low - 1
        if high < len(chunks) and region.endswith("\r") and chunks[high].text.startswith("\n"):
            region, high = region + chunks[high].text, high + 1
        return ChunkedText(chunks[:low] + split(region, work) + chunks[high:], work)


class Document(TextDocument):
    """pygls' TextDocument over a ChunkedText: the same changes, at the cost of the change."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.work = Work()
        self._text = None if self._source is None else ChunkedText.of(self._source, self.work)
        self._source = None  # the chunks hold the text
        # the changes applied since the server last read them (take_changes): (text before, start, end, inserted),
        # or (text before, None, None, None) for the whole text sent again
        self.changes: list[tuple[ChunkedText, int | None, int | None, str | None]] = []

    def take_changes(self) -> list[tuple[ChunkedText, int | None, int | None, str | None]]:
        changes, self.changes = self.changes, []
        return changes

    @property
    def text(self) -> ChunkedText:
        if self._text is None:  # pygls made it for a document the editor has not opened: the disk's text
            self._text = ChunkedText.of(TextDocument.source.fget(self), self.work)
        return self._text

    @property
    def source(self) -> str:
        return str(self.text)

    def _apply_incremental_change(self, change: types.TextDocumentContentChangePartial) -> None:
        text, encoding = self.text, self.position_codec.encoding
        first, start = text.pygls_position(change.range.start, encoding)
        last, end = text.pygls_position(change.range.end, encoding)
        if first > last:
            return  # pygls writes every line back unchanged for a range that ends on an earlier line
        insert = change.text
        if end < start:  # a reversed range on one line: pygls writes line[:start] + text + line[end:]
            insert, end = insert + text[end:start], start
        self._text = text.edit(start, end, insert)
        self.changes.append((text, start, end, insert))
        del self.changes[:-MAX_CHANGES]  # unread changes hold old texts: a bound, whoever forgets to read them

    def _apply_full_change(self, change: types.TextDocumentContentChangeEvent) -> None:
        self.changes.append((self.text, None, None, None))
        self._text = ChunkedText.of(change.text, self.work)


class DocumentWorkspace(Workspace):
    """pygls' workspace whose text documents are `Document`s."""

    @classmethod
    def replacing(cls, workspace: Workspace) -> DocumentWorkspace:
        """The same workspace (root, sync kind, folders, position encoding), before any document is open."""
        return cls(workspace.root_uri, workspace._sync_kind, list(workspace.folders.values()),
                   workspace.position_encoding)

    def _create_text_document(self, doc_uri: str, source: str | None = None, version: int | None = None,
                              language_id: str | None = None) -> Document:
        return Document(doc_uri, source=source, version=version, language_id=language_id,
                        sync_kind=self._sync_kind, position_codec=self.position_codec)


def text_of(document: TextDocument) -> ChunkedText:
    """A document's text: a Document's own chunks, or any other pygls document's source chunked (tests)."""
    return document.text if isinstance(document, Document) else ChunkedText.of(document.source)


def summary(documents) -> dict:
    """specdec/stats' view of the open documents and what keeping them cost."""
    documents = [d for d in documents if isinstance(d, Document)]
    return {"open": len(documents), "characters": sum(len(d.text) for d in documents),
            "edits": sum(d.work.edits for d in documents), "copied": sum(d.work.copied for d in documents),
            "read": sum(d.work.read for d in documents)}
