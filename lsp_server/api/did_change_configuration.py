"""workspace/didChangeConfiguration: the new settings, all or nothing (lsp_server/configuration.py)."""

from __future__ import annotations

from lsprotocol import types

METHOD = types.WORKSPACE_DID_CHANGE_CONFIGURATION


def handle(ls, params: types.DidChangeConfigurationParams):
    ls.configuration.apply(params.settings)
