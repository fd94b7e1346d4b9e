"""One fill-in-the-middle completion at a cursor: what `specdec complete` and the benchmark run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec.prompts import fim
from specdec.engine.session import Generation, GenerationConfig, Session, StopPredicate, CancelToken
from specdec.errors import SpecdecError


def read_source(path: str | Path) -> str:
    path = Path(path)
    if path.is_dir():
        raise SpecdecError(f"{path} is a directory; give the file to complete")
    if not path.is_file():
        raise SpecdecError(f"no such file: {path}")
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise SpecdecError(f"{path} looks binary (NUL bytes); not completing it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def split_at(text: str, line: int, col: int) -> tuple[str, str]:
    """Prefix and suffix around a 1-based (line, column) cursor; columns count characters."""
    lines = text.split("\n")
    if line < 1 or line > len(lines):
        raise SpecdecError(f"line {line} is outside the file (1..{len(lines)})")
    current = lines[line - 1].rstrip("\r")
    if col < 1 or col > len(current) + 1:
        raise SpecdecError(f"column {col} is outside line {line} (1..{len(current) + 1})")
    offset = sum(len(l) + 1 for l in lines[: line - 1]) + col - 1
    return text[:offset], text[offset:]


@dataclass
class Completer:
    """A session plus the prompt format of its model family."""

    session: Session
    template: fim.FimTemplate
    max_prefix_tokens: int = 1024
    max_suffix_tokens: int = 256

    @classmethod
    def for_session(cls, session: Session, family: str | None = None, **budgets) -> "Completer":
        template = fim.detect(session.tokenizer, family)
        session.stop_token_ids = session.stop_token_ids | fim.stop_token_ids(session.tokenizer, template)
        return cls(session, template, **budgets)

    def prompt(self, prefix: str, suffix: str, path: str | None = None, context: str = "") -> fim.FimPrompt:
        return fim.build(self.session.tokenizer, self.template, prefix, suffix, path,
                         self.max_prefix_tokens, self.max_suffix_tokens, context)

    def complete(self, prefix: str, suffix: str, config: GenerationConfig, path: str | None = None,
                 stop: StopPredicate | None = None, cancel: CancelToken | None = None,
                 context: str = "") -> Generation:
        return self.session.generate(self.prompt(prefix, suffix, path, context).ids, config, stop, cancel)
