"""The document's text around the cursor that a completion request carries: bounded, so a huge document is completed
from the text near the cursor, and with its start on a fixed grid, so the prompt's start (and the KV cache built on
it) holds while the user types.

The text is a `str` or anything that finds and slices like one (the server's ChunkedText, lsp_server/documents.py:
from it, the window is all this reads).
"""

from __future__ import annotations

from typing import Protocol

BINARY_SNIFF = 8192  # characters at the start of a document searched for a NUL: binary documents are not completed
PREFIX_WINDOW = 256_000  # characters before the cursor a request carries: far more than any prompt budget uses,
SUFFIX_WINDOW = 64_000  # and a 10 MB document costs a slice, not a copy the size of the file per keystroke


class Text(Protocol):
    def find(self, sub: str, start: int = ..., end: int = ...) -> int: ...

    def __getitem__(self, key: slice) -> str: ...


def looks_binary(source: Text) -> bool:
    """A NUL in the document's first BINARY_SNIFF characters: not text to complete."""
    return "\0" in source[:BINARY_SNIFF]


def window(source: Text, offset: int) -> tuple[str, str]:
    """Prefix and suffix around the cursor, bounded: a huge document is completed from the text near it
    (from a document's ChunkedText, that text is all this reads).

    The prefix window starts at a line break on a fixed grid of the document, so its start
    (and the prompt's, and the KV cache built on it) does not move while the user types.
    """
    start = 0
    if offset > PREFIX_WINDOW:
        grid = (offset - PREFIX_WINDOW) // 4096 * 4096 + 4096
        newline = source.find("\n", grid, offset)
        start = newline + 1 if newline >= 0 else offset - PREFIX_WINDOW
    return source[start:offset], source[offset : offset + SUFFIX_WINDOW]
