"""An editor's request for a remote engine: other open files go as the engine's chunks, and the local prompt's
snippets (which only the in-process engine reads) are not built for it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from lsprotocol import types

import tiny
from lsp_server import cursor
from lsp_server.cursor import build_request
from lsp_server.snapshot import take
from lsp_server.hosts import ModelHost
from lsp_server.remote_host import RemoteHost
from lsp_server.server import create_server
from lsp_server.settings import Settings
from specdec.backends.remote.tokens import TokenCounter

MAIN = "from util import sub\n\ndef add(a, b):\n    return "
UTIL = "def sub(a, b):\n    return a - b\n"
MAIN_URI, UTIL_URI = "file:///w/main.py", "file:///w/util.py"


@pytest.fixture
def server():
    from pygls.workspace import Workspace

    server = create_server()
    server.protocol._workspace = Workspace("file:///w")
    server.protocol.server_capabilities = types.ServerCapabilities(
        position_encoding=types.PositionEncodingKind.Utf16)
    for uri, text in ((UTIL_URI, UTIL), (MAIN_URI, MAIN)):
        server.protocol._workspace.put_text_document(types.TextDocumentItem(uri, "python", 1, text))
    yield server


@pytest.fixture
def remote_host():
    """A llama-server host whose target tokenizer is built: the case where the snippets would be non-empty."""
    host = RemoteHost("llama-server")
    host.backend.settings = Settings()
    host.backend._counter, host.backend._counter_target = TokenCounter(tiny.tokenizer()), Settings().target
    yield host
    host.close()


def test_a_remote_hosts_request_builds_no_local_snippets(server, remote_host, monkeypatch):
    server.host = remote_host
    assert cursor.snippets(replace(take(server, MAIN_URI), remote=False), "python")  # what it would carry, unread
    built = []
    monkeypatch.setattr(cursor, "snippets", lambda *args: built.append(args) or "snippets")
    request = build_request(take(server, MAIN_URI), types.Position(3, 11), invoked=True)
    assert built == [] and request.completion.context == ""
    assert request.completion.chunks == [{"filename": "util.py", "text": UTIL}]  # the engine's context: the other file
    assert (request.completion.prefix, request.completion.suffix) == (MAIN, "")


def test_the_local_host_still_gets_its_snippets(server, monkeypatch):
    assert isinstance(server.host, ModelHost)
    built = []
    monkeypatch.setattr(cursor, "snippets", lambda *args: built.append(args) or "snippets")
    snapshot = take(server, MAIN_URI)
    request = build_request(snapshot, types.Position(3, 11), invoked=True)
    assert built == [(snapshot, "python")] and request.completion.context == "snippets"
    assert request.completion.chunks == []  # declared, and empty: the local prompt reads the snippets
