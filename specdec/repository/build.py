"""Fill a repository index from a folder: the one file filter, batched tokenization, bounded memory.

Files are read and tokenized a batch at a time and handed to the index in flushes of about
`flush_tokens`, so memory holds one flush of token ids beside the index, and the index is
usable (with what it has) long before the last file is read. Once the index refuses a file
for its cap with less than 5% of it left, reading stops: nearly every later file would be
refused too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.repository.files import MAX_BYTES, FileSelection, read_file, select

BATCH_FILES = 64  # files per tokenizer call
BATCH_CHARS = 2_000_000  # characters per tokenizer call, whatever the file count
FLUSH_TOKENS = 1_000_000  # token ids handed to the index at once (one new segment)


def document_key(path: str | Path) -> str:
    """The index's key for a file: its real absolute path, the same from a folder walk and from an editor's URI.
    A path that cannot be resolved (a NUL in it, from a URI's %00; a link that may not be read) keeps its
    absolute form, rather than raising: the indexer never indexes it (resolved_key)."""
    return resolved_key(path) or os.path.abspath(path)


def resolved_key(path: str | Path) -> str | None:
    """document_key of a path that resolves, else None (no file can be read through it)."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return None


@dataclass
class BuildReport:
    root: str = ""
    files: int = 0  # indexed
    skipped: int = 0  # refused by the file filter (secrets, binaries, generated, vendored, ...)
    over_cap: int = 0  # selected but not indexed: the index was full
    tokens: int = 0
    bytes: int = 0  # the index's arrays after the build
    seconds: float = 0.0
    select_seconds: float = 0.0
    tokenize_seconds: float = 0.0
    index_seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens: the same ids a prompt's text gets."""
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def build_index(root: str | Path, tokenizer, index, max_bytes: int = MAX_BYTES, pause: Callable[[], None] | None = None,
                selection: FileSelection | None = None, flush_tokens: int = FLUSH_TOKENS,
                progress: Callable[[int, int], None] | None = None, vocabulary=None) -> BuildReport:
    """Select the repository's files (or use `selection`), tokenize them and add them to `index` (a RepoIndex).

    pause: called between batches and files (a background caller waits there while a completion runs).
    progress: called with (files done, files selected) after each batch.
    vocabulary: the tokenizer's stamp (repo_index.vocabulary_of), for an index that checks whose ids it holds.
    """
    started = time.perf_counter()
    root = Path(root).resolve()
    report = BuildReport(str(root))
    if selection is None:
        selection = select(root, max_bytes, pause)
    report.select_seconds = time.perf_counter() - started
    report.skipped = len(selection.skipped)
    files = selection.files
    pending: list[tuple[str, list[int]]] = []
    pending_tokens = 0
    full = False

    def flush() -> None:
        nonlocal pending, pending_tokens, full
        if not pending:
            return
        t0 = time.perf_counter()
        fitted = index.add_many(pending, vocabulary=vocabulary)
        report.index_seconds += time.perf_counter() - t0
        report.files += sum(fitted)
        report.tokens += sum(len(ids) for (_, ids), ok in zip(pending, fitted) if ok)
        report.over_cap += fitted.count(False)
        stats = index.stats()
        full = not all(fitted) and stats.max_tokens - stats.stored_tokens < stats.max_tokens // 20
        pending, pending_tokens = [], 0

    i = 0
    while i < len(files) and not full:
        if pause is not None:
            pause()
        batch, chars = [], 0
        while i < len(files) and len(batch) < BATCH_FILES and chars < BATCH_CHARS:
            try:
                text = read_file(root, files[i]).decode("utf-8", "replace")
            except OSError:  # deleted, unreadable or moved out of the root since it was selected
                text = ""
                report.skipped += 1
            if text:
                batch.append((document_key(root / files[i]), text))
                chars += len(text)
            i += 1
        t0 = time.perf_counter()
        ids = tokenize(tokenizer, [text for _, text in batch])
        report.tokenize_seconds += time.perf_counter() - t0
        for (key, _), tokens in zip(batch, ids):
            pending.append((key, tokens))
            pending_tokens += len(tokens)
        if pending_tokens >= flush_tokens:
            flush()
        if progress is not None:
            progress(i, len(files))
    flush()
    report.over_cap += len(files) - i  # never read: the index was full
    report.bytes = index.stats().bytes
    report.seconds = time.perf_counter() - started
    return report
