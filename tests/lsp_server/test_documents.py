"""The server's documents (issue #40 item 5): changes applied exactly as pygls applies them, cursors found
exactly as before, at the cost of the change and the window, not the document."""

import asyncio
import copy
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.workspace import PositionCodec, TextDocument
from pygls.workspace import position_codec as pygls_codec

import raw_client as rc
from lsp_server import documents
from specdec.completion.window import PREFIX_WINDOW, SUFFIX_WINDOW, window
from lsp_server.documents import CHUNK, ChunkedText, Document

ENCODINGS = [types.PositionEncodingKind.Utf16, types.PositionEncodingKind.Utf8, types.PositionEncodingKind.Utf32]
PIECES = ["a", "bc", " ", "é", "中", "😋", "\n", "\r\n", "\r", "\u2028", "\x0b", "\x85", "\ud83d"]
TYPED = "abcdefghijklmnopqrst"


def naive_cursor_offset(source: str, position: types.Position, encoding: str) -> int:
    """The server's cursor before the document store: lines split at \\n, a character at a time."""
    start = 0
    for _ in range(max(0, position.line)):
        newline = source.find("\n", start)
        if newline < 0:
            return len(source)
        start = newline + 1
    end = source.find("\n", start)
    end = len(source) if end < 0 else end
    if end > start and source[end - 1] == "\r":
        end -= 1
    offset, used = start, 0
    while offset < end:
        char = source[offset]
        width = (len(char.encode("utf-8", "surrogatepass")) if encoding == types.PositionEncodingKind.Utf8 else
                 1 if encoding == types.PositionEncodingKind.Utf32 else 2 if ord(char) > 0xFFFF else 1)
        if used + width > max(0, position.character):
            break
        used += width
        offset += 1
    return offset


def check_chunks(text: ChunkedText) -> None:
    """The incremental totals are those of the text counted afresh, and no \\r\\n is cut between chunks."""
    fresh = ChunkedText.of(str(text))
    assert (text.ends[-1:], text.newlines[-1:], text.breaks[-1:], text.utf16[-1:], text.utf8[-1:]) == (
        fresh.ends[-1:], fresh.newlines[-1:], fresh.breaks[-1:], fresh.utf16[-1:], fresh.utf8[-1:])
    assert text.line_count() == len(str(text).splitlines())
    sizes = [len(c.text) for c in text.chunks]
    assert len(sizes) <= 1 or min(sizes) >= min(documents.CHUNK // 4, documents.CHUNK // 2 - 1)  # no crumbs
    assert all(0 < size <= documents.CHUNK + 1 for size in sizes)
    assert not any(a.text.endswith("\r") and b.text.startswith("\n") for a, b in zip(text.chunks, text.chunks[1:]))


positions = st.builds(types.Position, st.integers(0, 6) | st.just(40), st.integers(0, 8) | st.just(99))
changes = st.one_of(
    st.builds(lambda start, end, text: types.TextDocumentContentChangePartial(types.Range(start, end), text),
              positions, positions, st.lists(st.sampled_from(PIECES), max_size=4).map("".join)),
    st.builds(types.TextDocumentContentChangeWholeDocument, st.lists(st.sampled_from(PIECES), max_size=8).map("".join)))


def at(line: int, character: int, end_line: int, end_character: int, text: str = "X"):
    return types.TextDocumentContentChangePartial(
        types.Range(types.Position(line, character), types.Position(end_line, end_character)), text)


QUIRKS = "ab\r\ncd😋e\nfg"  # pygls' corners, each once for sure (the random examples find them too, less surely)


@settings(max_examples=400, deadline=None)
@given(source=st.lists(st.sampled_from(PIECES), max_size=40).map("".join), edits=st.lists(changes, max_size=12),
       encoding=st.sampled_from(ENCODINGS), chunk=st.sampled_from([4, 8, 16, CHUNK]),
       cursors=st.lists(positions, min_size=1, max_size=4))
@example(QUIRKS, [at(0, 3, 0, 3)], ENCODINGS[0], 4, [types.Position(1, 3)])  # a \r\n line's end; cursor in a pair
@example(QUIRKS, [at(0, 9, 0, 9)], ENCODINGS[0], 4, [types.Position(0, 9)])  # past a \r\n line's end
@example(QUIRKS, [at(2, 9, 2, 9)], ENCODINGS[0], 4, [types.Position(2, 9)])  # past the last line's end
@example(QUIRKS, [at(9, 0, 9, 0)], ENCODINGS[0], 4, [types.Position(9, 0)])  # past the last line
@example(QUIRKS, [at(1, 2, 0, 1)], ENCODINGS[0], 4, [types.Position(1, 4)])  # a range ending on an earlier line
@example(QUIRKS, [at(1, 4, 1, 1)], ENCODINGS[0], 4, [types.Position(1, 5)])  # reversed on one line
@example(QUIRKS, [at(1, 3, 1, 3)], ENCODINGS[0], 4, [types.Position(1, 3)])  # inside a surrogate pair
@example(QUIRKS, [at(1, 4, 1, 4)], ENCODINGS[1], 4, [types.Position(1, 4)])  # inside a UTF-8 sequence
@example("", [at(3, 1, 0, 0)], ENCODINGS[0], 4, [types.Position(0, 0)])  # an empty document
@example("abc\rX\nde", [at(1, 0, 1, 1, "")], ENCODINGS[0], 4, [types.Position(0, 3)])  # "abc\r" | "X\nde": a \r\n made
@example("abcd\nefg", [at(0, 3, 0, 4, "\r")], ENCODINGS[0], 4, [types.Position(0, 3)])  # "abcd" | "\nefg": the same
@example("a" * 32, [at(0, 0, 0, 13, "")], ENCODINGS[0], 16, [types.Position(0, 3)])  # a chunk too small: merged
@example("a" * 32, [at(0, 16, 0, 29, "")], ENCODINGS[0], 16, [types.Position(0, 3)])  # the last one too
def test_changes_land_as_pygls_puts_them_and_cursors_as_before(source, edits, encoding, chunk, cursors):
    """Surrogate pairs, lone surrogates, \\r\\n and every str.splitlines break, positions past a line's end and
    past the last line, reversed ranges, full replacements: the same text as pygls' own TextDocument."""
    with mock.patch.object(documents, "CHUNK", chunk):  # small chunks: edits across and between chunks
        reference = TextDocument("file:///w/a.py", source, position_codec=PositionCodec(encoding))
        document = Document("file:///w/a.py", source, position_codec=PositionCodec(encoding))
        for change in edits:
            reference.apply_change(copy.deepcopy(change))  # pygls clamps a position in place
            document.apply_change(copy.deepcopy(change))
            assert document.source == reference.source
            check_chunks(document.text)
        for position in cursors:
            assert document.text.cursor_offset(position, encoding) == naive_cursor_offset(
                reference.source, position, encoding)


@settings(max_examples=100, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES + ["x" * 50]), max_size=60), chunk=st.sampled_from([4, 16, CHUNK]),
       spans=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), max_size=6))
