"""End to end: `specdec serve` as a real subprocess over stdio, tiny models, pytest-lsp's client."""

import asyncio
import time

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled

import lsp_client as lc
import tiny

SOURCE = "def add(a, b):\n    \n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tiny.saved_pair(root)


@pytest.fixture
async def client(tmp_path, model_dirs):
    target, draft = model_dirs
    c = await lc.start(tmp_path, {"target": str(target), "draft": str(draft), "dtype": "fp32", "debounceMs": 0,
                                  "maxNewTokens": 24})
    await lc.wait_ready(c)
    yield c
    await c.shutdown_session()
    await c.stop()


def uri_of(tmp_path, name="a.py"):
    return (tmp_path / name).as_uri()


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
async def test_initialize_is_answered_before_the_models_load_and_advertises_inline_completion(tmp_path, model_dirs):
    """What the editor waits for never waits for the models: `initialize` is answered by a process that has not
    loaded torch (the models load after `initialized`, in the background), and a request before the models are
    ready is answered at once, empty, rather than queued behind a load."""
    c = await lc.start(tmp_path, {"target": str(model_dirs[0]), "draft": "", "strategy": "lookup"}, initialized=False)
    try:
        caps = c.initialize_result.capabilities
        assert caps.inline_completion_provider is not None and caps.completion_provider is not None
        assert ".accept" in caps.execute_command_provider.commands[0]
        assert (await lc.stats(c))["model"]["state"] == "idle"  # answered, and no load has even started
        assert not lc.torch_loaded(c)  # as test_layering checks from the source: torch comes with the models
        uri = uri_of(tmp_path)
        lc.open_doc(c, uri, SOURCE)
        early = await lc.inline(c, uri, 1, 4)
        assert early.items == () and (await lc.stats(c))["model"]["state"] == "idle"  # not held for a model
        c.initialized(types.InitializedParams())
        assert (await lc.wait_ready(c))["model"]["state"] == "ready"
        assert lc.torch_loaded(c)  # the check above can see torch: here it is
        kinds = [p.kind for p in next(iter(c.progress_reports.values()))]
        assert kinds[0] == "begin" and kinds[-1] == "end"
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_settings_sent_while_loading_do_not_reload_the_same_models(tmp_path, model_dirs):
    # VS Code's client sends workspace/didChangeConfiguration right after `initialized`, mid-load
    options = {"target": str(model_dirs[0]), "draft": str(model_dirs[1]), "dtype": "fp32"}
    c = await lc.start(tmp_path, options)
    try:
        c.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"specdec": {**options, "maxNewTokens": 8, "serverCommand": ["specdec", "serve"]}}))
        assert (await lc.wait_ready(c))["model"]["state"] == "ready"
        await asyncio.sleep(0.2)  # the end of the progress follows the state
        assert len(c.progress_reports) == 1  # one load, not two
        (reports,) = c.progress_reports.values()
        assert reports[-1].kind == "end" and reports[-1].message == "models ready"
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_inline_completion_and_acceptance_counted(client, tmp_path):
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, SOURCE)
    result = await lc.inline(client, uri, 1, 4, invoked=True)
    assert len(result.items) == 1
    item = result.items[0]
    assert item.insert_text and item.range.start == types.Position(1, 4)
    assert item.command.command == "specdec.accept"
    counted = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=item.command.command, arguments=list(item.command.arguments)))
    assert lc.plain(counted)["counted"] is True
    stats = await lc.stats(client)
    python = stats["languages"]["python"]
    assert python["shown"] == 1 and python["accepted"] == 1 and python["model_requests"] == 1
    assert python["acceptance_rate"] is not None and python["tokens_per_pass"] >= 1



async def test_stats_report_each_drafter_source_per_language_and_repository(client, tmp_path):
    """Issue #34 item 4: `auto` records which drafter drafted each pass; `lookup` alone adds to lookup's row only."""
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, SOURCE)
    assert len((await lc.inline(client, uri, 1, 4, invoked=True)).items) == 1
    sources = (await lc.stats(client))["sources"]
    auto = {row["source"]: row for row in sources["total"]}
    assert auto and set(auto) <= {"lookup", "draft"}
    assert [(r["language"], r["source"]) for r in sources["languages"]] == [("python", s) for s in sorted(auto)]
    assert [(r["workspace"], r["source"]) for r in sources["workspaces"]] == [(str(tmp_path), s) for s in sorted(auto)]
    for row in auto.values():
        assert row["passes"] >= 1 and row["tokens_per_pass"] == (row["accepted"] + row["passes"]) / row["passes"]
        assert 0 < row["share_of_passes"] < 1  # the prefill pass drafts nothing
    total = (await lc.stats(client))["total"]
    assert sum(r["accepted"] for r in auto.values()) / sum(r["drafted"] for r in auto.values()) == \
        pytest.approx(total["acceptance_rate"])  # every drafted token is attributed to one source

    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"specdec": {"strategy": "lookup"}}))
    await asyncio.sleep(0.2)
    assert (await lc.stats(client))["model"]["strategy"] == "lookup"
    other = uri_of(tmp_path, "b.py")
    lc.open_doc(client, other, "def sub(a, b):\n    \n\nprint(sub(1, 2))\nprint(sub(3, 4))\n")
    assert len((await lc.inline(client, other, 1, 4, invoked=True)).items) == 1
    after = {row["source"]: row for row in (await lc.stats(client))["sources"]["total"]}
    assert after["lookup"]["drafted"] > auto.get("lookup", {"drafted": 0})["drafted"]
    draft_counts = [{k: rows["draft"][k] for k in ("drafted", "accepted", "passes")} if "draft" in rows else None
                    for rows in (auto, after)]
    assert draft_counts[0] == draft_counts[1]  # the draft model drafted nothing under lookup


