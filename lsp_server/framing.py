"""LSP base-protocol framing (`Content-Length` headers) that never loses its place in the stream.

pygls' reader trusts every header: a huge length makes it allocate that much, an odd header
(lowercase, LF-only, `abc`) or a wrong length leaves it waiting for a frame that never comes.
This parser is fed raw bytes and hands back bodies or discarded garbage; after anything bad it
resynchronises on the next `Content-Length:` header. The header pattern (digits and a real line
break) cannot occur inside valid JSON, so a header seen inside a body means the frame was cut short.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_BODY = 64 * 1024 * 1024  # a frame announcing more is refused and skipped
MAX_HEADER = 8192  # a header block longer than this is garbage
KEEP = 4096  # bytes of discarded data kept for recovering an id
HEADER_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
# a complete header block: Content-Length first or after other header lines, ended by an empty line
HEADER_BLOCK = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?\n(?:[^\r\n]+\r?\n)*?\r?\n", re.IGNORECASE)
# other header lines (Content-Type) before ours; and the same still arriving (no backtracking blow-up)
OTHER_HEADERS = re.compile(rb"(?:[A-Za-z][A-Za-z0-9-]*[ \t]*:[^\r\n]*\r?\n)+")
PARTIAL_HEADERS = re.compile(rb"(?:[A-Za-z][A-Za-z0-9-]*[ \t]*:[^\r\n]*\r?\n)*(?:[A-Za-z][A-Za-z0-9-]*(?:[ \t]*:[^\r\n]*\r?)?)?")
# Content-Length with a number and a real line break: cannot occur inside valid JSON
HEADER_IN_BODY = re.compile(rb"content-length[ \t]*:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)


@dataclass
class Body:
    """One frame's body: as long as its header said, or up to the next header when that came first."""

    data: bytes
    problem: str = ""  # a framing problem to log (the body may still be a whole JSON value)


@dataclass
class Discarded:
    """Bytes that were not a usable frame, with why (for one log line and, if it had an id, an answer)."""

    data: bytes  # at most the first few KB: enough to recover a request id
    reason: str  # "" for the rest of a run of skipped bytes, already reported


class FrameParser:
    """Incremental: `feed` bytes, then `next_event` until it returns None."""

    def __init__(self, max_body: int = MAX_BODY):
        self.max_body = max_body
        self._buffer = bytearray()
        self._length: int | None = None  # body length of the frame being read, after its header
        self._scanned = 0  # how much of that body was already searched for a header
        self._garbage = False  # in a run of skipped bytes: reported once, at its start

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def unread(self, data: bytes) -> None:
        """Put bytes back in front (the tail of a body that was longer than its JSON value)."""
        self._buffer[:0] = data

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def mid_body(self) -> bool:
        return self._length is not None and bool(self._buffer)

    def stalled(self) -> Body | None:
        """No bytes came for a while mid-body: if what came is a whole JSON value, the length was too long.

        A cut-off value is left waiting: the next frame's header will end it (see `_body`).
        """
        if not self.mid_body:
            return None
        try:
            json.loads(self._buffer)
        except ValueError:
            return None
        data, length = bytes(self._buffer), self._length
        self._buffer.clear()
        self._length, self._garbage = None, True  # should the rest still come, it is skipped quietly
        return Body(data, f"{len(data)} of {length} bytes came, then nothing")

    def next_event(self) -> Body | Discarded | None:
        if self._length is not None:
            return self._body()
        return self._header()

    def _header(self) -> Body | Discarded | None:
        buf = self._buffer
        start = HEADER_START.search(buf)
        if start is None:
            # nothing starts a header: drop all but what may be the start of "content-length" at the end
            if len(buf) <= MAX_HEADER and PARTIAL_HEADERS.fullmatch(buf):
                return None  # other header lines, arriving before ours
            keep = len(b"content-length")
            return self._drop(len(buf) - keep, "no Content-Length header") if len(buf) > keep else None
        if start.start() > 0:
            if OTHER_HEADERS.fullmatch(buf, 0, start.start()):  # Content-Type and the like, before ours
                del buf[: start.start()]
                return Discarded(b"", "")
            return self._drop(start.start(), "bytes before a header")
        block = HEADER_BLOCK.match(buf)
        if block is None:
            if len(buf) > MAX_HEADER or HEADER_START.search(buf, 1):
                return self._drop(start.end(), "unterminated header")
            return None  # the rest of the header has not arrived yet
        self._garbage = False
        value = block.group(1)
        del buf[: block.end()]
        if not value.isdigit():
            return Discarded(b"", f"bad Content-Length {value[:40].decode('latin-1')!r}")
        length = int(value)
        if length == 0:
            return Discarded(b"", "Content-Length 0")
        if length > self.max_body:
            # not skipped by count (a lie about the length would eat the next frames): resync on a header;
            # if its body has not arrived yet, the first skip of it is reported too, to recover its id
            self._garbage = bool(buf)
            return Discarded(self._head(len(buf)), f"frame of {length} bytes refused (limit {self.max_body})")
        self._length, self._scanned = length, 0
        return self._body()

    def _body(self) -> Body | Discarded | None:
        buf, length = self._buffer, self._length
        end = min(len(buf), length + 64)
        cut = HEADER_IN_BODY.search(buf, max(0, self._scanned - 64), end)
        self._scanned = end
        if cut is not None and cut.start() < length:
            # the next frame's header inside this body: this frame was shorter than announced
            self._length = None
            data = bytes(buf[: cut.start()])
            del buf[: cut.start()]
            return Body(data, f"the next header came after {cut.start()} of {length} bytes")
        if len(buf) < length:
            return None
        self._length = None
        data = bytes(buf[:length])
        del buf[:length]
        return Body(data)

    def _drop(self, count: int, reason: str) -> Discarded:
        """Skip bytes; the first drop of a run is reported, with the bytes' start to recover an id from."""
        quiet, self._garbage = self._garbage, True
        data = b"" if quiet else self._head(count)
        del self._buffer[:count]
        return Discarded(data, "" if quiet else reason)

    def _head(self, count: int) -> bytes:
        """The start of bytes about to be skipped, up to any header in them (the next frame's id is not theirs)."""
        data = bytes(self._buffer[: min(count, KEEP)])
        header = HEADER_START.search(data)
        return data[: header.start()] if header else data
