"""specdec/trace {"uri": ..., "limit": N}: the pass traces of the document's last N completions. From the first
ask on, completions record p and q too (a softmax per pass nobody read before)."""

from __future__ import annotations

from pygls.exceptions import JsonRpcInvalidParams

from lsp_server.traces import parse_params
from specdec.errors import SpecdecError

METHOD = "specdec/trace"


def handle(ls, params=None):
    try:
        uri, limit = parse_params(params)
    except SpecdecError as exc:
        raise JsonRpcInvalidParams(str(exc)) from None
    ls.service.traces.asked = True
    return {"uri": uri, "traces": ls.service.traces.latest(uri, limit)}
