"""Server-sent events, as every engine streams them: the one reader of `data:` lines for both HTTP clients."""

from __future__ import annotations

DONE = b"[DONE]"  # OpenAI-style end of stream


def data_lines(pending: bytes) -> tuple[list[bytes], bytes]:
    """The `data:` payloads of the complete lines in pending (stripped; DONE included), and the incomplete rest.

    Blank separators, comments and other fields are skipped; a caller appends the next chunk to the rest."""
    payloads = []
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        line = line.strip()
        if line.startswith(b"data:"):
            payloads.append(line[5:].strip())
    return payloads, pending
