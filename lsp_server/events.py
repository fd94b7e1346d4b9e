"""What happens to completions, for whoever keeps something of it: the scheduler (service.py) tells each event once,
here, and every subscriber takes the ones it needs. Metrics, online adaptation, the pass traces, the repository
index and the editor's notification are subscribers; the scheduler knows none of them.

A subscriber is a `CompletionObserver`: each event is a method that does nothing unless overridden.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lsp_server.metrics import RequestRecord
    from lsp_server.service import EditorRequest, Suggestion
    from lsp_server.settings import Settings


class CompletionObserver:
    def began(self, request: EditorRequest) -> None:
        """A completion request arrived (the user is active)."""

    def ended(self, request: EditorRequest) -> None:
        """It was answered, or cancelled."""

    def recorded(self, record: RequestRecord) -> None:
        """A request's metrics record: what it was answered with and where its time went."""

    def served(self, suggestion: Suggestion, request: EditorRequest, generation=None) -> None:
        """A suggestion was shown (generation: the backend's CompletionResult where the model made it)."""

    def generated(self, request: EditorRequest, text: str, result) -> None:
        """A whole generation ended with `text` shown (result: its CompletionResult, with the engine's trace)."""

    def accepted(self, suggestion: Suggestion) -> None:
        """The user took a suggestion."""

    def ready(self, uri: str) -> None:
        """A suggestion answered with its first lines is whole now (the cache answers the next ask)."""

    def forgot(self, uri: str) -> None:
        """The document closed: nothing of it may stay."""

    def configured(self, settings: Settings) -> None:
        """The settings changed."""


class CompletionEvents(CompletionObserver):
    """The subscribers, told each event in the order they subscribed."""

    def __init__(self, *subscribers: CompletionObserver):
        self.subscribers: list[CompletionObserver] = list(subscribers)

    def subscribe(self, subscriber: CompletionObserver) -> None:
        self.subscribers.append(subscriber)

    def began(self, request):
        for s in self.subscribers:
            s.began(request)

    def ended(self, request):
        for s in self.subscribers:
            s.ended(request)

    def recorded(self, record):
        for s in self.subscribers:
            s.recorded(record)

    def served(self, suggestion, request, generation=None):
        for s in self.subscribers:
            s.served(suggestion, request, generation)

    def generated(self, request, text, result):
        for s in self.subscribers:
            s.generated(request, text, result)

    def accepted(self, suggestion):
        for s in self.subscribers:
            s.accepted(suggestion)

    def ready(self, uri):
        for s in self.subscribers:
            s.ready(uri)

    def forgot(self, uri):
        for s in self.subscribers:
            s.forgot(uri)

    def configured(self, settings):
        for s in self.subscribers:
            s.configured(settings)


class Metrics(CompletionObserver):
    """The metrics store's part: every record, every acceptance."""

    def __init__(self, store):
        self.store = store

    def recorded(self, record):
        self.store.add(record)

    def accepted(self, suggestion):
        self.store.accepted(suggestion.language, suggestion.workspace, suggestion.adapter)


class Traces(CompletionObserver):
    """The pass traces' part (specdec/trace): each whole model generation's trace, dropped with its document.
    tokenizer(): the host's, asked only for a trace (a remote engine's trace holds its counts only: no ids)."""

    def __init__(self, store, tokenizer):
        self.store, self.tokenizer = store, tokenizer

    def generated(self, request, text, result):
        if getattr(result, "trace", None) is not None:
            tokenizer = self.tokenizer()
            self.store.add(request.uri, result.trace, tokenizer.decode if tokenizer is not None else None, text)

    def forgot(self, uri):
        self.store.forget(uri)


class Online(CompletionObserver):
    """Online adaptation's part (lsp_server/online.py): it learns from what is shown and taken, and refreshes while
    the user is idle."""

    def __init__(self, online):
        self.online = online

    def began(self, request):
        self.online.begin_request(request)  # an online refresh stops before any generation

    def ended(self, request):
        self.online.end_request()

    def served(self, suggestion, request, generation=None):
        self.online.served(suggestion, request, generation)

    def accepted(self, suggestion):
        self.online.accepted_suggestion(suggestion.id)

    def forgot(self, uri):
        self.online.forget(uri)

    def configured(self, settings):
        self.online.configure(settings)
