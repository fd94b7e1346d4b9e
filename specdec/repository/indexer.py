"""Keep a repository index in step with an editor's workspace, from one background thread at low priority.

The editor's thread (an LSP server's event loop) only records what happened: a folder opened,
a document changed or closed, a completion accepted. The indexer's thread does the work: it
selects, reads and tokenizes files, and updates the index, which the decode thread keeps
querying meanwhile (repo_index.py never makes a reader wait). The thread runs at nice 10
(Linux), waits between batches while `idle` is clear (the server clears it while a completion
runs), and debounces edits, so typing costs one re-tokenization of the file per pause, not
per keystroke.

Edited text wins over the disk: a document's buffer is re-applied after any rebuild until
it is closed, and a closed document is read from disk again. The file filter decides every
update too, so a secret typed into a file takes the file out of the index.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

from specdec.repository.build import BuildReport, build_index, document_key, tokenize
from specdec.repository.files import MAX_BYTES, document_reason

log = logging.getLogger("specdec.index")

DEBOUNCE_SECONDS = 1.0  # an edited document is re-indexed once it has been still this long
ACCEPTED_DOCUMENTS = 256  # accepted completions kept as documents (the oldest make room first)
ACCEPTED_CONTEXT_CHARS = 1000  # text before an accepted completion kept with it, so a context can match into it


class _Stopped(Exception):
    pass


class WorkspaceIndexer:
    def __init__(self, index, idle: threading.Event | None = None, debounce: float = DEBOUNCE_SECONDS,
                 max_bytes: int = MAX_BYTES):
        self.index = index  # a RepoIndex
        self.idle = idle if idle is not None else threading.Event()
        if idle is None:
            self.idle.set()
        self.debounce = debounce
        self.max_bytes = max_bytes
        self.state = "waiting for the tokenizer"
        self.reports: dict[str, BuildReport] = {}  # root -> its latest build
        self.last_build: BuildReport | None = None  # the latest build of any root
        self.updates = 0  # documents re-indexed (or removed) after an edit, save or close
        self.accepted_documents = 0
        self.errors = 0
        self.last_error = ""
        self._cond = threading.Condition()
        self._roots: list[str] = []
        self._to_build: list[str] = []
        self._pending: dict[str, tuple[float, str | None]] = {}  # key -> (when, text; None: read the disk)
        self._edited: dict[str, str] = {}  # key -> the editor's text, until the document is closed
        self._accepted: list[str] = []
        self._accepted_count = 0
        self._max_tokens: int | None = None  # a new cap to apply
        self._tokenizer = None
        self._tokenizer_identity = None
        self._clear = False
        self._closed = False
        self._clear_on_stop = False
        self._thread = threading.Thread(target=self._run, name="specdec-index", daemon=True)
        self._thread.start()

    # -- called from the editor's thread: record and return -------------------------------------------
    def open_root(self, root: str | Path) -> None:
        key = document_key(root)
        with self._cond:
            if key not in self._roots:
                self._roots.append(key)
                self._to_build.append(key)
                self._cond.notify()

    def close_root(self, root: str | Path) -> None:
        key = document_key(root)
        with self._cond:
            if key in self._roots:
                self._roots.remove(key)
                self._to_build = [r for r in self._to_build if r != key]
                self._pending[key + os.sep] = (0.0, None)  # a folder's documents leave the index
                self._cond.notify()

    def update(self, path: str | Path, text: str) -> None:
        """A document's text changed (didChange, didSave): re-indexed once it has been still `debounce` seconds."""
        key = document_key(path)
        with self._cond:
            if self._root_of(key):
                self._edited[key] = text
                self._pending[key] = (time.monotonic(), text)
                self._cond.notify()

    def revert(self, path: str | Path) -> None:
        """The document was closed: its file on disk is the truth again."""
        key = document_key(path)
        with self._cond:
            if self._edited.pop(key, None) is not None or key in self._pending:
                self._pending[key] = (time.monotonic(), None)
                self._cond.notify()

    def accepted(self, context: str, completion: str) -> None:
        """The user accepted a completion: it becomes a document, with the end of the text before it."""
        context = context[-ACCEPTED_CONTEXT_CHARS:]
        if "\n" in context:
            context = context[context.index("\n") + 1 :]  # from a line's start, as in a file
        with self._cond:
            self._accepted.append(context + completion)
            self._cond.notify()

    def set_tokenizer(self, tokenizer) -> None:
        """The models' tokenizer (indexing waits for it); another tokenizer than before rebuilds the index."""
        identity = (getattr(tokenizer, "name_or_path", ""), len(tokenizer), type(tokenizer).__name__)
        with self._cond:
            if identity == self._tokenizer_identity:
                self._tokenizer = tokenizer
                return
            rebuild = self._tokenizer_identity is not None
            self._tokenizer, self._tokenizer_identity = tokenizer, identity
            if rebuild:  # token ids of another vocabulary: start over
                self._to_build = list(self._roots)
                self._clear = True
            self._cond.notify()

    def set_max_tokens(self, max_tokens: int) -> None:
        with self._cond:
            self._max_tokens = max_tokens
            self._cond.notify()

    def stop(self, timeout: float | None = None, clear: bool = False) -> None:
        """End the thread (at its next pause: a batch, a file); clear: then empty the index, freeing its memory."""
        with self._cond:
            self._closed = True
            self._clear_on_stop = clear
            self._cond.notify()
        self._thread.join(timeout)

    def stats(self) -> dict:
        s = self.index.stats()
        reports = list(self.reports.values())
        return {"state": self.state, "roots": list(self._roots), "files": sum(r.files for r in reports),
                "skipped": sum(r.skipped for r in reports), "over_cap": sum(r.over_cap for r in reports),
                "documents": s.documents, "tokens": s.tokens, "bytes": s.bytes, "max_tokens": s.max_tokens,
                "segments": s.segments, "build_seconds": round(sum(r.seconds for r in reports), 3),
                "last_build_seconds": round(self.last_build.seconds, 3) if self.last_build else 0.0,
                "refused": s.refused, "evicted": s.evicted, "updates": self.updates,
                "accepted": self.accepted_documents, "errors": self.errors, "last_error": self.last_error}

    # -- the indexer's thread ----------------------------------------------------------------------------
    def _root_of(self, key: str) -> str | None:
        roots = [r for r in self._roots if key.startswith(r.rstrip(os.sep) + os.sep)]
        return max(roots, key=len) if roots else None

    def _due(self, now: float) -> tuple[dict[str, str | None], float | None]:
        """Pending documents still for `debounce` seconds, and how long until the next one is."""
        due, wait = {}, None
        for key, (when, text) in self._pending.items():
            left = when + self.debounce - now
            if left <= 0:
                due[key] = text
            else:
                wait = left if wait is None else min(wait, left)
        return due, wait

    def _run(self) -> None:
        try:
            self._work()
        finally:
            self.state = "stopped"
            if self._clear_on_stop:
                self.index.clear()

    def _work(self) -> None:
        if sys.platform.startswith("linux"):  # per-thread there; elsewhere it would renice the whole server
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            except OSError:
                pass
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    due, wait = self._due(time.monotonic())
                    if self._tokenizer is not None and (self._max_tokens is not None or self._to_build or due
                                                        or self._accepted):
                        break
                    self._cond.wait(wait)
                tokenizer, builds, accepted = self._tokenizer, self._to_build, self._accepted
                max_tokens, clear = self._max_tokens, self._clear
                self._to_build, self._accepted, self._max_tokens, self._clear = [], [], None, False
                for key in due:
                    del self._pending[key]
                edited = dict(self._edited)
            try:
                if clear:
                    self.index.clear()
                if max_tokens is not None and not self.index.set_max_tokens(max_tokens):
                    builds = list(dict.fromkeys(builds + self._roots))  # it was over the new cap: refill it
                for root in builds:
                    self._build(root, tokenizer, edited)
                self._apply(due, tokenizer)
                self._add_accepted(accepted, tokenizer)
                self.state = "ready"
            except _Stopped:
                return
            except Exception as exc:  # the index must never take the server down; say why it stopped
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.state = "failed"
                log.exception("repository index update failed")

    def _pause(self) -> None:
        while not self.idle.wait(0.5):
            if self._closed:
                raise _Stopped
        if self._closed:
            raise _Stopped

    def _build(self, root: str, tokenizer, edited: dict[str, str]) -> None:
        if not Path(root).is_dir():
            return
        self.state = "building"
        report = build_index(root, tokenizer, self.index, self.max_bytes, self._pause)
        self.reports[root] = self.last_build = report
        log.info("indexed %s: %d files, %d tokens, %.1f s", root, report.files, report.tokens, report.seconds)
        inside = {key: text for key, text in edited.items() if key.startswith(root.rstrip(os.sep) + os.sep)}
        self._apply(inside, tokenizer, count=False)  # what the editor holds wins over what the disk held

    def _apply(self, documents: dict[str, str | None], tokenizer, count: bool = True) -> None:
        """Re-index edited documents (text) or closed ones (None: from disk); removed where the filter says no."""
        adds: list[tuple[str, str]] = []
        for key, text in documents.items():
            if key.endswith(os.sep):  # a closed folder: everything under it goes
                self.index.remove_many([d for d in self.index.keys() if d.startswith(key)])
                continue
            root = self._root_of(key)
            if root is None:
                continue
            self._pause()
            if text is None:
                try:
                    text = Path(key).read_text(encoding="utf-8", errors="replace") if Path(key).is_file() else ""
                except OSError:
                    text = ""
            reason = document_reason(Path(root), Path(key).relative_to(root), text, self.max_bytes) if text else "gone"
            if reason:
                self.index.remove(key)
            else:
                adds.append((key, text))
            self.updates += count
        if adds:
            self.index.add_many(list(zip((k for k, _ in adds), tokenize(tokenizer, [t for _, t in adds]))))

    def _add_accepted(self, texts: list[str], tokenizer) -> None:
        for text, ids in zip(texts, tokenize(tokenizer, texts)):
            self._accepted_count += 1
            self.index.add(f"accepted:{self._accepted_count}", ids, evictable=True)
            if self._accepted_count > ACCEPTED_DOCUMENTS:
                self.index.remove(f"accepted:{self._accepted_count - ACCEPTED_DOCUMENTS}")
            self.accepted_documents += 1