async def test_completion_fallback_item(client, tmp_path):
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, "value = compute\n")
    result = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(0, 15),
        context=types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked)))
    assert len(result.items) == 1
    item = result.items[0]
    assert item.text_edit.new_text.startswith("compute") and item.text_edit.range.start.character == 8
    assert item.command.command == "specdec.accept"


async def test_cancel_request_keeps_server_up(client, tmp_path):
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"debounceMs": 400}))
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, SOURCE)
    task = await lc.cancelled_inline(client, uri, 1, 4, after=0.1)
    with pytest.raises(JsonRpcRequestCancelled):
        await task
    stats = await lc.stats(client)
    assert stats["scheduler"]["cancelled"] == 1
    assert len((await lc.inline(client, uri, 1, 4, invoked=True)).items) == 1


async def test_supersession_and_typeahead(client, tmp_path):
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"debounceMs": 200}))
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, "result = \n")
    first = asyncio.ensure_future(lc.inline(client, uri, 0, 9))
    await asyncio.sleep(0.05)
    second = await lc.inline(client, uri, 0, 9)
    assert (await first).items == ()  # superseded while debouncing
    assert len(second.items) == 1
    suggestion = second.items[0].insert_text
    assert len(suggestion) >= 2
    lc.insert(client, uri, 0, 9, suggestion[:1], version=2)
    typed = await lc.inline(client, uri, 0, 10)
    assert typed.items[0].insert_text == suggestion[1:]
    stats = await lc.stats(client)  # answered by type-ahead, not the model
    assert stats["total"]["typeahead_hits"] == 1 and stats["scheduler"]["superseded"] >= 1


async def test_settings_change_and_bad_settings(client, tmp_path):
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"specdec": {"strategy": "plain"}}))
    await asyncio.sleep(0.2)
    assert (await lc.stats(client))["model"]["strategy"] == "plain"
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"maxNewTokens": "lots"}))
    await asyncio.sleep(0.2)
    assert any("maxNewTokens" in m.message or "max_new_tokens" in m.message for m in client.messages)
    assert (await lc.stats(client))["model"]["strategy"] == "plain"
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"languages": ["go"]}))
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, SOURCE)
    assert (await lc.inline(client, uri, 1, 4, invoked=True)).items == ()


async def test_bad_input_never_kills_the_server(client, tmp_path):
    # unknown URI, positions past the end of a line and of the file
    assert (await lc.inline(client, "file:///nowhere/x.py", 0, 0)).items == ()
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, SOURCE)
    await lc.inline(client, uri, 1, 400, invoked=True)
    await lc.inline(client, uri, 999, 3, invoked=True)
    # UTF-16 positions around a surrogate pair, in a CRLF file
    emoji = uri_of(tmp_path, "emoji.py")
    lc.open_doc(client, emoji, 'x = "😀"\r\ny = \r\n')
    for character in range(0, 9):
        await lc.inline(client, emoji, 0, character, invoked=True)
    result = await lc.inline(client, emoji, 1, 4, invoked=True)
    assert len(result.items) == 1 and "\r" not in result.items[0].insert_text[:1]
    # a 10 MB file, a binary file, a language without a grammar
    big = uri_of(tmp_path, "big.py")
    lc.open_doc(client, big, "x = 1\n" * 1_750_000 + "def f():\n    \n")
    start = time.perf_counter()
    assert len((await lc.inline(client, big, 1_750_001, 4, invoked=True)).items) == 1
    assert time.perf_counter() - start < 30
    binary = uri_of(tmp_path, "blob.py")
    lc.open_doc(client, binary, "\0\1\2garbage")
    assert (await lc.inline(client, binary, 0, 3, invoked=True)).items == ()
    lua = uri_of(tmp_path, "init.lua")
    lc.open_doc(client, lua, "local function f()\n  \nend\n", language="lua")
    assert len((await lc.inline(client, lua, 1, 2, invoked=True)).items) == 1
    # malformed JSON-RPC on the wire
    for raw in (b"Content-Length: 9\r\n\r\n{garbage}",
                b'Content-Length: 42\r\n\r\n{"jsonrpc": "2.0", "id": 99, "method": 12}',
                b'Content-Length: 2\r\n\r\n[]'):
        result = client.protocol.writer.write(raw)
        if asyncio.iscoroutine(result):
            await result
    await asyncio.sleep(0.3)
    stats = await lc.stats(client)
    assert stats["model"]["state"] == "ready"


