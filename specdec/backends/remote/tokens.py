"""Tokens for a remote engine here, where its model is not: the target's tokenizer, else an estimate.

The engine tokenizes the prompt; specdec cuts the text around the cursor under maxPrefixTokens / maxSuffixTokens
(fim.window: the same rule and the same text as the local prompt), keeps the repository context within
maxSnippetTokens, and gives the repository index its ids. `target` names the model the engine serves, and its
tokenizer is built locally without reading any weights: a model directory's or a pulled catalog model's
tokenizer files, else the GGUF's own vocabulary (specdec.models.gguf_tokenizer, 10-30 s over a 150k-token
vocabulary), which is built once per GGUF and kept as tokenizer.json in the cache (`gguf_tokenizer`); a catalog
name resolves to its GGUF, never downloaded here. Where none can be built (a model that is only on the engine), or
until it is built, a token is estimated at CHARS_PER_TOKEN characters, a low figure for code (Qwen's tokenizer
averages 3-4 characters a token on source) so a budget holds; the caller says so once.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from specdec.prompts import fim

log = logging.getLogger("specdec.engine")

CHARS_PER_TOKEN = 3
CACHE_FORMAT = 1  # bump when what a GGUF's cached tokenizer holds changes (specdec.models.gguf_tokenizer)


class EstimatedTokenizer:
    """The stand-in where the target's tokenizer is not at hand: a token is CHARS_PER_TOKEN characters. Its "ids"
    are the pieces of text themselves, so fim.window cuts by them exactly as it cuts by a tokenizer's ids: one
    rule for both, only the counts are estimated."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return [text[i:i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]

    def decode(self, pieces: list[str]) -> str:
        return "".join(pieces)


ESTIMATE = EstimatedTokenizer()


class TokenCounter:
    """The target's tokens where its tokenizer was built (`exact`), else the estimate: counts, and the window of
    text around the cursor the local prompt would hold under the same budgets."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def count(self, text: str) -> int:
        return len((self.tokenizer or ESTIMATE).encode(text, add_special_tokens=False))

    def window(self, prefix: str, suffix: str, max_prefix_tokens: int, max_suffix_tokens: int) -> tuple[str, str]:
        """(prefix, suffix) as the local prompt keeps them (fim.window): whole lines above the cursor, the suffix
        up to the budget's last token."""
        return fim.window(self.tokenizer or ESTIMATE, prefix, suffix, max_prefix_tokens, max_suffix_tokens)


def target_tokenizer(target: str):
    """(tokenizer, "") for the model `target` names, or (None, why not) in one line. Blocking (transformers loads
    the vocabulary; a GGUF's first time builds it): call it from a loading thread."""
    target = (target or "").strip()
    if not target:
        return None, "no target names the engine's model"
    try:
        from specdec.models.catalog import KNOWN_MODELS
        from specdec.models.store import TOKENIZER_FILE, cache_name, target_gguf
        from specdec.native.loading import tokenizer_for
        from specdec.paths import models_dir

        path = Path(target).expanduser()
        if path.is_dir():
            if not (path / TOKENIZER_FILE).is_file():
                return None, f"{target} has no tokenizer.json"
            return tokenizer_for(str(path), path / "model.gguf"), ""
        gguf = target_gguf(target, download=False)
        if gguf is None or not gguf.is_file():
            return None, f"{target} is neither a local model nor a pulled catalog model"
        if target in KNOWN_MODELS and (models_dir() / cache_name(target) / TOKENIZER_FILE).is_file():
            return tokenizer_for(target, gguf), ""  # the pulled tokenizer files
        return gguf_tokenizer(gguf), ""
    except Exception as exc:  # noqa: BLE001 - any failure only means estimated counts
        return None, (str(exc).splitlines() or [type(exc).__name__])[0]


def tokenizers_dir() -> Path:
    """Tokenizers built from GGUFs (re-creatable from them), beside the other caches."""
    from specdec.paths import cache_dir

    return cache_dir() / "tokenizers"


def cached_tokenizer_dir(gguf: Path) -> Path:
    """Where the GGUF's tokenizer is kept: named by the file's content (specdec.models.file_digest: a GGUF copied
    elsewhere is the same vocabulary, one copied over with its mtime kept is another) and CACHE_FORMAT."""
    from specdec.models.file_digest import content_digest

    return tokenizers_dir() / f"{gguf.stem}-{content_digest(gguf)[:16]}-v{CACHE_FORMAT}"


def gguf_tokenizer(gguf: Path):
    """The tokenizer the GGUF describes (specdec.models.gguf_tokenizer.from_gguf), read from the cache where an
    earlier start kept it (well under a second), else built (10-30 s) and kept there: tokenizer.json with
    tokenizer_config.json (the file's special tokens), written beside each other atomically, tokenizer.json last
    (its presence says the rest is there). Nothing else in the cache is touched."""
    from transformers import AutoTokenizer

    from specdec.models.gguf_tokenizer import from_gguf

    gguf = Path(gguf)
    folder = cached_tokenizer_dir(gguf)
    if (folder / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError) as exc:
            log.warning("the cached tokenizer in %s is unreadable (%s); building it again from %s", folder,
                        (str(exc).splitlines() or [type(exc).__name__])[0], gguf.name)
    started = time.perf_counter()
    tokenizer = from_gguf(gguf)
    try:
        _keep(tokenizer, folder)
        log.info("built the tokenizer of %s in %.1f s; kept in %s", gguf.name, time.perf_counter() - started, folder)
    except OSError as exc:  # a read-only cache: the tokenizer still serves, built again next start
        log.warning("built the tokenizer of %s but cannot keep it in %s (%s)", gguf.name, folder, exc)
    return tokenizer


def _keep(tokenizer, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))  # ours alone: removed after
    try:
        tokenizer.save_pretrained(staging)
        folder.mkdir(exist_ok=True)
        for entry in sorted(staging.iterdir(), key=lambda p: p.name == "tokenizer.json"):
            os.replace(entry, folder / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
