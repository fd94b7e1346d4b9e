"""Counting tokens for a remote engine here, where its model is not: the target's tokenizer, else an estimate.

The engine tokenizes the prompt; specdec only needs counts to keep the repository context within its budget
(maxSnippetTokens) and ids for the repository index. `target` names the model the engine serves, and its tokenizer
is built locally without reading any weights (specdec.native.loading.tokenizer_for: a pulled catalog model's
tokenizer files, else the GGUF's own vocabulary; a catalog name resolves to its GGUF, never downloaded here). Where
none can be built (a model that is only on the engine), counts are estimated at CHARS_PER_TOKEN, a low figure for
code (Qwen's tokenizer averages 3-4 characters a token on source) so a budget holds; the caller says so once.
"""

from __future__ import annotations

from pathlib import Path

CHARS_PER_TOKEN = 3


def target_tokenizer(target: str):
    """(tokenizer, "") for the model `target` names, or (None, why not) in one line. Blocking (transformers loads
    the vocabulary): call it from a loading thread."""
    target = (target or "").strip()
    if not target:
        return None, "no target names the engine's model"
    try:
        from specdec.models.store import target_gguf
        from specdec.native.loading import tokenizer_for

        path = Path(target).expanduser()
        if path.is_dir():
            if not (path / "tokenizer.json").is_file():
                return None, f"{target} has no tokenizer.json"
            return tokenizer_for(str(path), path / "model.gguf"), ""
        gguf = target_gguf(target, download=False)
        if gguf is None or not gguf.is_file():
            return None, f"{target} is neither a local model nor a pulled catalog model"
        return tokenizer_for(target, gguf), ""
    except Exception as exc:  # noqa: BLE001 - any failure only means estimated counts
        return None, (str(exc).splitlines() or [type(exc).__name__])[0]


class TokenCounter:
    """Tokens in a text: the tokenizer's count where there is one, else ceil(chars / CHARS_PER_TOKEN)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return -(-len(text) // CHARS_PER_TOKEN)
