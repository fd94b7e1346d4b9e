"""One router: every handler module's method registered on the pygls server (pygls answers the rest).

A handler refuses a request by raising one of pygls' JSON-RPC errors (InvalidParams, ...); pygls answers it and
logs the refusal with a traceback at ERROR, the whole params included (a client's 1 MB string). `OneLineRefusals`
makes that one WARNING line: the request's id and what was refused, cut short. Failures of our own code keep
their traceback.
"""

from __future__ import annotations

import logging

from pygls.exceptions import JsonRpcException, JsonRpcInternalError

from lsp_server.api import (
    accept, completion, did_change, did_change_configuration, did_change_workspace_folders, did_close, did_save,
    finetune, initialize, initialized, inline_completion, next_edit, stats, trace,
)

HANDLERS = (initialize, initialized, did_change_configuration, did_change_workspace_folders, did_change, did_save,
            did_close, inline_completion, completion, next_edit, accept, finetune, stats, trace)


REFUSAL_CHARS = 200  # of a refusal's message, in the log line
PYGLS_LOGGER = "pygls.protocol.json_rpc"


class OneLineRefusals(logging.Filter):
    """pygls' log record of a refused request (a JsonRpcException we raised) as one WARNING line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, JsonRpcException) and not isinstance(exc, JsonRpcInternalError):
            msg_id = str(record.args[0])[:40] if isinstance(record.args, tuple) and record.args else "?"
            message = " ".join(str(exc).split())
            message = message[:REFUSAL_CHARS] + ("..." if len(message) > REFUSAL_CHARS else "")
            record.msg, record.args, record.exc_info, record.exc_text = "refused request %s: %s", (msg_id, message), \
                None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def register(server) -> None:
    logger = logging.getLogger(PYGLS_LOGGER)
    if not any(isinstance(f, OneLineRefusals) for f in logger.filters):
        logger.addFilter(OneLineRefusals())
    for handler in HANDLERS:
        if hasattr(handler, "COMMAND"):
            server.command(handler.COMMAND)(handler.handle)
        else:
            server.feature(handler.METHOD, getattr(handler, "OPTIONS", None))(handler.handle)
