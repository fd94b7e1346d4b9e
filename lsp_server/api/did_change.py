"""textDocument/didChange (pygls applies the edit first): the buffer is re-indexed, debounced, in the background."""

from __future__ import annotations

from lsprotocol import types

METHOD = types.TEXT_DOCUMENT_DID_CHANGE


def handle(ls, params: types.DidChangeTextDocumentParams):
    ls.indexing.document(params.text_document.uri)
