"""textDocument/didSave: the buffer is re-indexed, debounced, in the background."""

from __future__ import annotations

from lsprotocol import types

METHOD = types.TEXT_DOCUMENT_DID_SAVE


def handle(ls, params: types.DidSaveTextDocumentParams):
    ls.indexing.document(params.text_document.uri)
