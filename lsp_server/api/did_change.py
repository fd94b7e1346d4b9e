"""textDocument/didChange (pygls applies the edit first): the changes go into the document's edit history (for
next edits), and the buffer is re-indexed, debounced, in the background."""

from __future__ import annotations

from lsprotocol import types

from lsp_server.snapshot import open_document
from lsp_server.documents import Document

METHOD = types.TEXT_DOCUMENT_DID_CHANGE


def handle(ls, params: types.DidChangeTextDocumentParams):
    uri = params.text_document.uri
    document = open_document(ls, uri)
    if isinstance(document, Document):
        for before, start, end, inserted in document.take_changes():
            if start is None:
                ls.edits.replaced(uri, before)
            else:
                ls.edits.change(uri, before, start, end, inserted)
    ls.indexing.document(uri)
