"""Training samples from a repository's own code, in the target family's FIM format.

Three kinds, mixed: fill-in-the-middle with a random span, fill-in-the-middle with a span
that is a whole tree-sitter node (a statement, a call, a block: what an editor hole looks
like), and plain left-to-right windows. Files are split into train and held-out sets by
file, deterministically from the seed, so evaluation never sees trained-on code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from specdec.repository.files import HOLDOUT, FileSelection, read_file, split_heldout
from specdec.prompts import fim
from specdec.prompts.languages import EXTENSIONS, parser_for

NODE_CHARS = (16, 400)  # tree-sitter spans of a size an editor completion has


@dataclass
class SourceText:
    path: str
    language: str
    text: str


@dataclass
class Split:
    train: list[SourceText] = field(default_factory=list)
    heldout: list[SourceText] = field(default_factory=list)

    def summary(self) -> dict:
        def count(files):
            by_lang: dict[str, int] = {}
            for f in files:
                by_lang[f.language] = by_lang.get(f.language, 0) + 1
            return {"files": len(files), "chars": sum(len(f.text) for f in files), "languages": by_lang}

        return {"train": count(self.train), "heldout": count(self.heldout)}


def split_files(selection: FileSelection, holdout: float = HOLDOUT, seed: int = 0) -> Split:
    """The selected files' text, split by file. Read through the filter's reader (nothing outside the root); a
    file gone or unreadable since it was selected is left out."""
    def read(rels: list[Path]) -> list[SourceText]:
        texts = []
        for rel in rels:
            try:
                text = read_file(selection.root, rel).decode("utf-8", "replace")
            except OSError:
                continue
            texts.append(SourceText(rel.as_posix(), EXTENSIONS.get(rel.suffix.lower(), "plaintext"), text))
        return texts

    train, heldout = split_heldout(selection.files, holdout, seed)
    return Split(train=read(train), heldout=read(heldout))


def node_spans(language: str, text: str) -> list[tuple[int, int]]:
    """Character spans of named tree-sitter nodes of editor-completion size (none without a grammar)."""
    parser = parser_for(language)
    if parser is None:
        return []
    data = text.encode("utf-8")
    spans, stack = [], [parser.parse(data).root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.named_children)
        size = node.end_byte - node.start_byte
        if node.is_named and NODE_CHARS[0] <= size <= NODE_CHARS[1] and node.type not in ("comment", "string"):
            start = len(data[: node.start_byte].decode("utf-8", "replace"))
            end = start + len(data[node.start_byte : node.end_byte].decode("utf-8", "replace"))
            spans.append((start, end))
    return spans


class VocabOnce:
    """A tokenizer whose get_vocab is read once: fim.build asks for the vocabulary in every prompt it builds, and
    Qwen's 151,646 entries take 70 ms a time (20 s of the samples of a 4-minute fine-tune). Everything else is
    the tokenizer's."""

    def __init__(self, tokenizer):
        self._tokenizer, self._vocab = tokenizer, None

    def get_vocab(self) -> dict:
        if self._vocab is None:
            self._vocab = self._tokenizer.get_vocab()
        return self._vocab

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@dataclass
class SampleBuilder:
    tokenizer: object
    template: fim.FimTemplate
    seq_len: int = 384
    fim_rate: float = 0.7  # the rest are left-to-right windows
    node_rate: float = 0.6  # of the FIM samples, spans aligned to tree-sitter nodes
    _prompts: VocabOnce = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self._prompts = VocabOnce(self.tokenizer)

    def fim_ids(self, prefix: str, middle: str, suffix: str) -> list[int]:
        budget = self.seq_len // 2
        prompt = fim.build(self._prompts, self.template, prefix, suffix, max_prefix_tokens=budget,
                           max_suffix_tokens=budget // 3).ids
        body = self.tokenizer.encode(middle, add_special_tokens=False)
        eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        return (prompt + body + eos)[: self.seq_len]

    def samples(self, files: list[SourceText], count: int, seed: int = 0) -> list[list[int]]:
        """`count` token sequences drawn from the files, weighted by size."""
        rng = random.Random(seed)
        usable = [f for f in files if len(f.text) >= 32]
        if not usable:
            return []
        weights = [len(f.text) for f in usable]
        spans_cache: dict[str, list[tuple[int, int]]] = {}
        out = []
        while len(out) < count:
            f = rng.choices(usable, weights)[0]
            if rng.random() < self.fim_rate:
                spans = spans_cache.setdefault(f.path, node_spans(f.language, f.text))
                if spans and rng.random() < self.node_rate:
                    start, end = rng.choice(spans)
                else:
                    start = rng.randrange(0, len(f.text) - 8)
                    end = min(len(f.text), start + rng.randint(8, 240))
                ids = self.fim_ids(f.text[:start], f.text[start:end], f.text[end:])
            else:
                ids = self.tokenizer.encode(f.text, add_special_tokens=False)
                offset = rng.randrange(0, max(1, len(ids) - self.seq_len))
                ids = ids[offset : offset + self.seq_len]
            if len(ids) >= 16:
                out.append(ids)
        return out
