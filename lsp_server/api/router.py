"""One router: every handler module's method registered on the pygls server (pygls answers the rest)."""

from __future__ import annotations

from lsp_server.api import (
    accept, completion, did_change, did_change_configuration, did_change_workspace_folders, did_close, did_save,
    finetune, initialize, initialized, inline_completion, stats, trace,
)

HANDLERS = (initialize, initialized, did_change_configuration, did_change_workspace_folders, did_change, did_save,
            did_close, inline_completion, completion, accept, finetune, stats, trace)


def register(server) -> None:
    for handler in HANDLERS:
        if hasattr(handler, "COMMAND"):
            server.command(handler.COMMAND)(handler.handle)
        else:
            server.feature(handler.METHOD, getattr(handler, "OPTIONS", None))(handler.handle)
