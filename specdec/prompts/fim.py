"""Fill-in-the-middle prompts for the code model families, detected from the tokenizer.

The prompt is built in token space with budgets: the prefix is trimmed by whole lines
from the top (so the start of the prompt, and with it the KV cache, stays put while
the user types), the suffix by tokens from the end.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class FimTemplate:
    family: str
    prefix: str
    suffix: str
    middle: str
    order: str = "psm"  # psm: prefix, suffix, middle; spm: suffix, prefix, middle
    stop_tokens: tuple[str, ...] = ()
    file_header: str = ""  # format with {path}; prepended where the family uses one
    begin: str = ""  # text before the whole prompt (e.g. BOS written as text)


TEMPLATES: dict[str, FimTemplate] = {
    t.family: t
    for t in (
        FimTemplate("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                    stop_tokens=("<|endoftext|>", "<|file_sep|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>",
                                 "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                    file_header="<|file_sep|>{path}\n"),  # repo-level format: other files, then this one
        FimTemplate("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                    stop_tokens=("<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                    file_header="<file_sep>{path}\n"),
        FimTemplate("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", stop_tokens=("▁<EOT>", "</s>")),
        FimTemplate("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                    stop_tokens=("<｜end▁of▁sentence｜>", "<|EOT|>")),
        FimTemplate("codestral", "[PREFIX]", "[SUFFIX]", "", order="spm", stop_tokens=("</s>",)),
    )
}


def markers(tokenizer, template: FimTemplate):
    """The template's markers as token ids, so a drafter can find the text before the cursor in a prompt."""
    from specdec.engine.drafters.repo import PromptMarkers

    vocab = tokenizer.get_vocab()
    return PromptMarkers(vocab.get(template.prefix), vocab.get(template.suffix),
                         vocab.get(template.middle) if template.middle else None)


ORDERS = ("psm", "spm")


def in_order(template: FimTemplate, order: str = "") -> FimTemplate:
    """The template with its sections in `order` ("": the family's own). Suffix-first (spm) keeps the text after
    the cursor before the text being typed, so a keystroke leaves the whole cached prompt but its last tokens in
    place (psm puts the suffix after the typed text: every keystroke re-prefills it). A family without a middle
    marker ends the prompt with the prefix, so it has only its own order."""
    if not order or order == template.order:
        return template
    if order not in ORDERS:
        raise SpecdecError(f"unknown FIM order {order!r}; known: {', '.join(ORDERS)}")
    if not template.middle:
        raise SpecdecError(f"{template.family} prompts have no middle marker: only {template.order} order")
    return replace(template, order=order)


def detect(tokenizer, override: str | None = None, order: str = "") -> FimTemplate:
    """Pick the family whose FIM special tokens the tokenizer knows; order: see in_order."""
    if override:
        if override not in TEMPLATES:
            raise SpecdecError(f"unknown FIM family {override!r}; known: {', '.join(TEMPLATES)}")
        return in_order(TEMPLATES[override], order)
    vocab = tokenizer.get_vocab()
    for template in TEMPLATES.values():
        if template.prefix in vocab and template.suffix in vocab and (not template.middle or template.middle in vocab):
            return in_order(template, order)
    raise SpecdecError("the tokenizer has no fill-in-the-middle tokens of a known family "
                       f"({', '.join(TEMPLATES)}); set the FIM family explicitly")


def stop_token_ids(tokenizer, template: FimTemplate) -> set[int]:
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in template.stop_tokens if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


@dataclass(frozen=True)
class FimPrompt:
    ids: list[int]
    prefix_tokens: int
    suffix_tokens: int
    # leading ids the prompt at the next keystrokes on the cursor's line shares (up to the lines above the cursor,
    # less a margin for the tokens a line break can merge into): worth prefilling even for a superseded request
    stable: int = 0


@functools.lru_cache(maxsize=256)
def token_id(tokenizer, text: str) -> int | None:
    """The id of the token spelt `text` (a marker), or None. Looked up once per tokenizer and text: get_vocab()
    builds the whole vocabulary as a dict, 0.1 s a call with Qwen's 152k tokens, which every keystroke paid."""
    return tokenizer.get_vocab().get(text)


