"""Languages specdec knows: detection from an editor's language id or a file name, and tree-sitter grammars.

Grammars come from the per-language wheels (bundled, offline); a language without one
still works everywhere, just without syntax awareness.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import PurePosixPath

from specdec.file_languages import EXTENSIONS  # noqa: F401 (re-exported: a file name's language)

GRAMMARS = {  # language -> (module, function returning the grammar)
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "javascriptreact": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "typescriptreact": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "c": ("tree_sitter_cpp", "language"),
}


def detect_language(language_id: str | None, uri: str) -> str:
    """The client's languageId when it is one we know, else the file extension, else the raw id."""
    if language_id and language_id in GRAMMARS:
        return language_id
    by_ext = EXTENSIONS.get(PurePosixPath(uri.split("?")[0]).suffix.lower())
    return by_ext or language_id or "plaintext"


@functools.lru_cache(maxsize=None)
def parser_for(language: str):
    """A tree-sitter parser, or None for a language without a bundled grammar."""
    spec = GRAMMARS.get(language)
    if spec is None:
        return None
    try:
        from tree_sitter import Language, Parser

        module = importlib.import_module(spec[0])
        return Parser(Language(getattr(module, spec[1])()))
    except Exception:  # a broken grammar wheel degrades to text heuristics, it does not break completion
        return None
