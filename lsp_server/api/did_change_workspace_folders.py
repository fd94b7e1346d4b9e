"""workspace/didChangeWorkspaceFolders: the folders completions are placed in, and the repository index's roots."""

from __future__ import annotations

from lsprotocol import types

from lsp_server.cursor import uri_path

METHOD = types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS


def handle(ls, params: types.DidChangeWorkspaceFoldersParams):
    removed = {uri_path(f.uri) for f in params.event.removed}
    added = [uri_path(f.uri) for f in params.event.added]
    ls.workspace_roots = [r for r in ls.workspace_roots if r not in removed] + added
    ls.indexing.folders_changed(removed, added)
