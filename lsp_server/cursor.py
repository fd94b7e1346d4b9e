"""What an editor's request at a cursor becomes: the document's text around the cursor (the completion wing's window,
specdec/completion/window.py), and the context of other open files, as an EditorRequest the scheduler (service.py)
takes. What is the editor's here: URIs, the open documents, positions in the client's encoding."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import unquote, urlparse

from lsprotocol import types

from lsp_server.documents import text_of
from lsp_server.service import EditorRequest
from specdec.completion.window import looks_binary, window
from specdec.prompts.languages import detect_language

log = logging.getLogger("specdec.server")


def uri_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def workspace_for(roots: list[str], path: str) -> str:
    """The innermost workspace folder holding the path ("" for none)."""
    matches = [root for root in roots if path.startswith(root.rstrip("/") + "/")]
    return max(matches, key=len) if matches else ""


def open_document(server, uri: str):
    """The open document of the URI (as the client spelt it, or unquoted), or None."""
    documents = server.workspace.text_documents
    return documents.get(uri) or documents.get(unquote(uri))


def build_request(server, uri: str, position: types.Position, invoked: bool) -> EditorRequest | None:
    document = open_document(server, uri)
    if document is None:
        log.info("no completion: %s is not open", uri)
        return None
    text = text_of(document)
    if looks_binary(text):
        return None
    encoding = server.server_capabilities.position_encoding or types.PositionEncodingKind.Utf16
    offset = text.cursor_offset(position, encoding)
    path = uri_path(uri)
    language = detect_language(document.language_id, uri)
    workspace = workspace_for(server.workspace_roots, path)
    prefix, suffix = window(text, offset)
    fields = {"path": str(Path(path).relative_to(workspace)) if workspace else Path(path).name}
    if server.host.remote:  # the engine gets other files as chunks (input_extra, <|file_sep|>);
        fields["chunks"] = chunks(server, uri, language)  # the local prompt's snippets would go unread
    else:
        fields["context"] = snippets(server, uri, language)
    if server.indexing.indexer is not None:
        from specdec.repository.build import document_key

        fields["document"] = document_key(path)
    return EditorRequest.at(uri, language, workspace, prefix, suffix, invoked, **fields)


def others(server, uri: str, language: str):
    """(uri, document) of the other open files of the language, among the 8 opened last."""
    for other_uri, doc in list(server.workspace.text_documents.items())[-8:]:
        if other_uri != uri and detect_language(doc.language_id, other_uri) == language:
            yield other_uri, doc


def chunks(server, uri: str, language: str) -> list[dict]:
    """Heads of other open files of the language, as {filename, text}: a remote engine's repository context."""
    if not server.settings.snippets_from_open_files:
        return []
    budget = server.settings.max_snippet_tokens * 3
    out = [{"filename": Path(uri_path(other)).name, "text": text_of(doc)[:budget]}
           for other, doc in others(server, uri, language)]
    return out[-2:]


def snippets(server, uri: str, language: str) -> str:
    """Heads of other open files of the same language, in the family's repo-level format."""
    template = server.host.template()
    if not (server.settings.snippets_from_open_files and template and template.file_header):
        return ""
    budget = server.settings.max_snippet_tokens * 3
    parts = []
    for other, doc in others(server, uri, language):
        parts.append(template.file_header.format(path=Path(uri_path(other)).name) + text_of(doc)[:budget] + "\n")
        if len(parts) == 2:
            break
    return "".join(parts)
