"""`specdec/trace`: the pass traces of each document's latest completions, in bounded memory.

The service keeps the engine's `Trace` of every completion the model made (not type-ahead or cache hits: no
pass ran for those), the last PER_DOCUMENT per document and MAX_DOCUMENTS documents, least recently completed
dropped first; a closed document's traces go with it. The JSON is made when asked (`Trace.as_dict` with the
tokenizer's decode: the shape `specdec complete --trace-json` writes), so recording costs a reference.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from specdec.errors import SpecdecError

PER_DOCUMENT = 8
MAX_DOCUMENTS = 64
SHOWN_CHARS = 40  # of a refused parameter, in the error


class TraceStore:
    def __init__(self, per_document: int = PER_DOCUMENT, documents: int = MAX_DOCUMENTS):
        self.per_document, self.documents = per_document, documents
        self._by_uri: OrderedDict[str, deque] = OrderedDict()
        # a client asked for traces: from then on every model request asks for p and q (CompletionRequest.trace);
        # kept here, beside the traces, so it outlives any engine the server switches to
        self.asked = False

    def add(self, uri: str, trace, decode, shown: str) -> None:
        """trace: the engine's Trace; decode: the tokenizer's; shown: the suggestion's text after the server's
        syntax rules (the trace's own text is what the engine generated)."""
        traces = self._by_uri.pop(uri, None) or deque(maxlen=self.per_document)
        traces.append((trace, decode, shown))
        self._by_uri[uri] = traces
        while len(self._by_uri) > self.documents:
            self._by_uri.popitem(last=False)

    def forget(self, uri: str) -> None:
        self._by_uri.pop(uri, None)

    def latest(self, uri: str, limit: int | None = None) -> list[dict]:
        """The newest `limit` traces of the document (all kept when None), oldest first."""
        kept = list(self._by_uri.get(uri, ()))
        if limit is not None:
            kept = kept[len(kept) - limit:] if limit else []
        return [{**trace.as_dict(decode), "shown": shown} for trace, decode, shown in kept]


def parse_params(params) -> tuple[str, int | None]:
    """(uri, limit) from the request's params (`{"uri": ..., "limit": N}`, limit optional); a one-line error else."""
    uri = _field(params, "uri")
    limit = _field(params, "limit")
    if not isinstance(uri, str) or not uri:
        raise SpecdecError('specdec/trace needs params {"uri": DOCUMENT_URI, "limit": N}')
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        shown = repr(limit)
        shown = shown[:SHOWN_CHARS] + ("..." if len(shown) > SHOWN_CHARS else "")  # a 1 MB limit is not echoed
        raise SpecdecError(f"specdec/trace: limit must be a whole number >= 0, got {shown}")
    return uri, limit


def _field(params, name: str):
    if isinstance(params, dict):
        return params.get(name)
    return getattr(params, name, None)  # pygls hands custom requests' params over as namedtuples