async def test_model_that_fails_to_load_answers_empty(tmp_path):
    c = await lc.start(tmp_path, {"target": str(tmp_path / "missing-model"), "draft": ""})
    try:
        s = await lc.wait_ready(c)
        assert s["model"]["state"] == "failed" and "missing-model" in s["model"]["error"]
        uri = uri_of(tmp_path)
        lc.open_doc(c, uri, SOURCE)
        assert (await lc.inline(c, uri, 1, 4, invoked=True)).items == ()
        assert any("failed" in m.message for m in c.messages)
    finally:
        await c.shutdown_session()
        await c.stop()


def bare_server(tmp_path, monkeypatch):
    """A server object without a transport: settings handling only, messages collected."""
    from lsp_server.metrics import MetricsStore
    from lsp_server.server import SpecdecServer

    server = SpecdecServer(MetricsStore(tmp_path / "m.jsonl"))
    messages = []
    monkeypatch.setattr(server, "window_show_message", lambda params: messages.append(params.message))
    return server, messages


def test_an_out_of_range_port_is_refused_and_does_not_poison_later_changes(tmp_path, monkeypatch):
    """Issue #30 item 4: prometheusPort 70000 raised OverflowError, stayed, and broke every later change."""
    from lsp_server.settings import Settings

    server, messages = bare_server(tmp_path, monkeypatch)
    server.configuration.apply({"strategy": "plain", "prometheusPort": 70000})
    assert server.settings == server.service.settings == Settings()
    assert len(messages) == 1 and "prometheusPort" in messages[0] and "65535" in messages[0]
    server.configuration.apply({"strategy": "lookup"})
    assert server.settings.strategy == server.service.settings.strategy == "lookup" and len(messages) == 1


def test_an_endpoint_that_fails_to_start_applies_nothing(tmp_path, monkeypatch):
    """Issue #30 item 4: stats said 'plain' while the engine still drafted; now it is all or nothing."""
    server, messages = bare_server(tmp_path, monkeypatch)
    commits = []
    server.host.state = "ready"
    monkeypatch.setattr(server.host, "reconfigure", lambda settings: lambda: commits.append(settings), raising=False)
    monkeypatch.setattr(server.host, "apply", lambda settings: commits.append(settings) or True)

    def in_use(port, host="127.0.0.1"):
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(server.metrics, "serve_prometheus", in_use)
    server.configuration.apply({"strategy": "plain", "prometheusPort": 9464})
    assert server.settings.strategy == "auto" and server.settings.prometheus_port == 0 and commits == []
    assert "prometheusPort 9464" in messages[-1] and "in use" in messages[-1]
    server.configuration.apply({"strategy": "plain"})
    assert server.settings.strategy == "plain" and [c.strategy for c in commits] == ["plain"]


async def test_switching_strategies_while_completing_answers_every_request(client, tmp_path):
    """Issue #30 item 6 under the LSP: strategy switches during generations fail no request."""
    uris = [uri_of(tmp_path, f"race{i}.py") for i in range(3)]
    for i, uri in enumerate(uris):
        lc.open_doc(client, uri, f"def add{i}(a, b):\n    \n\nprint(add{i}(1, 2))\n")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"maxNewTokens": 256, "multiline": True}))
    strategies = ["plain", "draft", "plain", "lookup", "plain", "auto"]
    tasks, switches, deadline = [], 0, time.monotonic() + 90
    for _ in range(6):
        tasks += [asyncio.ensure_future(lc.inline(client, uri, 1, 4, invoked=True)) for uri in uris]
        # switch strategies while they generate
        while not all(t.done() for t in tasks[-len(uris):]) and time.monotonic() < deadline:
            strategy = strategies[switches % len(strategies)]
            client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
                settings={"specdec": {"strategy": strategy, "maxDraft": 1 + switches % 6}}))
            switches += 1
            await asyncio.sleep(0.02)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert all(isinstance(r, types.InlineCompletionList) for r in results)  # every request answered
    stats = await lc.stats(client)
    assert stats["scheduler"]["errors"] == 0 and stats["model"]["state"] == "ready", (stats["scheduler"], switches)
    assert not any(m.type == types.MessageType.Error for m in client.messages)
    assert len((await lc.inline(client, uris[0], 1, 4, invoked=True)).items) == 1


