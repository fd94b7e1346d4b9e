"""Start `specdec serve` as a real subprocess over stdio and drive it with pytest-lsp's client."""

from __future__ import annotations

import asyncio
import sys
import time

from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities


async def start(tmp_path, options: dict, env: dict | None = None, workspace=None, capabilities="visual-studio-code",
                folders=None, initialized: bool = True):
    """initialized=False: only `initialize` is sent; the server starts loading its models on `initialized`."""
    import os

    server_env = {**os.environ, "SPECDEC_STATE_DIR": str(tmp_path / "state"), "SPECDEC_DATA_DIR": str(tmp_path / "data"),
                  "SPECDEC_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", **(env or {})}
    config = ClientServerConfig(server_command=[sys.executable, "-m", "specdec.cli", "serve", "--log-level", "info"],
                                server_env=server_env)
    client = await config.start()
    workspace = workspace or tmp_path
    started = time.perf_counter()
    params = types.InitializeParams(
        capabilities=client_capabilities(capabilities), initialization_options=options,
        workspace_folders=[types.WorkspaceFolder(f.as_uri(), f.name) for f in (folders or [workspace])],
        root_uri=workspace.as_uri())
    if initialized:
        result = await client.initialize_session(params)
    else:
        client.capabilities, params.process_id = params.capabilities, os.getpid()
        result = await client.initialize_async(params)
    client.initialize_seconds = time.perf_counter() - started
    client.initialize_result = result
    return client


def torch_loaded(client) -> bool:
    """Whether the server process has torch's native libraries mapped (Linux: /proc/PID/maps)."""
    from pathlib import Path

    return "libtorch" in Path(f"/proc/{client._server.pid}/maps").read_text()


def plain(value):
    """pygls hands custom responses back as nested namedtuples; tests want dicts."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def stats(client) -> dict:
    return plain(await client.protocol.send_request_async("specdec/stats", {}))


async def wait_ready(client, timeout: float = 900) -> dict:
    """The stats once the server reports its models ready (or failed). The ceiling is generous: a machine busy
    with other work (CI beside a compile) may take minutes where a quiet one takes seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = await stats(client)
        if s["model"]["state"] in ("ready", "failed"):
            return s
        await asyncio.sleep(0.1)
    raise TimeoutError(f"models did not load in {timeout:.0f} s")


def open_doc(client, uri: str, text: str, language: str = "python", version: int = 1) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))


def insert(client, uri: str, line: int, character: int, text: str, version: int) -> None:
    here = types.Position(line, character)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        [types.TextDocumentContentChangePartial(range=types.Range(here, here), text=text)]))


async def inline(client, uri: str, line: int, character: int, invoked: bool = False):
    kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=kind),
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, character)))


async def cancelled_inline(client, uri: str, line: int, character: int, after: float):
    """Send an inline request, then `$/cancelRequest` for it `after` seconds later, as an editor does."""
    import uuid

    msg_id = str(uuid.uuid4())
    params = types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, character))
    task = asyncio.ensure_future(client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params,
                                                                    msg_id=msg_id))
    await asyncio.sleep(after)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    return task
