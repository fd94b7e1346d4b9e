"""Next-edit prompts: the window around the cursor rewritten by the model, answered as one edit.

An insertion is what FIM completes; a next edit may change text anywhere near the cursor (the rest of a rename,
an argument added to every call). The model reads the recent edits and the window of lines around the cursor and
writes the window as it should read; the difference is the edit. The format is Qwen2.5-Coder's repository-level
pretraining format (`<|file_sep|>PATH` blocks), which open next-edit models are fine-tuned in (Sweep's next-edit
0.5B and 1.5B are Qwen2.5-Coder fine-tunes), so the default pair is asked as it is. The exact token layout, each
block a file separator token, its header line and its body (every piece tokenized on its own, so the window's
tokens are the window text's own and the drafter finds them by the separators):

    [<|file_sep|> OTHER_PATH "\\n" SNIPPET]...           related context: other files (optional), as FIM's
    <|file_sep|> PATH "\\n" FILE                          the file around the window as it reads now (a budget)
    [<|file_sep|> "original/" PATH "\\n" OLD HUNK          each recent edit, oldest first, the most recent last:
     <|file_sep|> "updated/" PATH "\\n" NEW HUNK]...      its text before and after (a unified diff's hunks)
    <|file_sep|> "original/" PATH "\\n" WINDOW            the current window: WINDOW_LINES lines around the cursor
    <|file_sep|> "updated/" PATH "\\n"                    the model writes the updated window here, then ends it
                                                         with <|file_sep|> or <|endoftext|>

Bodies end with a newline (one is added to a hunk's text that lacks it); the window is the document's lines as
they are. The window's generation stops at a file separator or end-of-text (the family's stop tokens), at
--max-new-tokens, or when it runs WINDOW_MARGIN lines past the window's line count: only a window that ended
at its marker is an answer, anything cut is no edit. StarCoder's `<file_sep>` works the same way; families
without a file separator token are refused (docs/next-edit.md).

The answer (`minimal_edit`): the two windows diffed by lines, then by characters inside the changed lines: the
smallest range of the document that changed and its new text, or None when the window came back unchanged.
Positions are 0-based lines and characters (code points, as `specdec complete --col` counts them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.prompts import fim

WINDOW_LINES = 21  # lines of the current window: the cursor's line and 10 on each side (fewer at the file's ends)
WINDOW_MARGIN = 8  # lines the updated window may run past the current one's before its generation is cut
MAX_HISTORY_TOKENS = 1024  # recent edits kept, the most recent first, whole hunks
MAX_FILE_TOKENS = 512  # the file's lines around the window, above and below, whole lines
DEFAULT_MAX_NEW_TOKENS = 512  # a 21-line window of dense code is ~300 tokens, plus room for what is added


@dataclass(frozen=True)
class Hunk:
    """One recent edit: a file's text before and after (a unified diff hunk's context and -/+ lines)."""

    path: str
    original: str
    updated: str


@dataclass(frozen=True)
class Window:
    """Lines [start, end) of a document (0-based) and their text, newlines included."""

    start: int
    end: int
    text: str

    @property
    def lines(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Edit:
    """Replace the document's text from (start_line, start_character) to (end_line, end_character) with text."""

    start_line: int
    start_character: int
    end_line: int
    end_character: int
    text: str

    def as_json(self) -> dict:
        """The LSP TextEdit shape: {"range": {"start": {line, character}, "end": {...}}, "text": ...}."""
        return {"range": {"start": {"line": self.start_line, "character": self.start_character},
                          "end": {"line": self.end_line, "character": self.end_character}}, "text": self.text}


@dataclass(frozen=True)
class NextEditPrompt:
    ids: list[int]
    window: Window
    hunks: int  # recent edits the prompt kept
    file_lines: tuple[int, int]  # the document's lines [start, end) its file block holds


# ---------------------------------------------------------------------------------------------- the history