async def test_trace_request_returns_the_passes_of_the_documents_last_completions(client, tmp_path):
    """specdec/trace (issue #44 item 4): the --trace-json shape per completion, newest last; p and q recorded from
    the first ask on; a closed document's traces are gone; bad params are an error answer, the server goes on."""
    uri, other = uri_of(tmp_path), uri_of(tmp_path, "b.py")
    lc.open_doc(client, uri, SOURCE)
    shown = await lc.inline(client, uri, 1, 4, invoked=True)
    assert len(shown.items) == 1
    reply = lc.plain(await client.protocol.send_request_async("specdec/trace", {"uri": uri, "limit": 4}))
    (trace,) = reply["traces"]
    assert reply["uri"] == uri and trace["shown"] == shown.items[0].insert_text and trace["strategy"] == "auto"
    assert tiny.tokenizer().decode(trace["tokens"]) == trace["text"] and "".join(trace["pieces"]) == trace["text"]
    assert len(trace["passes"]) == trace["summary"]["target_passes"] and trace["passes"][0]["prefill"]
    assert not trace["probabilities"] and all(p["p"] is None for p in trace["passes"])  # nobody had asked yet

    lc.open_doc(client, other, "def sub(a, b):\n    \n\nprint(sub(1, 2))\nprint(sub(3, 4))\n")
    assert len((await lc.inline(client, other, 1, 4, invoked=True)).items) == 1
    (asked,) = lc.plain(await client.protocol.send_request_async("specdec/trace", {"uri": other}))["traces"]
    assert asked["probabilities"] and all(len(p["p"]) == len(p["q"]) == len(p["tokens"]) for p in asked["passes"])
    assert len(lc.plain(await client.protocol.send_request_async("specdec/trace", {"uri": uri}))["traces"]) == 1

    with pytest.raises(Exception, match="specdec/trace needs params"):
        await client.protocol.send_request_async("specdec/trace", {"limit": 2})
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
    assert lc.plain(await client.protocol.send_request_async("specdec/trace", {"uri": uri}))["traces"] == []
    assert (await lc.stats(client))["model"]["state"] == "ready"


async def test_next_edit_answers_the_models_edit_from_the_documents_recent_edits(client, tmp_path, model_dirs):
    """specdec/nextEdit (issue #51 item 2): the document's edits since it opened (didChange deltas as hunks) and the
    window around the cursor make the prompt; the answer is the engine's own greedy window and the edit it makes,
    the same as NextEditor gives offline for that text, line and history; bad params are an error answer."""
    from lsp_server.documents import ChunkedText
    from lsp_server.edit_history import EditHistory
    from specdec.backends.local import LoadSpec, build
    from specdec.engine.session import GenerationConfig
    from specdec.prompts.next_edit import DEFAULT_MAX_NEW_TOKENS, NextEditor

    text = "def area(w, h):\n    size = w * h\n    return size\n\nprint(area(2, 3))\n"
    uri = uri_of(tmp_path)
    lc.open_doc(client, uri, text)
    rename = types.Range(types.Position(1, 4), types.Position(1, 8))
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [types.TextDocumentContentChangePartial(range=rename, text="area_")]))
    reply = lc.plain(await client.protocol.send_request_async(
        "specdec/nextEdit", {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 4}}))

    before = ChunkedText.of(text)
    start = text.index("size")
    after = before.edit(start, start + 4, "area_")
    history = EditHistory()
    history.change(uri, before, start, start + 4, "area_")
    hunks = history.hunks(uri, "a.py", after)
    assert len(hunks) == 1 and "area_ = w * h" in hunks[0].updated
    built = build(LoadSpec(str(model_dirs[0]), strategy="plain", dtype="fp32"))
    editor = NextEditor.for_session(built.completer.session)
    expected = editor.predict(str(after), 2, GenerationConfig(DEFAULT_MAX_NEW_TOKENS), "a.py", hunks)
    assert reply["window"] == expected.updated
    assert reply["edit"] == (expected.edit.as_json() if expected.edit else None)
    assert reply["stats"]["target_passes"] >= 1 and reply["stats"]["strategy"]

    with pytest.raises(Exception, match="specdec/nextEdit takes"):
        await client.protocol.send_request_async("specdec/nextEdit", {"textDocument": {"uri": uri}})
    with pytest.raises(Exception, match="is not open"):
        await client.protocol.send_request_async(
            "specdec/nextEdit", {"textDocument": {"uri": uri_of(tmp_path, "b.py")}, "position": {"line": 0,
                                                                                                "character": 0}})
    assert (await lc.stats(client))["model"]["state"] == "ready"
