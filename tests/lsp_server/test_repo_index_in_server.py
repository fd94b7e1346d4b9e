"""The repository index in the server: built in the background when a workspace opens, followed through the
editor's changes, drafting for `strategy: repo` (and auto) but never from the document being completed."""

import asyncio
import time

import pytest
from lsprotocol import types

import lsp_client as lc
import tiny
from lsp_server.hosts import ModelHost
from lsp_server.service import EditorRequest
from lsp_server.settings import Settings, SettingsError
from repos import make_repo
from specdec.repository.build import document_key


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


async def wait_for(client, predicate, timeout=120.0) -> dict:  # a ceiling: the test waits on the reported state
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = await lc.stats(client)
        if predicate(stats["repo_index"]):
            return stats
        await asyncio.sleep(0.1)
    raise TimeoutError(f"repository index: {stats['repo_index']}")


async def test_a_workspace_is_indexed_in_the_background_and_follows_the_editor(tmp_path, model_dirs):
    root = make_repo(tmp_path / "repo", files=5)
    c = await lc.start(tmp_path, {"target": str(model_dirs[0]), "draft": "", "dtype": "fp32", "strategy": "repo",
                                  "debounceMs": 0, "maxNewTokens": 12}, workspace=root)
    try:
        await lc.wait_ready(c)
        index = (await wait_for(c, lambda s: s["settled"] and s["files"] == 5))["repo_index"]
        assert index["state"] == "ready" and index["skipped"] >= 8 and index["tokens"] > 0 and index["bytes"] > 0 and index["build_seconds"] > 0
        assert index["max_tokens"] == 16_000_000 and index["roots"] == [document_key(root)]

        uri = (root / "mod_0.py").as_uri()
        source = (root / "mod_0.py").read_text()
        lc.open_doc(c, uri, source)
        result = await lc.inline(c, uri, 4, 4, invoked=True)  # strategy repo completes over the tiny models
        assert len(result.items) == 1 and result.items[0].insert_text

        before = index["tokens"]
        lc.insert(c, uri, 0, 0, "def brand_new_helper(x):\n    return x\n" * 40, version=2)  # didChange
        index = (await wait_for(c, lambda s: s["updates"] == 1 and s["settled"]))["repo_index"]
        assert index["tokens"] > before + 200 and index["documents"] == 5
        c.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        index = (await wait_for(c, lambda s: s["updates"] == 2 and s["settled"]))["repo_index"]  # the disk's text
        assert index["tokens"] == before

        counted = await c.workspace_execute_command_async(types.ExecuteCommandParams(
            command=result.items[0].command.command, arguments=list(result.items[0].command.arguments)))
        assert lc.plain(counted)["counted"] is True
        await wait_for(c, lambda s: s["accepted"] == 1)  # an accepted completion becomes a document

        c.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"strategy": "lookup"}))
        await wait_for(c, lambda s: s["state"] == "off")  # no strategy reads it: it stops and frees its memory
        c.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={
            "strategy": "auto", "repoIndexMaxTokens": 100_000}))
        index = (await wait_for(c, lambda s: s["settled"] and s["files"] == 5))["repo_index"]
        assert index["max_tokens"] == 100_000 and index["tokens"] <= 100_000
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_a_uri_with_a_nul_is_served(tmp_path, model_dirs):
    """Issue #40.14: `%00` in a document's URI is a path no file can have; the completion is served as any other,
    and the index neither fails on its key nor takes its text."""
    root = make_repo(tmp_path / "repo", files=2)
    c = await lc.start(tmp_path, {"target": str(model_dirs[0]), "draft": "", "dtype": "fp32", "strategy": "repo",
                                  "debounceMs": 0, "maxNewTokens": 8}, workspace=root)
    try:
        await lc.wait_ready(c)
        await wait_for(c, lambda s: s["settled"] and s["files"] == 2)
        uri = root.as_uri() + "/a%00b.py"
        lc.open_doc(c, uri, "def add(a, b):\n    \n\nprint(add(1, 2))\n")
        result = await lc.inline(c, uri, 1, 4, invoked=True)
        assert len(result.items) == 1 and result.items[0].insert_text
        counted = await c.workspace_execute_command_async(types.ExecuteCommandParams(
            command=result.items[0].command.command, arguments=list(result.items[0].command.arguments)))
        assert lc.plain(counted)["counted"] is True
        index = (await wait_for(c, lambda s: s["settled"] and s["accepted_refused"] == 1))["repo_index"]
        assert index["state"] == "ready" and index["errors"] == 0 and index["documents"] == 2
    finally:
        await c.shutdown_session()
        await c.stop()


