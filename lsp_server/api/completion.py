"""textDocument/completion: the same suggestion as one menu item, for clients without inline completion."""

from __future__ import annotations

from lsprotocol import types

from lsp_server.api.accept import accepted_command
from lsp_server.cursor import build_request
from lsp_server.snapshot import take

METHOD = types.TEXT_DOCUMENT_COMPLETION
OPTIONS = types.CompletionOptions(trigger_characters=[".", "(", " "], resolve_provider=False)
WORD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"


async def handle(ls, params: types.CompletionParams):
    invoked = params.context is None or params.context.trigger_kind == types.CompletionTriggerKind.Invoked
    snapshot = take(ls, params.text_document.uri)
    request = build_request(snapshot, params.position, invoked) if snapshot else None
    suggestion = await ls.service.complete(request) if request else None
    if suggestion is None:
        return types.CompletionList(is_incomplete=True, items=[])
    # clients filter by the word before the cursor, so the item replaces that word
    word = len(request.completion.prefix) - len(request.completion.prefix.rstrip(WORD))
    word_text = request.completion.prefix[len(request.completion.prefix) - word :]
    start = types.Position(params.position.line, max(0, params.position.character - len(word_text.encode(
        "utf-16-le")) // 2))
    new_text = word_text + suggestion.text
    return types.CompletionList(is_incomplete=True, items=[types.CompletionItem(
        label=new_text.split("\n")[0][:80] or new_text[:80], kind=types.CompletionItemKind.Snippet,
        detail="specdec", filter_text=new_text, sort_text="0", insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(types.Range(start, params.position), new_text), command=accepted_command(suggestion))])
