"""What the editor ends up holding: a model's raw FIM output, through the server's stop rules,
trimming and item, applied to the document as an editor applies an inline completion item."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types

from lsp_server.api.inline_completion import inline_item
from lsp_server.documents import ChunkedText
from lsp_server.cursor import build_request
from lsp_server.snapshot import take
from lsp_server.hosts import ModelHost
from lsp_server.server import create_server
from lsp_server.settings import Settings
from specdec.engine.session import CancelToken, Generation, GenerationStats


class ScriptedCompleter:
    """Emits `script` one character per step through the stop predicate, as the engine does per token."""

    def __init__(self, script: str, eos: bool = True):
        self.script, self.eos = script, eos
        self.session = SimpleNamespace(reset=lambda: None, drafter=None)

    def complete(self, prefix, suffix, config, path=None, stop=None, cancel=None, context=""):
        for n in range(1, len(self.script) + 1):
            text = self.script[:n]
            cut = stop(text) if stop else None
            if cut is not None:
                return Generation([], text[:cut], "stop", GenerationStats())
            if n >= config.max_new_tokens:
                return Generation([], text, "max_tokens", GenerationStats())
        return Generation([], self.script, "eos" if self.eos else "max_tokens", GenerationStats())


def server_with(source: str, uri: str = "file:///w/m.py"):
    from pygls.workspace import Workspace

    server = create_server()
    server.protocol._workspace = Workspace("file:///w")
    server.protocol.server_capabilities = types.ServerCapabilities(
        position_encoding=types.PositionEncodingKind.Utf16)
    server.protocol._workspace.put_text_document(types.TextDocumentItem(uri, "python", 1, source))
    return server


def offset_of(source: str, position: types.Position) -> int:
    lines = source.split("\n")
    return sum(len(line) + 1 for line in lines[: position.line]) + position.character


def apply(source: str, item: types.InlineCompletionItem) -> str:
    """As VS Code does: replace the item's range with its insert text."""
    start, end = offset_of(source, item.range.start), offset_of(source, item.range.end)
    return source[:start] + item.insert_text + source[end:]


def complete_and_apply(source: str, line: int, col: int, script: str, eos: bool = True, **settings) -> str:
    server = server_with(source)
    position = types.Position(line, col)
    request = build_request(take(server, "file:///w/m.py"), position, invoked=True)
    c = request.completion
    ctx = __import__("specdec.completion.syntax", fromlist=["analyze"]).analyze(c.language, c.prefix, c.suffix)
    host = ModelHost()
    host.completer, host.state = ScriptedCompleter(script, eos), "ready"
    text, _ = host.generate(request, ctx, Settings().update(settings), CancelToken())
    if not text:
        return source
    return apply(source, inline_item(position, SimpleNamespace(text=text, id="x")))


MEDIAN = ("def median(l):\n"
          "    l = sorted(l)\n"
          "    if len(l) % 2 == 1:\n"
          "    else:\n"
          "        return (l[len(l) // 2 - 1] + l[len(l) // 2]) / 2.0\n")
MEDIAN_DONE = MEDIAN.replace("== 1:\n", "== 1:\n        return l[len(l) // 2]\n")


@pytest.mark.parametrize("name, source, line, col, script, expected", [
    ("line start before code (HumanEval single-line infilling)", MEDIAN, 3, 0,
     "        return l[len(l) // 2]\n    else:\n", MEDIAN_DONE),
    ("inside indentation before code", "def f(x):\n    return y\n", 1, 2, "y = x\n    ret",
     "def f(x):\n  y = x\n    return y\n"),
    ("mid-line", "print(foo(a, ))\n", 0, 13, "b, c)\nprint(1)", "print(foo(a, b, c))\n"),
    ("end of line", "total = \n", 0, 8, "sum(values)\nnext", "total = sum(values)\n"),
    ("empty line in a block", "def f(x):\n    \n", 1, 4, "y = x + 1\n    return y\n\n\nz",
     "def f(x):\n    y = x + 1\n    return y\n"),
])
def test_items_applied_as_an_editor_applies_them(name, source, line, col, script, expected):
    assert complete_and_apply(source, line, col, script) == expected, name


def test_line_start_keeps_fim_literal_text_when_the_model_ends_without_a_line_break():
    assert complete_and_apply("foo()\n", 0, 0, "x = ") == "x = foo()\n"


def test_line_start_offers_nothing_when_the_model_retypes_the_existing_line():
    assert complete_and_apply(MEDIAN, 3, 0, "    else:\n        return") == MEDIAN


def test_multiline_off_makes_every_completion_single_line():
    source, script = "def f(x):\n    \n", "y = x + 1\n    return y\n\n"
    assert complete_and_apply(source, 1, 4, script, multiline=False) == "def f(x):\n    y = x + 1\n"
    assert complete_and_apply(source, 1, 4, script, multiline=True) == "def f(x):\n    y = x + 1\n    return y\n"


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.sampled_from(["a", "\n", "bb", "\n\n", "x" * 5000, "y" * 70_000]), max_size=60),
       extra=st.integers(min_value=-2, max_value=3))
def test_line_start_skips_lines_in_chunks_exactly_as_one_by_one(pieces, extra):
    """The event loop finds a cursor a million lines down in milliseconds; the answer is the plain loop's."""
    text = "".join(pieces)
    chunked = ChunkedText.of(text)
    for line in {0, 1, max(0, text.count("\n") + extra), text.count("\n") // 2}:
        start = 0
        for _ in range(line):
            newline = text.find("\n", start)
            start = -1 if newline < 0 else newline + 1
            if start < 0:
                break
        assert chunked.line_start(line) == start