_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_unified_diff(text: str, source: str = "the diff") -> list[Hunk]:
    """The hunks of a unified diff (`git diff`, `diff -u`), in the order given: each hunk's original text (context
    and `-` lines) and updated text (context and `+` lines), with the `+++` file's path (the `---` one's for a
    deletion; `a/` and `b/` prefixes dropped). Anything else between files (git's `diff --git`, `index` lines) is
    skipped. A diff with no hunk, or a hunk whose lines do not add up to its header, is a one-line error."""
    hunks: list[Hunk] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    old_path = new_path = ""
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old_path, new_path = _diff_path(line[4:]), _diff_path(lines[i + 1].rstrip("\r")[4:])
            i += 2
            continue
        if not line.startswith("@@"):
            i += 1
            continue
        match = _HUNK_HEADER.match(line)
        if match is None:
            raise SpecdecError(f"{source}:{i + 1}: not a hunk header: {line[:60]!r}")
        old_left = int(match.group(2)) if match.group(2) is not None else 1
        new_left = int(match.group(4)) if match.group(4) is not None else 1
        header_at = i
        original: list[str] = []
        updated: list[str] = []
        i += 1
        last = ""  # the kind of the hunk's last line: a "\\ No newline at end of file" after it applies to it
        while i < len(lines):
            body = lines[i].rstrip("\r")
            if body.startswith("\\"):
                if last in (" ", "-"):
                    _drop_newline(original)
                if last in (" ", "+"):
                    _drop_newline(updated)
                i += 1
                continue
            if old_left <= 0 and new_left <= 0:
                break
            kind, content = body[:1] or " ", body[1:] + "\n"
            if kind == " ":  # a context line (some tools drop the space of an empty one)
                original.append(content)
                updated.append(content)
                old_left, new_left = old_left - 1, new_left - 1
            elif kind == "-":
                original.append(content)
                old_left -= 1
            elif kind == "+":
                updated.append(content)
                new_left -= 1
            else:
                break
            last = kind
            i += 1
        if old_left != 0 or new_left != 0:
            raise SpecdecError(f"{source}:{header_at + 1}: the hunk's lines do not add up to its header "
                               f"{line.split('@@')[1].strip()!r}")
        path = new_path if new_path and new_path != "/dev/null" else old_path
        hunks.append(Hunk(path or "", "".join(original), "".join(updated)))
    if not hunks:
        raise SpecdecError(f"{source}: not a unified diff (no @@ hunk)")
    return hunks


