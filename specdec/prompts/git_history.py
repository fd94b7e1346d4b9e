"""A file's recent edits from its repository's history (issue #51 item 1): the hunks of the last commits that
touched it, as next-edit prompts show recent edits (specdec/prompts/next_edit.py's Hunk). Read with `git log -p`,
bounded in commits, hunks, characters and time; no git, no repository or a slow one gives no hunks, never an
error: the document's own edits still make the prompt."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.prompts.next_edit import Hunk, parse_unified_diff

log = logging.getLogger("specdec.server")

COMMITS = 3  # the last commits that touched the file
MAX_HUNKS = 8  # the most recent kept
MAX_HUNK_CHARS = 4000  # a larger hunk (a generated block, a move) is no edit to imitate
MAX_OUTPUT = 1 << 20  # bytes of `git log -p` read at most
TIMEOUT_S = 2.0


def commit_hunks(path: str | Path, commits: int = COMMITS, max_hunks: int = MAX_HUNKS) -> list[Hunk]:
    """The hunks of the last `commits` commits that touched `path`, the oldest first, named by the path relative to
    the repository's root as the diff has it; [] outside a git repository or on any failure."""
    file = Path(path)
    if not file.parent.is_dir():
        return []
    command = ["git", "-C", str(file.parent), "log", "-p", "--no-color", "--no-ext-diff", "--format=",
               f"-n{max(1, commits)}", "--", file.name]
    try:
        done = subprocess.run(command, capture_output=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("no commit history for %s: %s", file.name, exc)
        return []
    if done.returncode != 0 or not done.stdout.strip():
        return []
    text = done.stdout[:MAX_OUTPUT].decode("utf-8", errors="replace")
    if len(done.stdout) > MAX_OUTPUT:
        text = text[: text.rfind("\ndiff --git")] if "\ndiff --git" in text else ""
    try:
        hunks = parse_unified_diff(text, f"git log -p {file.name}")
    except SpecdecError as exc:
        log.info("no commit history for %s: %s", file.name, exc)
        return []
    # git log lists the newest commit first: the prompt wants the oldest first, the most recent last
    kept = [h for h in hunks if max(len(h.original), len(h.updated)) <= MAX_HUNK_CHARS]
    return list(reversed(kept))[-max_hunks:]
