"""One fill-in-the-middle completion at a cursor: what `specdec complete` and the benchmark run."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from specdec.prompts import fim
from specdec.engine.drafters.base import RequestContext
from specdec.engine.session import Generation, GenerationConfig, Session, StopPredicate, CancelToken
from specdec.errors import SpecdecError

log = logging.getLogger(__name__)
MIN_PREFIX_TOKENS = 16  # what a prompt keeps before the cursor at least (the settings' least maxPrefixTokens)


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
    _clamp_said: tuple = field(default=(), repr=False, compare=False)  # the budgets and room last warned about

    @classmethod
    def for_session(cls, session: Session, family: str | None = None, **budgets) -> "Completer":
        """A completer over a session in the family's format: the session derived with the format's stop ids
        added (the same target and cache; the session handed in is left as it was)."""
        template = fim.detect(session.tokenizer, family)
        stops = session.stop_token_ids | fim.stop_token_ids(session.tokenizer, template)
        return cls(session.derive(stop_token_ids=stops), template, **budgets)

    def prompt(self, prefix: str, suffix: str, path: str | None = None, context: str = "",
               max_new_tokens: int = 0) -> fim.FimPrompt:
        """The FIM prompt under the budgets, cut (budgets) to what the target's cache holds besides
        max_new_tokens."""
        prefix_budget, suffix_budget = self.budgets(path, context, max_new_tokens)
        return fim.build(self.session.tokenizer, self.template, prefix, suffix, path, prefix_budget, suffix_budget,
                         context)

    def budgets(self, path: str | None, context: str, max_new_tokens: int) -> tuple[int, int]:
        """(prefix, suffix) budgets. A target with a fixed cache (the native forward's `capacity`) holds the prompt
        and the completion, so budgets past it are cut, the suffix's only where the prefix would keep less than
        MIN_PREFIX_TOKENS, said once per budgets and cache; a prompt that cannot fit at all is a one-line error.
        From the budgets, not the text, so the cut, and the cached prompt start, stay put while the user types."""
        capacity = getattr(self.session.target, "capacity", None)
        if capacity is None:
            return self.max_prefix_tokens, self.max_suffix_tokens
        room = capacity - max_new_tokens
        fixed = len(fim.build(self.session.tokenizer, self.template, "", "", path, MIN_PREFIX_TOKENS, 0, context).ids)
        free = room - fixed  # for the text before and after the cursor
        if self.max_prefix_tokens + self.max_suffix_tokens <= free:
            return self.max_prefix_tokens, self.max_suffix_tokens
        floor = min(self.max_prefix_tokens, MIN_PREFIX_TOKENS)
        if free < floor:
            raise SpecdecError(f"the prompt's markers and context ({fixed} tokens) and {max_new_tokens} new tokens "
                               f"leave no room in the model's cache of {capacity} tokens")
        suffix_budget = max(0, min(self.max_suffix_tokens, free - floor))
        prefix_budget = min(self.max_prefix_tokens, free - suffix_budget)
        said = (self.max_prefix_tokens, self.max_suffix_tokens, capacity, max_new_tokens)
        if self._clamp_said != said:
            self._clamp_said = said
            log.warning("specdec: %d prefix + %d suffix tokens do not fit the model's cache of %d tokens with %d new "
                        "ones; prompts keep %d tokens before the cursor and %d after", self.max_prefix_tokens,
                        self.max_suffix_tokens, capacity, max_new_tokens, prefix_budget, suffix_budget)
        return prefix_budget, suffix_budget

    def prefill(self, prefix: str, suffix: str, max_new_tokens: int, path: str | None = None,
                cancel: CancelToken | None = None, context: str = "", closed: CancelToken | None = None) -> bool:
        """The prompt `complete` would generate from, into the session's caches now (Session.prefill: its lines
        above the cursor even once cancel is set, unless closed is)."""
        prompt = self.prompt(prefix, suffix, path, context, max_new_tokens)
        return self.session.prefill(prompt.ids, cancel, prompt.stable, closed)

    def complete(self, prefix: str, suffix: str, config: GenerationConfig, path: str | None = None,
                 stop: StopPredicate | None = None, cancel: CancelToken | None = None,
                 context: str = "", request: RequestContext | None = None) -> Generation:
        """context: other files' snippets for the prompt; request: what the drafters read of this request (the
        document being completed...), drafters.base.RequestContext."""
        prompt = self.prompt(prefix, suffix, path, context, config.max_new_tokens)
        return self.session.generate(prompt.ids, config, stop, cancel, request)
