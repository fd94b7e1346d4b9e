"""`specdec next-edit FILE --line N --col N [--history DIFF]`: the next edit around a cursor (prompts/next_edit.py),
as `specdec complete` is for insertions: the same model flags, strategies (and `edit`), --json and --trace."""

from __future__ import annotations

import json
import sys

from specdec.engine.strategies import NEXT_EDIT_STRATEGIES
from specdec.models.commands import add_model_args
from specdec.prompts.next_edit import DEFAULT_MAX_NEW_TOKENS


def cmd_next_edit(args) -> int:
    from specdec.engine.sampling import SamplingConfig
    from specdec.engine.session import GenerationConfig
    from specdec.engine.strategies import next_edit_base
    from specdec.cli.complete import check_generation_args, check_trace_json, load_completer, stats_json, \
        write_trace
    from specdec.prompts.completion import read_source, split_at
    from specdec.prompts.next_edit import NextEditor, read_history

    check_generation_args(args)  # everything the user can get wrong is said before the models load
    text = read_source(args.file)
    split_at(text, args.line, args.col)  # the cursor's line and column, checked as `specdec complete` checks them
    history = read_history(args.history) if args.history else []
    check_trace_json(args.trace_json)
    completer = load_completer(args, next_edit_base(args.strategy, bool(args.draft)))
    editor = NextEditor.for_session(completer.session, args.strategy, max_draft=args.max_draft)
    tracing = args.trace or args.trace_json
    config = GenerationConfig(args.max_new_tokens, SamplingConfig(args.temperature, args.top_k, args.top_p,
                                                                  args.seed), args.max_draft, trace=bool(tracing))
    result = editor.predict(text, args.line - 1, config, args.file, history)
    if args.json:
        print(json.dumps({"edit": result.edit.as_json() if result.edit else None, "window": result.updated,
                          "stats": stats_json(result.generation)}))
    else:
        sys.stdout.write(describe(result) + "\n")
    if tracing:
        write_trace(args, result.generation.trace, completer.session.tokenizer)
    return 0


def describe(result) -> str:
    """The edit for people: its range (1-based, as --line and --col) and new text, or why there is none."""
    edit, reason = result.edit, result.generation.stop_reason
    if edit is None:
        if reason != "eos":
            return f"no edit: the updated window did not end at its marker ({reason})"
        return "no edit: the window came back unchanged"
    where = (f"{edit.start_line + 1}:{edit.start_character + 1}" if (edit.start_line, edit.start_character) ==
             (edit.end_line, edit.end_character) else
             f"{edit.start_line + 1}:{edit.start_character + 1}-{edit.end_line + 1}:{edit.end_character + 1}")
    verb = "insert at" if where.count(":") == 1 else ("delete" if not edit.text else "replace")
    return f"{verb} {where}" + (f": {edit.text!r}" if edit.text else "")


def register(sub) -> None:
    p = sub.add_parser("next-edit", help="the next edit around a cursor: the window rewritten, answered as one edit")
    p.add_argument("file")
    p.add_argument("--line", type=int, required=True, help="1-based line")
    p.add_argument("--col", type=int, required=True, help="1-based column (characters)")
    p.add_argument("--history", metavar="DIFF",
                   help="the recent edits as a unified diff (git diff, diff -u; '-': standard input), the most "
                        "recent last")
    add_model_args(p)
    p.add_argument("--strategy", choices=NEXT_EDIT_STRATEGIES, default="auto",
                   help="edit: the current window copied where the output is aligned with it, the draft model "
                        "where it is not; auto puts that copy in front of its drafters")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--max-draft", type=int, default=16, help="cap on drafted tokens per target pass")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true",
                   help='one object: {"edit": {"range": ..., "text": ...} or null, "window": ..., "stats": ...}')
    p.add_argument("--trace", action="store_true", help="the updated window marked pass by pass, as complete's")
    p.add_argument("--trace-json", metavar="FILE", help="write the pass trace as JSON to FILE")
    p.set_defaults(func=cmd_next_edit)
