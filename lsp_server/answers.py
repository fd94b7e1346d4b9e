"""What the server answers without the model: suggestions already made, and the rest of a suggestion the user is
typing through (type-ahead). The scheduler (service.py) asks here first and tells here what the model made.

Both are keyed by what a suggestion depends on: the request's text around the cursor and every setting that can
change a suggestion (Settings.output_key), so nothing made under other settings is served.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lsp_server.service import EditorRequest
    from lsp_server.settings import Settings

CACHE_SIZE = 512  # suggestions kept, the least recently used dropped first
MAX_DOCUMENTS = 64  # documents whose last suggestion is kept for type-ahead


class Answers:
    def __init__(self):
        self.cache: OrderedDict[tuple, str] = OrderedDict()  # key -> the whole suggestion
        # uri -> (prefix, suffix, suggestion, settings.output_key()): the document's last suggestion, for type-ahead
        self.last: OrderedDict[str, tuple[str, str, str, tuple]] = OrderedDict()

    @staticmethod
    def key(request: EditorRequest, settings: Settings) -> tuple:
        """Everything a suggestion depends on: the request, and every output-affecting setting (from the schema)."""
        c = request.completion
        return (c.language, c.prefix[-4000:], c.suffix[:2000], c.context[-2000:], request.adapter,
                settings.output_key())

    def cached(self, key: tuple) -> str | None:
        text = self.cache.get(key)
        if text is not None:
            self.cache.move_to_end(key)
        return text

    def typeahead(self, request: EditorRequest, settings: Settings) -> str | None:
        """The rest of the document's last suggestion after what the user typed since, if they typed its start."""
        last = self.last.get(request.uri)
        if not last:
            return None
        prefix, suffix, text, made_under = last
        if made_under != settings.output_key():  # a generation that finished after a settings change
            return None
        if request.completion.suffix != suffix or not request.completion.prefix.startswith(prefix):
            return None
        typed = request.completion.prefix[len(prefix) :]
        if typed and text.startswith(typed) and len(typed) < len(text):
            return text[len(typed) :]
        return None

    def store(self, key: tuple, request: EditorRequest, text: str, settings: Settings) -> None:
        """A whole suggestion: cached, and the document's last for type-ahead."""
        self.cache[key] = text
        self.cache.move_to_end(key)
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        self.remember(request, text, settings)

    def remember(self, request: EditorRequest, text: str, settings: Settings) -> None:
        """The document's last suggestion (whole, or the lines answered early), for type-ahead."""
        self.last[request.uri] = (request.completion.prefix, request.completion.suffix, text, settings.output_key())
        self.last.move_to_end(request.uri)
        while len(self.last) > MAX_DOCUMENTS:
            self.last.popitem(last=False)

    def forget(self, uri: str) -> None:
        """didClose: the document's last suggestion goes (the cache holds only bounded windows)."""
        self.last.pop(uri, None)

    def clear(self) -> None:
        self.cache.clear()
        self.last.clear()
