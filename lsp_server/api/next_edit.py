"""specdec/nextEdit {"textDocument": {"uri"}, "position": {"line", "character"}}: the next edit around the cursor
(issue #51): the window of lines around it rewritten by the model from the file's last commits' hunks
(specdec/prompts/git_history.py) and the document's recent edits (lsp_server/edit_history.py), answered as the smallest range that changed and its new text, in the client's
position encoding: {"edit": {"range": {"start", "end"}, "text"} or null, "window": the updated window,
"stats": the generation's}. null when the window came back unchanged. Cancelled like a completion."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcInvalidRequest

from lsp_server.cursor import uri_path, workspace_for
from lsp_server.documents import count_units, unit_kind
from lsp_server.snapshot import take

METHOD = "specdec/nextEdit"


def parse_params(params) -> tuple[str, types.Position]:
    """(uri, position), or a one-line refusal."""
    def field(obj, name):
        return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)

    document, position = field(params, "textDocument"), field(params, "position")
    uri = field(document, "uri")
    line, character = field(position, "line"), field(position, "character")
    if not isinstance(uri, str) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                           for v in (line, character)):
        raise JsonRpcInvalidParams(f"{METHOD} takes {{textDocument: {{uri}}, position: {{line, character}}}} with "
                                   "a string URI and non-negative integers")
    return uri, types.Position(line, character)


def lsp_position(text, line: int, character: int, kind: str) -> dict:
    """A (line, character in code points) of the document as the client counts it."""
    start = text.line_start(line)
    if start < 0:
        return {"line": line, "character": character}
    return {"line": line, "character": count_units(text[start : start + character], kind)}


async def handle(ls, params=None):
    uri, position = parse_params(params)
    snapshot = take(ls, uri)
    if snapshot is None:
        raise JsonRpcInvalidParams(f"{METHOD}: {uri} is not open")
    if snapshot.remote:
        raise JsonRpcInvalidRequest(f"{METHOD}: next edits need the local engine (engine is {ls.host.kind})")
    if not ls.host.ready:
        return {"edit": None, "window": None, "stats": None, "reason": f"model {ls.host.state}"}
    text, encoding = snapshot.document.text, snapshot.encoding
    line = text.line_of(text.cursor_offset(position, encoding))
    path = uri_path(uri)
    workspace = workspace_for(list(snapshot.workspace_roots), path)
    relative = str(Path(path).relative_to(workspace)) if workspace else Path(path).name
    # the file's last commits' hunks (the oldest first), then the document's own edits since it opened
    from specdec.prompts.git_history import commit_hunks

    history = await asyncio.to_thread(commit_hunks, path) + ls.edits.hunks(uri, relative, text)
    from specdec.engine.session import CancelToken

    token = CancelToken()
    job = asyncio.get_running_loop().run_in_executor(ls.host.executor, ls.host.next_edit, str(text), line, relative,
                                                     history, token)
    try:
        result = await asyncio.shield(job)
    except asyncio.CancelledError:  # $/cancelRequest: the decode loop stops at its next step
        token.cancel()
        raise
    edit, kind = result.edit, unit_kind(encoding)
    answer = None if edit is None else {
        "range": {"start": lsp_position(text, edit.start_line, edit.start_character, kind),
                  "end": lsp_position(text, edit.end_line, edit.end_character, kind)},
        "text": edit.text}
    stats = result.generation.stats.as_dict()
    stats["strategy"] = result.generation.trace.strategy if result.generation.trace is not None else ""
    return {"edit": answer, "window": result.updated, "stats": stats, "reason": "" if answer else
            ("unchanged" if result.generation.stop_reason == "eos" else result.generation.stop_reason)}
