"""textDocument/didClose: the document's text leaves the scheduler's memory and its edit history; the index goes
back to the disk's."""

from __future__ import annotations

from lsprotocol import types

METHOD = types.TEXT_DOCUMENT_DID_CLOSE


def handle(ls, params: types.DidCloseTextDocumentParams):
    ls.service.forget(params.text_document.uri)
    ls.edits.forget(params.text_document.uri)
    ls.indexing.document(params.text_document.uri, closed=True)
