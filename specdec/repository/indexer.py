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
update too, so a secret typed into a file takes the file out of the index, and an accepted
completion is indexed only under its document's rules (the whole buffer and its path). Nothing
outside the workspace roots, symlinks resolved, is read or indexed.

Another tokenizer empties the index and stamps it for the new ids in one step (RepoIndex.restamp),
a build under way for the old one stops at its next pause, and writes of old ids are refused, so
no query drafts from documents of the other tokenizer. `wait_settled()` says when everything
recorded so far (the rebuild for a new tokenizer included) is in the index.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from specdec.engine.drafters.repo_index import vocabulary_of
from specdec.repository.build import BuildReport, build_index, document_key, resolved_key, tokenize
from specdec.repository.files import MAX_BYTES, document_reason, read_file, secret_reason

log = logging.getLogger("specdec.index")

DEBOUNCE_SECONDS = 1.0  # an edited document is re-indexed once it has been still this long
ACCEPTED_DOCUMENTS = 256  # accepted completions kept as documents (the oldest make room first)
ACCEPTED_CONTEXT_CHARS = 1000  # text before an accepted completion kept with it, so a context can match into it


class _Stopped(Exception):
    pass


class _Superseded(Exception):
    """Another tokenizer arrived: the work under way (in the old one's ids) stops; everything is rebuilt."""


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
        self.paused = False  # waiting for `idle` (a completion runs)
        self.reports: dict[str, BuildReport] = {}  # root -> its latest build
        self.last_build: BuildReport | None = None  # the latest build of any root
        self.updates = 0  # documents re-indexed (or removed) after an edit, save or close
        self.accepted_documents = 0
        self.refused_accepted = 0  # accepted completions the file filter kept out (a secret, outside the roots...)
        self.rebuilds = 0  # tokenizer switches applied (the index emptied and refilled in the new ids)
        self.errors = 0
        self.last_error = ""
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the worker waits here for work
        self._changed = threading.Condition(lock)  # wait_settled() waits here for the worker's progress
        self._busy = False
        self._roots: list[str] = []
        self._to_build: list[str] = []
        self._pending: dict[str, tuple[float, str | None]] = {}  # key -> (when, text; None: read the disk)
        self._edited: dict[str, object] = {}  # key -> the editor's text (or its snapshot), until the document closes
        self._accepted: list[tuple[str | None, str, bool]] = []  # (document key, text, judged) not yet indexed
        self._kept: OrderedDict[str, str] = OrderedDict()  # accepted documents' key -> text (re-added on a rebuild)
        self._accepted_count = 0
        self._max_tokens: int | None = None  # a new cap to apply
        self._tokenizer = None
        self._tokenizer_identity = None
        self._vocabulary = None  # the tokenizer of the work under way (a newer one supersedes it at a pause)
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

    def update(self, path: str | Path, text) -> None:
        """A document's text changed (didChange, didSave): re-indexed once it has been still `debounce` seconds.

        `text` is a str or an immutable snapshot whose str() is the text (the server's documents): it becomes one
        string here, in the indexer's thread, once it is due, not on the editor's thread at every keystroke."""
        key = resolved_key(path)
        with self._cond:
            if key is not None and self._root_of(key):
                self._edited[key] = text
                self._pending[key] = (time.monotonic(), text)
                self._cond.notify()

    def revert(self, path: str | Path) -> None:
        """The document was closed: its file on disk is the truth again."""
        key = resolved_key(path)
        with self._cond:
            if key is not None and (self._edited.pop(key, None) is not None or key in self._pending):
                self._pending[key] = (time.monotonic(), None)
                self._cond.notify()

    def accepted(self, context: str, completion: str, document: str | Path | None = None) -> None:
        """The user accepted a completion in `document` (a path): it becomes a document, with the end of the text
        before it, if the file filter would index that document (judged on the indexer's thread)."""
        context = context[-ACCEPTED_CONTEXT_CHARS:]
        if "\n" in context:
            context = context[context.index("\n") + 1 :]  # from a line's start, as in a file
        key = resolved_key(document) if document else None  # None: judged as outside every workspace
        with self._cond:
            self._accepted.append((key, context + completion, False))
            self._cond.notify()

    def set_tokenizer(self, tokenizer) -> None:
        """The models' tokenizer (indexing waits for it); another tokenizer than before rebuilds the index."""
        identity = vocabulary_of(tokenizer)
        with self._cond:
            self._tokenizer, self._tokenizer_identity = tokenizer, identity  # the worker compares it to the stamp
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
            self._cond.notify_all()
            self._changed.notify_all()
        self._thread.join(timeout)

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until everything recorded so far is in the index (builds, edits, closes, accepted completions, a
        new cap, the rebuild for a new tokenizer); False if `timeout` passed first or the indexer stopped."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or self._settled(), timeout)
            return self._settled() and not self._closed

    def _settled(self) -> bool:  # under the lock
        return (self._tokenizer is not None and not self._busy and not self._to_build and not self._pending
                and not self._accepted and self._max_tokens is None
                and self.index.vocabulary == self._tokenizer_identity)

    def stats(self) -> dict:
        s = self.index.stats()
        reports = list(self.reports.values())
        with self._cond:
            settled = self._settled()
        return {"state": self.state, "roots": list(self._roots), "files": sum(r.files for r in reports),
                "skipped": sum(r.skipped for r in reports), "over_cap": sum(r.over_cap for r in reports),
                "documents": s.documents, "tokens": s.tokens, "bytes": s.bytes, "max_tokens": s.max_tokens,
                "segments": s.segments, "build_seconds": round(sum(r.seconds for r in reports), 3),
                "last_build_seconds": round(self.last_build.seconds, 3) if self.last_build else 0.0,
                "refused": s.refused, "evicted": s.evicted, "updates": self.updates,
                "accepted": self.accepted_documents, "accepted_refused": self.refused_accepted,
                "rebuilds": self.rebuilds, "settled": settled, "errors": self.errors, "last_error": self.last_error}

    # -- the indexer's thread ----------------------------------------------------------------------------
    def _root_of(self, key: str) -> str | None:
        if "\0" in key:  # no file has this name (a URI with %00): not part of any workspace
            return None
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
            with self._changed:
                self._changed.notify_all()

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
                    if self._tokenizer is not None and (
                            self._max_tokens is not None or self._to_build or due or self._accepted
                            or self.index.vocabulary != self._tokenizer_identity):
                        break
                    self._cond.wait(wait)
                tokenizer, vocabulary = self._tokenizer, self._tokenizer_identity
                builds, accepted, max_tokens = self._to_build, self._accepted, self._max_tokens
                self._to_build, self._accepted, self._max_tokens = [], [], None
                for key in due:
                    del self._pending[key]
                edited = dict(self._edited)
                self._busy = True
            self._vocabulary = vocabulary  # what _pause compares a newer tokenizer with
            try:
                previous = self.index.vocabulary
                if self.index.restamp(vocabulary):  # another tokenizer (or the first): start over in its ids
                    self.rebuilds += previous is not None
                    builds = list(self._roots)
                    accepted = [(None, text, True) for text in self._kept.values()] + accepted
                    self._kept.clear()
                if max_tokens is not None and not self.index.set_max_tokens(max_tokens):
                    builds = list(dict.fromkeys(builds + self._roots))  # it was over the new cap: refill it
                    accepted = [(None, text, True) for text in self._kept.values()] + accepted
                    self._kept.clear()
                for root in builds:
                    self._build(root, tokenizer, vocabulary, edited)
                self._apply(due, tokenizer, vocabulary)
                self._add_accepted(accepted, tokenizer, vocabulary)
                self.state = "ready"
            except _Stopped:
                return
            except _Superseded:  # the next round sees the new tokenizer and rebuilds everything; completions
                with self._cond:  # accepted but not yet judged wait for it (those indexed are re-added from _kept)
                    self._accepted = accepted + self._accepted
            except Exception as exc:  # the index must never take the server down; say why it stopped
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.state = "failed"
                log.exception("repository index update failed")
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _pause(self) -> None:
        """Between files and batches: wait while a completion runs; stop for close() or another tokenizer."""
        self.paused = not self.idle.is_set()
        try:
            while True:
                if self._closed:
                    raise _Stopped
                if self._tokenizer_identity != self._vocabulary:
                    raise _Superseded
                if self.idle.wait(0.5):
                    break
        finally:
            self.paused = False
        if self._closed:
            raise _Stopped

    def _build(self, root: str, tokenizer, vocabulary, edited: dict[str, str]) -> None:
        try:
            if not Path(root).is_dir():
                return
            self.state = "building"
            report = build_index(root, tokenizer, self.index, self.max_bytes, self._pause, vocabulary=vocabulary)
        except (_Stopped, _Superseded):
            raise
        except Exception as exc:  # one root that cannot be read leaves the others indexed
            self.errors += 1
            self.last_error = f"{root}: {type(exc).__name__}: {exc}"
            log.warning("repository index: %s not indexed: %s", root, exc)
            return
        self.reports[root] = self.last_build = report
        log.info("indexed %s: %d files, %d tokens, %.1f s", root, report.files, report.tokens, report.seconds)
        inside = {key: text for key, text in edited.items() if key.startswith(root.rstrip(os.sep) + os.sep)}
        self._apply(inside, tokenizer, vocabulary, count=False)  # what the editor holds wins over what the disk held

    def _read(self, root: str, key: str) -> str:
        """A document's text on disk ("" if gone or unreadable), never from outside its root."""
        try:
            return read_file(Path(root), Path(key).relative_to(root)).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def _apply(self, documents: dict[str, str | None], tokenizer, vocabulary, count: bool = True) -> None:
        """Re-index edited documents (text) or closed ones (None: from disk); removed where the filter says no."""
        adds: list[tuple[str, str]] = []
        applied = 0
        for key, text in documents.items():
            if key.endswith(os.sep):  # a closed folder: everything under it goes
                self.index.remove_many([d for d in self.index.keys() if d.startswith(key)])
                continue
            root = self._root_of(key)
            if root is None:
                continue
            self._pause()
            if text is None:
                text = self._read(root, key)
            else:
                text = str(text)  # a document snapshot (see update)
            reason = document_reason(Path(root), Path(key).relative_to(root), text, self.max_bytes) if text else "gone"
            if reason:
                self.index.remove(key)
            else:
                adds.append((key, text))
            applied += count
        if adds:
            self.index.add_many(list(zip((k for k, _ in adds), tokenize(tokenizer, [t for _, t in adds]))),
                                vocabulary=vocabulary)
        self.updates += applied  # once they are in: a reader of the count sees them in the index

    def _accepted_reason(self, key: str | None, text: str) -> str | None:
        """The file filter's rules for an accepted completion's text: those of its whole document (the buffer, or
        the file on disk) and its path, and the text itself must hold no secret."""
        root = self._root_of(key) if key else None
        if root is None:
            return "outside the workspace"
        rel = Path(key).relative_to(root)
        whole = self._edited.get(key)
        whole = self._read(root, key) if whole is None else str(whole)  # a document snapshot (see update)
        return document_reason(Path(root), rel, whole or text, self.max_bytes) or secret_reason(rel.name, text)

    def _add_accepted(self, entries: list[tuple[str | None, str, bool]], tokenizer, vocabulary) -> None:
        """Judge and index accepted completions, taking each from `entries` once done (what is left there when
        another tokenizer interrupts waits for the next round). judged: a rebuild re-adds one indexed before."""
        while entries:
            key, text, judged = entries[0]
            if not judged:
                self._pause()
                reason = self._accepted_reason(key, text)
                if reason:
                    entries.pop(0)
                    self.refused_accepted += 1
                    log.info("accepted completion not indexed: %s", reason)
                    continue
            ids = tokenize(tokenizer, [text])[0]
            entries.pop(0)
            self._accepted_count += 1
            name = f"accepted:{self._accepted_count}"
            if self.index.add_many([(name, ids)], evictable=True, vocabulary=vocabulary)[0]:
                self._kept[name] = text
            old = f"accepted:{self._accepted_count - ACCEPTED_DOCUMENTS}"
            if self._accepted_count > ACCEPTED_DOCUMENTS:
                self.index.remove(old)
            self._kept.pop(old, None)
            self.accepted_documents += 1