def build(tokenizer, template: FimTemplate, prefix: str, suffix: str, path: str | None = None,
          max_prefix_tokens: int = 1024, max_suffix_tokens: int = 256, context: str = "") -> FimPrompt:
    """Token ids of a FIM prompt; `context` (other files, in the family's file-separator format) comes first."""

    def special(text: str) -> list[int]:
        marker = token_id(tokenizer, text)
        return [marker] if marker is not None else encode(text)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) if text else []

    prefix_text, prefix_ids = _kept_prefix(tokenizer, prefix, max_prefix_tokens)
    _, suffix_ids = _kept_suffix(tokenizer, suffix, max_suffix_tokens)
    header = encode(template.file_header.format(path=path)) if template.file_header and path else []
    head = encode(template.begin) + encode(context) + header
    if template.order == "spm":
        before_prefix = head + special(template.suffix) + suffix_ids + special(template.prefix)
        body = special(template.suffix) + suffix_ids + special(template.prefix) + prefix_ids
    else:
        before_prefix = head + special(template.prefix)
        body = special(template.prefix) + prefix_ids + special(template.suffix) + suffix_ids
    tail = special(template.middle) if template.middle else []
    # the ids before the cursor's line: all but the line's own (encoded alone, it costs the line, not the prefix;
    # where the split differs at the line break the margin takes it, and a miss only costs a recomputed token)
    lines_above = len(prefix_ids) - len(encode(prefix_text[prefix_text.rfind("\n") + 1 :]))
    stable = len(before_prefix) + max(0, lines_above - 2)
    return FimPrompt(head + body + tail, len(prefix_ids), len(suffix_ids), stable)


def window(tokenizer, prefix: str, suffix: str, max_prefix_tokens: int = 1024,
           max_suffix_tokens: int = 256) -> tuple[str, str]:
    """The text before and after the cursor that `build` keeps under these budgets, for a client that must
    send another server (llama.cpp's /infill, a remote engine's raw prompt) what our prompt holds: the same
    whole lines above the cursor, and the suffix up to the same token. Where a budget cuts inside the text
    (a typed line longer than the prefix budget, the suffix's last token), the text is the kept ids decoded.
    `tokenizer` needs only encode and decode (specdec.backends.remote.tokens.EstimatedTokenizer counts
    characters where the target's tokenizer is not at hand)."""
    return _kept_prefix(tokenizer, prefix, max_prefix_tokens)[0], _kept_suffix(tokenizer, suffix, max_suffix_tokens)[0]


def _prefix_start(tokenizer, lines: list[str], budget: int, grid: int = 16) -> int:
    """The first of the complete lines above the cursor line that the prefix keeps (see _kept_prefix)."""
    complete = lines[:-1]
    room = budget - min(budget // 2, 64)  # reserve for the line being typed
    counts: list[int] = []
    total = 0
    for line in reversed(complete):
        n = len(tokenizer.encode(line[-budget * 8 :] + "\n", add_special_tokens=False))
        if total + n > room:
            break
        counts.append(n)
        total += n
    start = len(complete) - len(counts)
    grid = max(1, min(grid, len(counts) // 4))  # never round away more than a quarter of what fits
    if start > 0:
        start = min(len(complete), -(-start // grid) * grid)
    return start


def _kept_prefix(tokenizer, prefix: str, budget: int, grid: int = 16) -> tuple[str, list[int]]:
    """The last whole lines that fit the budget, starting on a line number that is a multiple of `grid`, as
    (text, ids).

    Only the complete lines above the cursor decide where the cut falls (the line being
    typed gets a reserve), so the cut point, and with it every cached token of the prompt
    before the cursor, stays put while the user types; the grid keeps it put across Enter too.
    """
    lines = prefix.split("\n")
    start = _prefix_start(tokenizer, lines, budget, grid)
    typed = lines[-1][-budget * 8 :]  # one enormous line (minified code) must not be tokenized whole
    text = "\n".join(lines[start:-1] + [typed])
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    if len(ids) > budget:
        text, ids = _whole_characters(tokenizer, ids[-budget:], text, at_end=False)
    return text, ids


def _kept_suffix(tokenizer, suffix: str, budget: int) -> tuple[str, list[int]]:
    """The suffix's first `budget` tokens, as (text, ids)."""
    # char pre-cut keeps a 10 MB file from being tokenized whole; ~1 token per 2 chars is generous
    text = suffix[: budget * 8]
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    if len(ids) > budget:
        text, ids = _whole_characters(tokenizer, ids[:budget], text, at_end=True)
    return text, ids


def _whole_characters(tokenizer, ids: list[int], source: str, at_end: bool) -> tuple[str, list[int]]:
    """The text of ids a budget cut out of `source` at its end (at_end) or its start, without the tokens of a
    character the cut split (byte-level BPE spells a character in several tokens; decoded alone, its bytes
    are U+FFFD, text the document never held)."""
    text = tokenizer.decode(ids)
    while ids and "\ufffd" in (text[-1:] if at_end else text[:1]) and \
            not (source.startswith(text) if at_end else source.endswith(text)):
        ids = ids[:-1] if at_end else ids[1:]
        text = tokenizer.decode(ids)
    return text, ids