def gauges(port: int) -> dict[str, float]:
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in body.splitlines()
            if line.startswith("specdec_repo_index_")}


async def test_the_prometheus_endpoint_reports_the_index(tmp_path, model_dirs):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = make_repo(tmp_path / "repo", files=3)
    c = await lc.start(tmp_path, {"target": str(model_dirs[0]), "draft": "", "dtype": "fp32", "strategy": "repo",
                                  "prometheusPort": port}, workspace=root)
    try:
        await lc.wait_ready(c)
        index = (await wait_for(c, lambda s: s["settled"] and s["files"] == 3))["repo_index"]
        assert index["last_build_seconds"] > 0
        assert gauges(port) == {"specdec_repo_index_files": 3.0, "specdec_repo_index_tokens": index["tokens"],
                                "specdec_repo_index_bytes": index["bytes"],
                                "specdec_repo_index_last_build_seconds": index["last_build_seconds"]}
        assert index["tokens"] > 0 and index["bytes"] > 0
        c.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"strategy": "lookup"}))
        await wait_for(c, lambda s: s["state"] == "off")
        assert set(gauges(port).values()) == {0.0}  # no index: the gauges fall to zero
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_the_index_can_be_turned_off(tmp_path, model_dirs):
    root = make_repo(tmp_path / "repo", files=2)
    c = await lc.start(tmp_path, {"target": str(model_dirs[0]), "draft": "", "dtype": "fp32", "repoIndex": False},
                       workspace=root)
    try:
        await lc.wait_ready(c)
        assert (await lc.stats(c))["repo_index"] == {"state": "off"}
    finally:
        await c.shutdown_session()
        await c.stop()


def test_strategy_repo_needs_the_index():
    with pytest.raises(SettingsError, match="repoIndex"):
        Settings().update({"strategy": "repo", "repoIndex": False})
    with pytest.raises(SettingsError, match="repoIndexMaxTokens"):
        Settings().update({"repoIndexMaxTokens": 10})


@pytest.mark.parametrize("strategy", ["repo", "auto"])
def test_the_host_drafts_from_other_documents_only(model_dirs, strategy):
    """In-process: a document holding the target's own continuation of the text before the cursor is drafted
    from (the FIM prompt's prefix and the completion are stitched across the markers), unless it is the very
    document being completed."""
    from specdec.completion import syntax
    from specdec.engine.session import CancelToken

    host = ModelHost()
    settings = Settings().update({"target": str(model_dirs[0]), "draft": str(model_dirs[1]), "dtype": "fp32",
                                  "adapters": False, "strategy": strategy, "maxNewTokens": 16,
                                  "multiline": True})
    host.load(settings)
    assert host.state == "ready", host.error
    prefix, suffix = "class Point:\n    def __init__(self, x, y):\n        self.", "\n"
    request = EditorRequest.at("file:///w/a.py", "python", "/w", prefix, suffix, invoked=True, path="a.py")
    ctx = syntax.analyze("python", prefix, suffix)

    def complete():
        host.completer.session.reset()
        return host.executor.submit(host.generate, request, ctx, settings, CancelToken()).result(60)[1]

    reference = complete()  # the index is empty: nothing from it
    assert reference.tokens and "repo" not in reference.stats["drafted_by"]
    prefix_ids = host.completer.session.tokenizer(prefix, add_special_tokens=False)["input_ids"]
    host.repo_index.add("/w/other.py", prefix_ids + reference.tokens)

    result = complete()
    assert result.tokens == reference.tokens  # lossless
    assert result.stats["accepted_by"].get("repo", 0) >= 1

    request.completion.document = "/w/other.py"  # completing other.py itself: its own text is not drafted from
    result = complete()
    assert result.tokens == reference.tokens and "repo" not in result.stats["drafted_by"]
    assert host.idle.is_set()  # background indexing may go on again
