"""Server-sent events, as every engine streams them: the one reader of `data:` lines for both HTTP clients."""

from __future__ import annotations

DONE = b"[DONE]"  # OpenAI-style end of stream
MAX_EVENT_BYTES = 1 << 20  # one line of a stream: a token's event is well under 4 kB, a whole 1024-token reply ~100 kB


class EventTooLarge(ValueError):
    """A line of the stream grew past MAX_EVENT_BYTES: an engine gone wrong, not a reply to keep buffering."""


def data_lines(pending: bytes, max_bytes: int = MAX_EVENT_BYTES) -> tuple[list[bytes], bytes]:
    """The `data:` payloads of the complete lines in pending (stripped; DONE included), and the incomplete rest.

    Blank separators, comments and other fields are skipped; a caller appends the next chunk to the rest.
    EventTooLarge for a line (whole, or the rest still without its newline) over max_bytes, so one event
    without a newline cannot fill the memory or become a 10 MB suggestion."""
    payloads = []
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        if len(line) > max_bytes:
            raise EventTooLarge(f"an event of {len(line)} bytes (at most {max_bytes})")
        line = line.strip()
        if line.startswith(b"data:"):
            payloads.append(line[5:].strip())
    if len(pending) > max_bytes:
        raise EventTooLarge(f"an event of over {max_bytes} bytes without its end")
    return payloads, pending
