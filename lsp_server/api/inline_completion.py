"""textDocument/inlineCompletion (LSP 3.18): the ghost text at the cursor, with the command that counts its
acceptance."""

from __future__ import annotations

from lsprotocol import types

from lsp_server.api.accept import accepted_command
from lsp_server.cursor import build_request
from lsp_server.snapshot import take

METHOD = types.TEXT_DOCUMENT_INLINE_COMPLETION
OPTIONS = types.InlineCompletionOptions()


def inline_item(position: types.Position, suggestion) -> types.InlineCompletionItem:
    """The suggestion inserted at the cursor (it already holds any line break it needs: syntax.finalize)."""
    return types.InlineCompletionItem(insert_text=suggestion.text, range=types.Range(position, position),
                                      command=accepted_command(suggestion))


async def handle(ls, params: types.InlineCompletionParams):
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    snapshot = take(ls, params.text_document.uri)
    request = build_request(snapshot, params.position, invoked) if snapshot else None
    suggestion = await ls.service.complete(request) if request else None
    if suggestion is None:
        return types.InlineCompletionList(items=[])
    return types.InlineCompletionList(items=[inline_item(params.position, suggestion)])
