"""What an editor's request at a cursor becomes: the document's text around the cursor (the completion wing's window,
specdec/completion/window.py), and the context of other open files, as an EditorRequest the scheduler (service.py)
takes. What is the editor's here: URIs, the open documents, positions in the client's encoding."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from lsprotocol import types

from lsp_server.snapshot import Snapshot
from lsp_server.service import EditorRequest
from specdec.completion.window import looks_binary, window
from specdec.prompts.languages import detect_language



def uri_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def workspace_for(roots: list[str], path: str) -> str:
    """The innermost workspace folder holding the path ("" for none)."""
    matches = [root for root in roots if path.startswith(root.rstrip("/") + "/")]
    return max(matches, key=len) if matches else ""


def build_request(snapshot: Snapshot, position: types.Position, invoked: bool) -> EditorRequest | None:
    """The request at a cursor of the snapshot's document; None for a binary one."""
    uri, text = snapshot.document.uri, snapshot.document.text
    if looks_binary(text):
        return None
    offset = text.cursor_offset(position, snapshot.encoding)
    path = uri_path(uri)
    language = detect_language(snapshot.document.language_id, uri)
    workspace = workspace_for(list(snapshot.workspace_roots), path)
    prefix, suffix = window(text, offset)
    fields = {"path": str(Path(path).relative_to(workspace)) if workspace else Path(path).name}
    if snapshot.remote:  # the engine gets other files as chunks (input_extra, <|file_sep|>);
        fields["chunks"] = chunks(snapshot, language)  # the local prompt's snippets would go unread
    else:
        fields["context"] = snippets(snapshot, language)
    if snapshot.indexed:
        from specdec.repository.build import document_key

        fields["document"] = document_key(path)
    return EditorRequest.at(uri, language, workspace, prefix, suffix, invoked, **fields)


def others(snapshot: Snapshot, language: str):
    """The other open documents of the language, among the 8 opened last."""
    return [d for d in snapshot.others if detect_language(d.language_id, d.uri) == language]


def chunks(snapshot: Snapshot, language: str) -> list[dict]:
    """Heads of other open files of the language, as {filename, text}: a remote engine's repository context."""
    if not snapshot.settings.snippets_from_open_files:
        return []
    budget = snapshot.settings.max_snippet_tokens * 3
    out = [{"filename": Path(uri_path(d.uri)).name, "text": d.text[:budget]} for d in others(snapshot, language)]
    return out[-2:]


def snippets(snapshot: Snapshot, language: str) -> str:
    """Heads of other open files of the same language, in the family's repo-level format."""
    template = snapshot.template
    if not (snapshot.settings.snippets_from_open_files and template and template.file_header):
        return ""
    budget = snapshot.settings.max_snippet_tokens * 3
    parts = []
    for d in others(snapshot, language):
        parts.append(template.file_header.format(path=Path(uri_path(d.uri)).name) + d.text[:budget] + "\n")
        if len(parts) == 2:
            break
    return "".join(parts)
