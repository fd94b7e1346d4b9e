"""What a request handler reads of the server, taken once when the request arrives (ruff's `DocumentSnapshot`): the
document and the other open ones as their texts were then (ChunkedText is immutable), the client's position
encoding, the settings, the workspace folders, and what the host says of the prompt. A handler that awaits keeps
reading the snapshot, never the live server, so an edit or a settings change mid-request changes nothing of it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import unquote

from lsprotocol import types

from lsp_server.documents import ChunkedText, text_of
from lsp_server.settings import Settings

log = logging.getLogger("specdec.server")
OTHERS = 8  # the open documents, opened last, whose heads may go into the prompt


@dataclass(frozen=True)
class OpenDocument:
    uri: str
    language_id: str
    text: ChunkedText


@dataclass(frozen=True)
class Snapshot:
    document: OpenDocument
    others: tuple[OpenDocument, ...]  # the OTHERS opened last, this one left out
    encoding: str  # the client's position encoding
    settings: Settings
    workspace_roots: tuple[str, ...]
    template: object  # the host's FimTemplate, or None before a load
    remote: bool  # a remote engine: other files go as its chunks, not as the local prompt's snippets
    indexed: bool  # the repository index is on: the request names its document key


def open_document(server, uri: str):
    """The open document of the URI (as the client spelt it, or unquoted), or None."""
    documents = server.workspace.text_documents
    return documents.get(uri) or documents.get(unquote(uri))


def take(server, uri: str) -> Snapshot | None:
    """The snapshot of an open document (open_document's); None when it is not open."""
    this = open_document(server, uri)
    if this is None:
        log.info("no answer: %s is not open", uri)
        return None
    opened = list(server.workspace.text_documents.items())[-OTHERS:]
    return Snapshot(OpenDocument(uri, this.language_id or "", text_of(this)),
                    tuple(OpenDocument(u, d.language_id or "", text_of(d)) for u, d in opened if d is not this),
                    server.server_capabilities.position_encoding or types.PositionEncodingKind.Utf16,
                    server.settings, tuple(server.workspace_roots), server.host.template(), server.host.remote,
                    server.indexing.indexer is not None)
