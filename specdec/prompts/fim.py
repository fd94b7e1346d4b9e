"""Fill-in-the-middle prompts for the code model families, detected from the tokenizer.

The prompt is built in token space with budgets: the prefix is trimmed by whole lines
from the top (so the start of the prompt, and with it the KV cache, stays put while
the user types), the suffix by tokens from the end.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def detect(tokenizer, override: str | None = None) -> FimTemplate:
    """Pick the family whose FIM special tokens the tokenizer knows."""
    if override:
        if override not in TEMPLATES:
            raise SpecdecError(f"unknown FIM family {override!r}; known: {', '.join(TEMPLATES)}")
        return TEMPLATES[override]
    vocab = tokenizer.get_vocab()
    for template in TEMPLATES.values():
        if template.prefix in vocab and template.suffix in vocab and (not template.middle or template.middle in vocab):
            return template
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


def build(tokenizer, template: FimTemplate, prefix: str, suffix: str, path: str | None = None,
          max_prefix_tokens: int = 1024, max_suffix_tokens: int = 256, context: str = "") -> FimPrompt:
    """Token ids of a FIM prompt; `context` (other files, in the family's file-separator format) comes first."""
    vocab = tokenizer.get_vocab()

    def special(text: str) -> list[int]:
        return [vocab[text]] if text in vocab else encode(text)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) if text else []

    prefix_ids = _trim_prefix(tokenizer, prefix, max_prefix_tokens)
    # char pre-cut keeps a 10 MB file from being tokenized whole; ~1 token per 2 chars is generous
    suffix_ids = encode(suffix[: max_suffix_tokens * 8])[:max_suffix_tokens]
    header = encode(template.file_header.format(path=path)) if template.file_header and path else []
    head = encode(template.begin) + encode(context) + header
    if template.order == "spm":
        body = special(template.suffix) + suffix_ids + special(template.prefix) + prefix_ids
    else:
        body = special(template.prefix) + prefix_ids + special(template.suffix) + suffix_ids
    tail = special(template.middle) if template.middle else []
    return FimPrompt(head + body + tail, len(prefix_ids), len(suffix_ids))


def window(tokenizer, prefix: str, suffix: str, max_prefix_tokens: int = 1024,
           max_suffix_tokens: int = 256) -> tuple[str, str]:
    """The text before and after the cursor that `build` keeps under these budgets, for a client that must
    send another server (llama.cpp's /infill) what our prompt holds: the same whole lines above the cursor,
    and the suffix up to the same token. (A typed line too long for the budget alone is kept whole here.)"""
    lines = prefix.split("\n")
    kept_prefix = "\n".join(lines[_prefix_start(tokenizer, lines, max_prefix_tokens):])
    ids = tokenizer.encode(suffix[: max_suffix_tokens * 8], add_special_tokens=False) if suffix else []
    kept_suffix = tokenizer.decode(ids[:max_suffix_tokens]) if len(ids) > max_suffix_tokens else \
        suffix[: max_suffix_tokens * 8]
    return kept_prefix, kept_suffix


def _prefix_start(tokenizer, lines: list[str], budget: int, grid: int = 16) -> int:
    """The first of the complete lines above the cursor line that the prefix keeps (see _trim_prefix)."""
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


def _trim_prefix(tokenizer, prefix: str, budget: int, grid: int = 16) -> list[int]:
    """The last whole lines that fit the budget, starting on a line number that is a multiple of `grid`.

    Only the complete lines above the cursor decide where the cut falls (the line being
    typed gets a reserve), so the cut point, and with it every cached token of the prompt
    before the cursor, stays put while the user types; the grid keeps it put across Enter too.
    """
    lines = prefix.split("\n")
    start = _prefix_start(tokenizer, lines, budget, grid)
    typed = lines[-1][-budget * 8 :]  # one enormous line (minified code) must not be tokenized whole
    text = "\n".join(lines[start:-1] + [typed])
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    return ids[-budget:] if len(ids) > budget else ids