def _diff_path(field: str) -> str:
    path = field.split("\t")[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    return path[2:] if path[:2] in ("a/", "b/") else path


def _drop_newline(lines: list[str] | None) -> None:
    if lines and lines[-1].endswith("\n"):
        lines[-1] = lines[-1][:-1]


def read_history(path: str) -> list[Hunk]:
    """--history DIFF: the recent edits as a unified diff file ('-': standard input); one line for what is wrong."""
    import sys

    label = f"--history {path}"
    if path == "-":
        return parse_unified_diff(sys.stdin.read(), label)
    file = Path(path)
    if file.is_dir():
        raise SpecdecError(f"{label}: is a folder, not a diff")
    if not file.is_file():
        raise SpecdecError(f"{label}: no such file")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise SpecdecError(f"{label}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{label}: not UTF-8 text (byte {exc.start})") from None
    return parse_unified_diff(text, label)


# ---------------------------------------------------------------------------------------------- the window


def document_lines(text: str) -> list[str]:
    """The document's lines with their newlines (the last one without, possibly empty): LSP's lines, split at \\n."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + [parts[-1]]


def window_around(text: str, line: int, size: int = WINDOW_LINES) -> Window:
    """The `size` lines around 0-based `line` (the cursor's line in the middle, shifted at the file's ends)."""
    lines = document_lines(text)
    if not 0 <= line < len(lines):
        raise SpecdecError(f"line {line + 1} is outside the file (1..{len(lines)})")
    if lines[-1] == "" and len(lines) > 1 and line < len(lines) - 1:
        lines = lines[:-1]  # the empty "line" after a final newline joins no window but its own
    start = max(0, line - size // 2)
    end = min(len(lines), start + size)
    start = max(0, end - size)
    return Window(start, end, "".join(lines[start:end]))


def minimal_edit(window: Window, updated: str) -> Edit | None:
    """The smallest range of the document that differs between the window and its update, and its new text:
    whole lines first (the lines the two share at the start and at the end are kept), then characters inside the
    changed lines where both sides have some. None when nothing changed."""
    current = window.text
    if current.endswith("\n") != updated.endswith("\n"):  # the window's last newline is the marker's, not an edit
        updated = updated + "\n" if current.endswith("\n") else updated[:-1]
    if updated == current:
        return None
    a, b = document_lines(current), document_lines(updated)
    a, b = ([x for x in a if x] or [""]), ([x for x in b if x] or [""])
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    old, new = "".join(a[head:len(a) - tail]), "".join(b[head:len(b) - tail])
    offset = sum(len(x) for x in a[:head])
    if old and new:
        p = 0
        while p < min(len(old), len(new)) and old[p] == new[p]:
            p += 1
        s = 0
        while s < min(len(old), len(new)) - p and old[len(old) - 1 - s] == new[len(new) - 1 - s]:
            s += 1
        old, new, offset = old[p:len(old) - s], new[p:len(new) - s], offset + p
    start_line, start_character = _position(current, offset)
    end_line, end_character = _position(current, offset + len(old))
    return Edit(window.start + start_line, start_character, window.start + end_line, end_character, new)


def _position(text: str, offset: int) -> tuple[int, int]:
    """(line, character) of an offset into text, 0-based."""
    line = text.count("\n", 0, offset)
    return line, offset - (text.rfind("\n", 0, offset) + 1)


def window_stop(window: Window, margin: int = WINDOW_MARGIN):
    """The stop predicate of a window's generation: once the text ends more lines than the window has plus `margin`,
    it is cut after that many."""
    limit = window.lines + margin

    def stop(text: str) -> int | None:
        if text.count("\n") <= limit:
            return None
        at = -1
        for _ in range(limit):
            at = text.index("\n", at + 1)
        return at + 1

    return stop


# ---------------------------------------------------------------------------------------------- the prompt


def separator(template: fim.FimTemplate) -> str:
    """The family's file separator token (`<|file_sep|>`, `<file_sep>`); a family without one is refused."""
    sep = template.file_header.split("{path}")[0] if template.file_header else ""
    if not sep:
        raise SpecdecError(f"next-edit needs a model family with a file separator token (qwen, starcoder); "
                           f"{template.family} has none")
    return sep


def markers(tokenizer, template: fim.FimTemplate):
    """What the edit drafter needs to find the current window in a prompt: the separator's and a newline's ids."""
    from specdec.engine.drafters.edit_window import EditMarkers

    sep = fim.token_id(tokenizer, separator(template))
    if sep is None:
        raise SpecdecError(f"the tokenizer has no {separator(template)} token")
    return EditMarkers(sep, tuple(tokenizer.encode("\n", add_special_tokens=False)))


def _clean_path(path: str) -> str:
    return path.replace("\n", " ").replace("\r", " ")


def build(tokenizer, template: fim.FimTemplate, path: str, text: str, window: Window, history: list[Hunk] = (),
          context: str = "", max_history_tokens: int = MAX_HISTORY_TOKENS,
          max_file_tokens: int = MAX_FILE_TOKENS) -> NextEditPrompt:
    """The prompt's token ids (the layout in the module docstring): context, the file around the window within
    max_file_tokens (whole lines, nearest the window first, above and below in turn; 0: no file block), the most
    recent hunks within max_history_tokens (whole hunks), the current window and the updated window's header."""
    sep = separator(template)
    sep_id = fim.token_id(tokenizer, sep)
    if sep_id is None:
        raise SpecdecError(f"the tokenizer has no {sep} token")
    newline = tokenizer.encode("\n", add_special_tokens=False)
    path = _clean_path(path)

    def encode(piece: str) -> list[int]:
        return tokenizer.encode(piece, add_special_tokens=False) if piece else []

    def block(header: str, body: str | None) -> list[int]:
        return [sep_id] + encode(header) + newline + ([] if body is None else encode(body))

    def ended(body: str) -> str:
        return body if body.endswith("\n") or not body else body + "\n"

    lines = document_lines(text)
    above, below, room = window.start, window.end, max_file_tokens
    file_ids: list[int] = []
    if max_file_tokens > 0:
        room -= len(encode(window.text))
        turn = 0
        while room > 0 and (above > 0 or below < len(lines)):
            take_above = (turn % 2 == 0 and above > 0) or below >= len(lines)
            line = lines[above - 1] if take_above else lines[below]
            cost = len(encode(line))
            if cost > room:
                break
            room -= cost
            above, below = (above - 1, below) if take_above else (above, below + 1)
            turn += 1
        file_ids = block(path, ended("".join(lines[above:below])))
    kept: list[list[int]] = []
    budget = max_history_tokens
    for hunk in reversed(list(history)):
        hunk_path = _clean_path(hunk.path or path)
        ids = block("original/" + hunk_path, ended(hunk.original)) + block("updated/" + hunk_path,
                                                                           ended(hunk.updated))
        if len(ids) > budget:
            break
        kept.append(ids)
        budget -= len(ids)
    ids = encode(context) + file_ids
    for hunk_ids in reversed(kept):
        ids += hunk_ids
    ids += block("original/" + path, window.text) + block("updated/" + path, None)
    return NextEditPrompt(ids, window, len(kept), (above, below) if file_ids else (window.start, window.start))


def stop_token_ids(tokenizer, template: fim.FimTemplate) -> set[int]:
    """Where an updated window ends: the separator, end-of-text and the family's other stop tokens."""
    return fim.stop_token_ids(tokenizer, template) | {tokenizer.get_vocab()[separator(template)]}


# ---------------------------------------------------------------------------------------------- one prediction


@dataclass
class NextEditResult:
    edit: Edit | None  # None: the window came back unchanged, or did not end at its marker (generation.stop_reason)
    window: Window  # the current window
    updated: str  # the window as the model wrote it
    prompt: NextEditPrompt
    generation: object  # the engine's Generation: stats, stop reason, trace


@dataclass
class NextEditor:
    """A session asked for next edits in its model family's file-separator format (`NextEditor.for_session`)."""

    session: object  # specdec.engine.session.Session
    template: fim.FimTemplate
    max_history_tokens: int = MAX_HISTORY_TOKENS
    max_file_tokens: int = MAX_FILE_TOKENS

    @classmethod
    def for_session(cls, session, strategy: str | None = None, family: str | None = None,
                    max_draft: int | None = None, **budgets) -> "NextEditor":
        """strategy: the next-edit strategy the session's drafter was built for (strategies.next_edit_base); `edit`
        and `auto` get the window copy in front of it (edit_window.with_edit_window, drafts up to max_draft). The
        editor's session is derived from the one handed in (the same target and cache), which is left as it was."""
        from specdec.engine.drafters.edit_window import with_edit_window
        from specdec.engine.limits import MAX_DRAFT
        from specdec.engine.strategies import EDIT_WINDOW_STRATEGIES

        template = fim.detect(session.tokenizer, family)
        edit_markers = markers(session.tokenizer, template)  # refuses a family without a file separator
        changes = {"stop_token_ids": session.stop_token_ids | stop_token_ids(session.tokenizer, template)}
        if strategy in EDIT_WINDOW_STRATEGIES:
            changes["drafter"] = with_edit_window(session.drafter, edit_markers, max_draft or MAX_DRAFT)
        changes["strategy"] = strategy or session.strategy
        return cls(session.derive(**changes), template, **budgets)

    def prompt(self, text: str, line: int, path: str, history: list[Hunk] = (), context: str = "",
               max_new_tokens: int = 0) -> NextEditPrompt:
        """The prompt for a cursor on 0-based `line`; where the target's cache (the native forward's capacity) cannot
        hold it and max_new_tokens, the file block goes first, then the history; a window that still does not fit
        is a one-line error."""
        window = window_around(text, line)
        tokenizer = self.session.tokenizer
        capacity = getattr(self.session.target, "capacity", None)
        cuts = [(self.max_file_tokens, self.max_history_tokens), (0, self.max_history_tokens), (0, 0)]
        for file_tokens, history_tokens in cuts:
            prompt = build(tokenizer, self.template, path, text, window, history, context, history_tokens,
                           file_tokens)
            if capacity is None or len(prompt.ids) + max_new_tokens <= capacity:
                return prompt
        raise SpecdecError(f"the window's prompt ({len(prompt.ids)} tokens) and {max_new_tokens} new tokens do not "
                           f"fit the model's cache of {capacity} tokens")

    def predict(self, text: str, line: int, config, path: str, history: list[Hunk] = (), context: str = "",
                cancel=None) -> NextEditResult:
        """The updated window for a cursor on 0-based `line`, and the edit it makes (config: a GenerationConfig)."""
        prompt = self.prompt(text, line, path, history, context, config.max_new_tokens)
        generation = self.session.generate(prompt.ids, config, window_stop(prompt.window), cancel)
        edit = minimal_edit(prompt.window, generation.text) if generation.stop_reason == "eos" else None
        return NextEditResult(edit, prompt.window, generation.text, prompt, generation)
