"""Every process a test starts is ended, whatever happens: found by a mark in its environment.

A test's children inherit os.environ, and so do their children, however they were started: an
editor's language server (Neovim starts it detached, in a session of its own, so no process
group reaches it), code-server's extension host, a server's training subprocess. A mark set in
the environment for the test's length (MARK) therefore names all of them, and `end_marked` ends
every process that carries it: SIGTERM, then SIGKILL for what is still there after a grace
period. Linux (/proc); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

MARK = "SPECDEC_TEST_PROCESS_MARK"


def marked(mark: str) -> list[int]:
    """The live processes (not this one) whose environment holds MARK=mark."""
    needle = f"{MARK}={mark}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes() + b"\0":
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def end_marked(mark: str, grace_s: float = 10.0) -> list[int]:
    """End every process carrying the mark (SIGTERM, then SIGKILL after grace_s); returns the pids found."""
    found = marked(mark)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in found:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and marked(mark):
            time.sleep(0.05)
        if not marked(mark):
            break
    return found
