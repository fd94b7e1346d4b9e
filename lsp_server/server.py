"""The pygls language server: LSP 3.18 inline completion (and plain completion) over specdec.

`SpecdecServer` holds the state the handlers share, each piece in its own module: the open documents (pygls'
workspace of documents.py's chunked texts), the settings and the models they load (configuration.py), the host
that computes completions (hosts.py), the scheduler (service.py), the repository indexer (indexing.py) and the
fine-tune child process (finetune_child.py). The handlers, one module per LSP method, are in api/; `create_server`
builds the server and hands it to api/router.py; lsp_server/transport.py runs it.

torch and transformers are imported only when the models load, in the background after `initialized`, so
`initialize` answers at once. Until the models are ready, completion requests answer empty immediately.
"""

from __future__ import annotations

import asyncio

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from lsp_server.api import router
from lsp_server.configuration import Configuration
from lsp_server.edit_history import EditHistory
from lsp_server.events import CompletionObserver
from lsp_server.finetune_child import Finetuning
from lsp_server.hosts import new_host
from lsp_server.indexing import Indexing
from lsp_server.metrics import MetricsStore
from lsp_server.service import CompletionService
from lsp_server.settings import Settings


SUGGESTION_READY = "specdec/suggestionReady"


class SpecdecServer(LanguageServer):
    def __init__(self, metrics: MetricsStore | None = None):
        super().__init__("specdec", "0.1.0", max_workers=4)
        self.settings = Settings()
        self.metrics = metrics or MetricsStore()
        self.workspace_roots: list[str] = []
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop, once `initialize` came
        self.host = new_host("local", self.show_message)
        self.service = CompletionService(self.host, self.metrics, self.settings)
        self.indexing = Indexing(self)
        self.service.events.subscribe(Editor(self))
        self.edits = EditHistory()  # each open document's recent edits, for next-edit prompts
        self.metrics.index_stats = self.indexing.stats  # Prometheus
        self.configuration = Configuration(self)
        self.finetuning = Finetuning(self)

    def show_message(self, kind: types.MessageType, message: str) -> None:
        """window/showMessage from any thread (a host's warnings come from its worker)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.window_show_message, types.ShowMessageParams(kind, f"specdec: {message}"))


class Editor(CompletionObserver):
    """The server's part of the completion events: what the user took goes into the repository index; a suggestion
    answered with its first lines that is whole now is `specdec/suggestionReady` to the editor, which may ask again
    at the cursor (the cache answers at once): VS Code's client does; other editors get it at the next keystroke
    that matches it (type-ahead)."""

    def __init__(self, server: SpecdecServer):
        self.server = server

    def accepted(self, suggestion) -> None:
        self.server.indexing.accepted(suggestion)

    def ready(self, uri: str) -> None:
        self.server.protocol.notify(SUGGESTION_READY, {"uri": uri})


def create_server(metrics: MetricsStore | None = None, settings: Settings | None = None) -> SpecdecServer:
    """settings: the base the editor's options apply to (`specdec serve --engine KIND --engine-url URL`)."""
    server = SpecdecServer(metrics)
    if settings is not None:
        server.settings = server.service.settings = settings
    router.register(server)
    return server
