"""What the code around the cursor says about the completion: tree-sitter, offline grammars.

Decides single-line vs multi-line, refuses automatic completion inside strings and
comments, builds the stop predicate the engine checks after every verified step (so
generation ends as soon as the completion leaves its block), and trims the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.prompts.languages import EXTENSIONS, GRAMMARS, detect_language, parser_for  # noqa: F401 (re-exported)

INDENT_BLOCKS = {"python"}  # blocks by indentation; the rest by braces
STRING_TYPES = {"string", "string_content", "string_fragment", "template_string", "interpreted_string_literal",
                "raw_string_literal", "string_literal", "char_literal", "character_literal", "raw_string",
                "text_block", "concatenated_string"}
COMMENT_TYPES = {"comment", "line_comment", "block_comment"}
WINDOW = 20_000  # characters either side of the cursor that tree-sitter sees (a 10 MB file stays fast)


@dataclass(frozen=True)
class CursorContext:
    language: str
    multiline: bool
    in_string_or_comment: bool
    line_before: str  # current line up to the cursor
    line_after: str  # current line after the cursor
    body_indent: int  # columns a line of the completion must keep to stay in the block
    next_code_line: str  # first non-blank line of the suffix after the current one, stripped


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def _opens_block(line: str, language: str) -> bool:
    stripped = line.rstrip()
    return stripped.endswith(":") if language in INDENT_BLOCKS else stripped.endswith(("{", "(", "["))


def in_string_or_comment(language: str, prefix: str, suffix: str) -> bool:
    parser = parser_for(language)
    if parser is None:
        return False
    before, after = prefix[-WINDOW:], suffix[:WINDOW]
    source = (before + after).encode("utf-8", "surrogatepass")
    at = len(before.encode("utf-8", "surrogatepass"))
    node = parser.parse(source).root_node.descendant_for_byte_range(at, at)
    while node is not None:
        if node.type in COMMENT_TYPES and node.start_byte < at <= node.end_byte:
            return True
        if node.type in STRING_TYPES and node.start_byte < at < node.end_byte:
            return True
        node = node.parent
    return False


def analyze(language: str, prefix: str, suffix: str) -> CursorContext:
    line_before = prefix[prefix.rfind("\n") + 1 :]
    newline = suffix.find("\n")
    line_after = suffix if newline < 0 else suffix[:newline]
    rest = "" if newline < 0 else suffix[newline + 1 :]
    next_code_line = next((l.strip() for l in rest[:WINDOW].split("\n") if l.strip()), "")
    blank_before = not line_before.strip()
    if line_after.strip():
        multiline = False  # mid-line: complete the rest of this line only
    elif blank_before:
        multiline = True
    else:
        multiline = _opens_block(line_before, language)
    if blank_before:
        body_indent = _indent(line_before)
    else:
        body_indent = _indent(line_before) + (1 if _opens_block(line_before, language) else 0)
    return CursorContext(language, multiline, in_string_or_comment(language, prefix, suffix), line_before,
                         line_after, body_indent, next_code_line)


def stop_predicate(ctx: CursorContext, max_lines: int = 24):
    """Cut position as soon as the completion is done: end of line, leaving the block, or reaching the suffix."""

    def single_line(text: str):
        cut = text.find("\n")
        return cut if cut >= 0 else None

    def multi_line(text: str):
        lines = text.split("\n")
        offset = len(lines[0]) + 1
        depth = _bracket_depth(lines[0])
        blank_run = 0
        for number, line in enumerate(lines[1:], start=1):
            complete = number < len(lines) - 1 or line.strip()  # its indentation is known
            if not complete:
                break
            stripped = line.strip()
            blank_run = blank_run + 1 if not stripped else 0
            if stripped:
                leaves_block = _indent(line) < ctx.body_indent
                if ctx.language not in INDENT_BLOCKS:
                    depth_after = depth + _bracket_depth(line)
                    leaves_block = depth_after < 0 or (leaves_block and stripped[0] in "}])")
                    depth = depth_after
                if leaves_block or (stripped == ctx.next_code_line and _substantial(stripped)):
                    return offset - 1
            if blank_run >= 2 or number >= max_lines:
                return offset - 1
            offset += len(line) + 1
        return None

    return multi_line if ctx.multiline else single_line


def reporting(stop, progress):
    """The stop predicate, telling progress(text) each text it lets go on (None: the predicate as it is)."""
    if progress is None:
        return stop

    def predicate(text: str):
        cut = stop(text)
        if cut is None:
            progress(text)
        return cut

    return predicate


def _substantial(line: str) -> bool:
    """Worth matching against the suffix: not just a closing brace or punctuation."""
    return len(line.strip("{}()[];, ")) >= 3


def _bracket_depth(line: str) -> int:
    return sum(line.count(c) for c in "{([") - sum(line.count(c) for c in "})]")


def finalize(ctx: CursorContext, text: str, stop_reason: str) -> str:
    """Trim to a sensible end: no half line when the budget ran out, no text the suffix already has."""
    if ctx.multiline:
        if stop_reason == "max_tokens" and "\n" in text:
            text = text[: text.rfind("\n")]
        text = _whole_lines(ctx, text)
    elif opens_line_above(ctx):
        if not text.strip() or text.strip() == ctx.line_after.strip():
            return ""  # nothing, or the existing line typed again
        if stop_reason == "eos":
            return text  # the model ended without a line break: it writes in front of the code, as FIM says
        text = text.rstrip() + "\n" + ctx.line_before  # a whole line; the code after it keeps its indentation
    else:
        text = text.rstrip("\n")
        text = _drop_suffix_overlap(ctx, text)
    return text


def _whole_lines(ctx: CursorContext, text: str) -> str:
    """A multi-line completion's end: no trailing blanks, no block opener left without its body."""
    text = text.rstrip()
    while ctx.language in INDENT_BLOCKS and "\n" in text and text.endswith(":"):
        text = text[: text.rfind("\n")].rstrip()
    return text


def ready_lines(ctx: CursorContext, text: str) -> str | None:
    """What of a multi-line completion under way can be shown already: its complete lines, trimmed as finalize
    trims, once one of them holds code; else None. `text` must be one the stop predicate let go on: its rules
    judge a line once it is complete, so a later cut falls at the end of these lines or after them, and the
    final text starts with what this returns (the first line first, issue #50)."""
    if not ctx.multiline or "\n" not in text:
        return None
    lines = _whole_lines(ctx, text[: text.rfind("\n")])
    return lines if lines.strip() else None


def opens_line_above(ctx: CursorContext) -> bool:
    """The cursor is at the start (or in the indentation) of a line of code: what comes is a new line above it.

    The model ends that line with a newline, which the single-line stop cuts off; the
    item must put it back, or accepting glues the completion to the existing code.
    """
    return not ctx.multiline and not ctx.line_before.strip() and bool(ctx.line_after.strip())


def _drop_suffix_overlap(ctx: CursorContext, text: str) -> str:
    """`foo(a))` before a suffix `)` becomes `foo(a)`: the editor keeps the suffix's own characters."""
    after = ctx.line_after.strip()
    if not after:
        return text.rstrip()
    for k in range(min(len(after), len(text)), 0, -1):
        overlap = after[:k]
        if not text.endswith(overlap):
            continue
        if k >= 3 or _bracket_depth(ctx.line_before + text + ctx.line_after) < 0:
            return text[: len(text) - k]
    return text
