"""The repository's best chunks for a cursor, as prompt context for an engine that reads no index of ours.

Which chunks: the places the repo drafter drafts from. The text before the cursor is tokenized and its end looked up
in the repository index (`RepoIndex.locate`: the longest match first, then shorter ones down to MIN_MATCH tokens,
documents with more occurrences first), outside the document being completed and outside accepted completions
(fragments without a file); each found document gives one chunk, the whole lines around its first occurrence
(BEFORE_TOKENS before the match's end, AFTER_TOKENS after it: what followed is what the model should see).

Loads no model and builds no prompt: it is handed the index and the tokenizer whose ids the index holds, and
returns `{"filename", "text"}` chunks, best first; the caller fits them to its budget and its prompt format.
"""

from __future__ import annotations

import os

from specdec.engine.drafters.repo_index import vocabulary_of

QUERY_CHARS = 600  # of the text before the cursor, tokenized for the lookup (the index matches <= 32 tokens)
MIN_MATCH = 4  # tokens: a shorter match is a common word, not a related place
BEFORE_TOKENS = 64  # of a chunk, before the match's end
AFTER_TOKENS = 192  # and after it
DOCUMENTS = 4  # chunks at most (one per document)


def best_chunks(index, tokenizer, before: str, exclude: str | None = None, workspace: str = "",
                documents: int = DOCUMENTS) -> list[dict]:
    """[{"filename", "text"}], best first; [] when the index holds nothing like the text before the cursor.

    exclude: the index key of the document being completed; workspace: its folder (chunk file names are relative
    to it, as the prompt names the file being completed)."""
    tail = before[-QUERY_CHARS:]
    if len(before) > QUERY_CHARS and "\n" in tail:
        tail = tail[tail.index("\n") + 1:]  # from a line's start: no token split by the cut
    context = tokenizer.encode(tail, add_special_tokens=False) if tail else []
    if not context:
        return []
    located = index.locate(context, exclude, MIN_MATCH, documents * 2, vocabulary=vocabulary_of(tokenizer))
    root = os.path.realpath(workspace) if workspace else ""
    chunks = []
    for place in located:
        if not os.path.isabs(place.key):  # an accepted completion: a fragment, not a file
            continue
        lo, hi = max(0, place.offset - BEFORE_TOKENS), min(len(place.tokens), place.offset + AFTER_TOKENS)
        text = tokenizer.decode([int(t) for t in place.tokens[lo:hi]])
        if lo > 0 and "\n" in text:
            text = text[text.index("\n") + 1:]
        if hi < len(place.tokens) and "\n" in text:
            text = text[: text.rindex("\n") + 1]
        if text.strip():
            chunks.append({"filename": filename(place.key, root), "text": text})
        if len(chunks) == documents:
            break
    return chunks


def filename(key: str, root: str) -> str:
    """The chunk's file as the prompt names it: relative to the workspace folder, else its base name."""
    if root and key.startswith(root.rstrip(os.sep) + os.sep):
        return os.path.relpath(key, root)
    return os.path.basename(key)