def test_slices_find_and_window_read_as_a_str(pieces, chunk, spans):
    with mock.patch.object(documents, "CHUNK", chunk):
        source = "".join(pieces)
        text = ChunkedText.of(source)
        assert str(text) == source and len(text) == len(source)
        for a, b in spans:
            assert text[a:b] == source[a:b] and text.find("\n", a, b) == source.find("\n", a, b)
            assert text.find("😋", a) == source.find("😋", a)
        if source:
            assert text[len(source) // 2] == source[len(source) // 2] and text[-1] == source[-1]
        assert window(text, len(source) // 3) == window(source, len(source) // 3)


@pytest.fixture
def no_pygls_lines(monkeypatch):
    """Any use of pygls' whole-line machinery (the lines tuple, per-character unit counts) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("pygls' per-line conversion was used")

    monkeypatch.setattr(TextDocument, "lines", property(refuse))
    monkeypatch.setattr(PositionCodec, "position_from_client_units", refuse)
    for unit in (pygls_codec.Utf16, pygls_codec.Utf8, pygls_codec.UnitCounter):
        monkeypatch.setattr(unit, "code_units_for_char", refuse)


def big_line() -> str:
    """One 10 MB line, a character beyond the BMP and an accent in every chunk (no all-ASCII shortcut)."""
    return ("x = 'é😋'; " + "y = 1; " * 1200) * 1247


def utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def test_a_keystroke_on_a_10_mb_line_costs_a_chunk_not_the_line(no_pygls_lines):
    line = big_line()
    assert len(line) > 10_000_000
    document = Document("file:///w/big.py", line)
    work = document.work
    for i, char in enumerate(TYPED):
        here = types.Position(0, utf16_length(line) + i)
        copied, read = work.copied, work.read
        document.apply_change(types.TextDocumentContentChangePartial(types.Range(here, here), char))
        assert work.copied - copied <= 3 * CHUNK and work.read - read <= 4 * CHUNK
    assert work.edits == len(TYPED)
    assert document.source == line + TYPED

    text, read = document.text, work.read
    end = text.cursor_offset(types.Position(0, 10_485_755), types.PositionEncodingKind.Utf16)
    assert end == naive_cursor_offset(str(text), types.Position(0, 10_485_755), types.PositionEncodingKind.Utf16)
    assert work.read - read <= 2 * CHUNK  # one chunk for the line, one for its units
    read = work.read
    prefix, suffix = window(text, end)
    assert (prefix, suffix) == window(str(text), end)
    assert work.read - read <= 2 * PREFIX_WINDOW + SUFFIX_WINDOW  # the window, and a search in it for its start


def test_an_ascii_line_needs_no_reading_to_place_a_position():
    document = Document("file:///w/big.py", "y = 1; " * 1_500_000)
    read = document.work.read
    here = types.Position(0, 7 * 1_500_000)
    document.apply_change(types.TextDocumentContentChangePartial(types.Range(here, here), "z"))
    assert document.source.endswith("y = 1; z") and document.work.read - read <= CHUNK  # the line's end lookup only


# -- over the wire: the issue's sequence, in process through the server's own reader ---------------------
def replies(capture: rc.Capture) -> dict:
    """The replies written so far, by id."""
    return {m["id"]: m for m in capture.messages() if "id" in m and "method" not in m}


@pytest.fixture
async def served():
    from lsp_server.server import create_server
    from lsp_server.transport import Dispatcher

    server = create_server()
    capture = rc.Capture()
    server.protocol.set_writer(capture)
    dispatcher = Dispatcher(server, lambda code: None)
    yield server, dispatcher, capture
    if server.indexing.indexer is not None:
        server.indexing.indexer.stop(timeout=10)
    server.host.executor.shutdown(wait=True)


async def reply(capture: rc.Capture, msg_id, ceiling: float = 120.0) -> dict:
    """The reply once the server has written it (handlers that await run on this loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ceiling
    while msg_id not in replies(capture):
        assert loop.time() < deadline, f"no reply to {msg_id!r}"
        await asyncio.sleep(0.01)
    return replies(capture)[msg_id]


async def test_the_issue_sequence_is_answered_with_the_edited_text(served, tmp_path, no_pygls_lines):
    """A 10 MB one-line document, 20 one-character didChanges at its end, then specdec/stats (and an inline
    completion at the end of the line): answered, the server holding exactly the typed text, each change
    having cost a chunk or two."""
    server, wire, capture = served
    uri = (tmp_path / "big.py").as_uri()
    wire.feed(rc.frame(rc.request("init", "initialize", {"capabilities": {}, "processId": None, "rootUri": None})))
    assert "result" in await reply(capture, "init")
    line = big_line()
    wire.feed(rc.frame(rc.notification("textDocument/didOpen", {"textDocument": {
        "uri": uri, "languageId": "python", "version": 1, "text": line}})))
    for i, char in enumerate(TYPED):
        here = {"line": 0, "character": utf16_length(line) + i}
        wire.feed(rc.frame(rc.notification("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": 2 + i},
            "contentChanges": [{"range": {"start": here, "end": here}, "text": char}]})))
    wire.feed(rc.frame(rc.request("stats", "specdec/stats", {})))
    stats = (await reply(capture, "stats"))["result"]
    document = server.workspace.text_documents[uri]
    assert document.source == line + TYPED and document.version == 1 + len(TYPED)
    opened = len(line)  # the open wrote the text into chunks once
    assert stats["documents"]["open"] == 1 and stats["documents"]["characters"] == len(line) + len(TYPED)
    assert stats["documents"]["edits"] == len(TYPED)
    assert stats["documents"]["copied"] - opened <= len(TYPED) * 3 * CHUNK
    assert stats["documents"]["read"] <= len(TYPED) * 4 * CHUNK

    read = document.work.read
    end = {"line": 0, "character": utf16_length(line) + len(TYPED)}
    wire.feed(rc.frame(rc.request("inline", "textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": end, "context": {"triggerKind": 1}})))
    wire.feed(rc.frame(rc.request("stats2", "specdec/stats", {})))
    assert (await reply(capture, "inline"))["result"]["items"] == []  # no model loaded: answered empty
    assert "result" in await reply(capture, "stats2")
    assert document.work.read - read <= 2 * CHUNK + BINARY_SNIFF_AND_WINDOW


BINARY_SNIFF_AND_WINDOW = 8192 + 2 * PREFIX_WINDOW + SUFFIX_WINDOW
