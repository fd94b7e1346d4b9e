"""One process at a time through a slow step that fills a shared cache entry (a GGUF's bf16 conversion, its packed
native weights).

Why: two processes converting the same GGUF at once (an editor's server and a `specdec complete`, two editors)
did the work twice, at twice the peak memory, and the bf16 conversion's shared `.partial` folder made one of them
fail. The lock is an fcntl lock on `<entry>.lock` beside the entry, which dies with its holder, so a killed
process never leaves the next one waiting; whoever comes second waits its turn and then finds the first one's
result. Entries are still written aside and renamed into place, so a reader that takes no lock never sees half of
one.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

WAIT_S = 900.0  # a holder slower than this (a conversion is a minute or two) is presumed stuck: go on without


@contextmanager
def turn(entry: Path | str, wait_s: float = WAIT_S) -> Iterator[bool]:
    """Hold `<entry>.lock` for the block. Yields whether it is held: False where no lock can be had (no fcntl, an
    unwritable folder, a filesystem without locks) or another process kept it past wait_s; the caller goes on
    without it, as it did before there was one."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield False
        return
    try:
        handle = open(f"{entry}.lock", "ab")
    except OSError:
        yield False
        return
    with handle:
        held = _take(handle, fcntl, Path(entry).name, wait_s)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _take(handle, fcntl, name: str, wait_s: float) -> bool:
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning("specdec: %s has been busy in another process for %.0f s; going on without waiting",
                            name, wait_s)
                return False
            if not said:
                log.info("specdec: waiting for another process making %s", name)
                said = True
            time.sleep(0.1)
        except OSError:  # a filesystem without locks
            return False
