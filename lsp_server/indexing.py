"""The repository index in the server: a background indexer (specdec/repository/indexer.py) on while a strategy
reads the index, fed the workspace's folders, the editor's documents and the completions the user accepted."""

from __future__ import annotations

from urllib.parse import urlparse

from lsp_server.cursor import uri_path
from lsp_server.snapshot import open_document
from lsp_server.documents import text_of


class Indexing:
    def __init__(self, server):
        self.server = server
        self.indexer = None  # specdec.repository.indexer.WorkspaceIndexer while the repository index is on

    def sync(self) -> None:
        """Start, resize or stop the background indexer as the settings say: on while a strategy reads it."""
        server = self.server
        host, settings = server.host, server.settings
        index = host.index_for(settings)
        if index is None:
            if self.indexer is not None:  # its thread empties the index as it ends; a later start makes a new one
                self.indexer.stop(timeout=0, clear=True)
                self.indexer, host.repo_index = None, None
            return
        if self.indexer is not None and self.indexer.index is not index:  # another engine's host: its own index
            self.indexer.stop(timeout=0, clear=True)
            self.indexer = None
        if self.indexer is None:
            from specdec.repository.indexer import WorkspaceIndexer

            self.indexer = WorkspaceIndexer(index, idle=host.idle)
            for root in server.workspace_roots:
                self.indexer.open_root(root)
            if host.ready and host.tokenizer() is not None:
                self.indexer.set_tokenizer(host.tokenizer())
        if settings.repo_index_max_tokens != index.max_tokens:
            self.indexer.set_max_tokens(settings.repo_index_max_tokens)

    def set_tokenizer(self, tokenizer) -> None:
        """The models are ready: the indexer waited for their tokenizer."""
        if self.indexer is not None:
            self.indexer.set_tokenizer(tokenizer)

    def stats(self) -> dict | None:
        """The indexer's figures (specdec/stats, the Prometheus gauges); None while the index is off."""
        return self.indexer.stats() if self.indexer is not None else None

    def accepted(self, suggestion) -> None:
        if self.indexer is not None:
            self.indexer.accepted(suggestion.context, suggestion.text, suggestion.document or None)

    def document(self, uri: str, closed: bool = False) -> None:
        """didChange/didSave: the buffer is re-indexed (debounced, in the background); didClose: the disk's text."""
        if self.indexer is None or urlparse(uri).scheme not in ("file", ""):
            return
        if closed:
            self.indexer.revert(uri_path(uri))
            return
        document = open_document(self.server, uri)
        if document is not None:  # a snapshot: made into one string by the indexer's thread, once it is due
            self.indexer.update(uri_path(uri), text_of(document))

    def folders_changed(self, removed: set[str], added: list[str]) -> None:
        if self.indexer is not None:
            for root in removed:
                self.indexer.close_root(root)
            for root in added:
                self.indexer.open_root(root)
