"""initialize: answered at once (the models load after `initialized`); the workspace's folders, the editor's
options, and the repository index starting in the background."""

from __future__ import annotations

import asyncio

from lsprotocol import types

from lsp_server.cursor import uri_path
from lsp_server.documents import DocumentWorkspace

METHOD = types.INITIALIZE


def handle(ls, params: types.InitializeParams):
    ls.loop = asyncio.get_running_loop()
    ls.protocol._workspace = DocumentWorkspace.replacing(ls.workspace)  # documents kept in chunks
    folders = params.workspace_folders or []
    ls.workspace_roots = [uri_path(f.uri) for f in folders]
    if not folders and params.root_uri:
        ls.workspace_roots = [uri_path(params.root_uri)]
    ls.configuration.apply(params.initialization_options)
    ls.indexing.sync()  # the repository index builds in the background (even if the options were refused)
