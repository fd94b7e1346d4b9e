"""`specdec complete FILE --line N --col N`: one fill-in-the-middle completion at a cursor."""

from __future__ import annotations

import json
import sys

from specdec.engine.limits import MAX_DRAFT, MAX_NEW_TOKENS
from specdec.engine.strategies import STRATEGIES, uses_repo_index
from specdec.errors import SpecdecError
from specdec.models.commands import add_model_args


def load_completer(args, strategy: str, repo: str | None = None):
    """repo: a folder to index for the repo drafter (`repo`, `auto`). The file being completed is the request's
    (backends.local.request_context), not the completer's."""
    from specdec.backends.local import LoadSpec, build

    index = None
    if repo and uses_repo_index(strategy):
        from specdec.engine.drafters.repo_index import RepoIndex

        index = RepoIndex()  # filled once the tokenizer is loaded: build_index below
    spec = LoadSpec(args.target, args.draft, strategy, args.dtype, args.draft_quant,
                    getattr(args, "target_quant", "auto"), getattr(args, "int4_kernel", "auto"),
                    getattr(args, "forward", "auto"), device=getattr(args, "device", None), adapter=getattr(args, "adapter", None),
                    max_draft=args.max_draft)
    completer = build(spec, index).completer
    if index is not None:
        from specdec.repository.build import build_index

        build_index(repo, completer.session.tokenizer, index)
    return completer


def repository_of(path: str) -> str:
    """The git work tree holding the file, else its folder: what `--strategy repo` indexes by default."""
    import subprocess
    from pathlib import Path

    folder = Path(path).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True,
                             check=False)
    except OSError:
        return str(folder)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else str(folder)


def check_generation_args(args) -> None:
    """Refuse a bad budget or sampling value in one line, before minutes of model loading are spent."""
    import math

    checks = [("--max-new-tokens", args.max_new_tokens, 1 <= args.max_new_tokens <= MAX_NEW_TOKENS,
               f"1..{MAX_NEW_TOKENS}"),
              ("--max-draft", args.max_draft, 1 <= args.max_draft <= MAX_DRAFT, f"1..{MAX_DRAFT}"),
              ("--temperature", args.temperature, math.isfinite(args.temperature) and args.temperature >= 0,
               "a finite number >= 0"),
              ("--top-p", args.top_p, 0 < args.top_p <= 1, "(0, 1]"),
              ("--top-k", args.top_k, args.top_k >= 0, ">= 0")]
    for flag, value, ok, allowed in checks:
        if not ok:
            raise SpecdecError(f"{flag} {value} is out of range ({allowed})")


def at_cursor(args):
    """(prefix, suffix, CursorContext): the text around the cursor and what the code there says about the completion,
    as the server takes them (lsp_server/cursor.py, service.py): the completion wing's window around the cursor and
    `syntax.analyze` in the file's language (by its name). Like a completion the user asked for in the editor, one
    inside a string or a comment is made all the same."""
    from specdec.completion import syntax
    from specdec.completion.window import window
    from specdec.prompts.completion import read_source, split_at
    from specdec.prompts.languages import detect_language

    source = read_source(args.file)
    before, _ = split_at(source, args.line, args.col)
    prefix, suffix = window(source, len(before))
    return prefix, suffix, syntax.analyze(detect_language(None, args.file), prefix, suffix)


def cmd_complete(args) -> int:
    """The completion the editor would show at the cursor: generation stopped by the completion wing's stop rule
    (end of the line, of the block...) and its text trimmed by `finalize`, as the server's hosts do
    (lsp_server/hosts.py, remote_host.py), so the command and the editor answer alike."""
    from specdec.completion import syntax
    from specdec.engine.session import GenerationConfig
    from specdec.engine.sampling import SamplingConfig

    from pathlib import Path

    from specdec.backends.local import request_context
    from specdec.repository.build import document_key

    check_generation_args(args)  # validate everything before the models load
    prefix, suffix, ctx = at_cursor(args)
    from specdec.backends.remote.cli import check_engine_args

    engine = check_engine_args(args)
    check_trace_json(args.trace_json)
    if engine:
        return complete_remotely(args, engine, prefix, suffix, ctx)
    repo = args.repo or (repository_of(args.file) if args.strategy == "repo" else None)
    if repo and not Path(repo).is_dir():
        raise SpecdecError(f"--repo {repo}: not a folder")
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    completer = load_completer(args, args.strategy, repo)
    tracing = args.trace or args.trace_json
    result = completer.complete(prefix, suffix, GenerationConfig(args.max_new_tokens, sampling, args.max_draft,
                                                                 trace=bool(tracing)), path=args.file,
                                stop=syntax.stop_predicate(ctx),
                                request=request_context(completer, document_key(args.file)))
    text = syntax.finalize(ctx, result.text, result.stop_reason)
    if args.json:
        print(json.dumps({"text": text, "stats": stats_json(result)}))
    else:
        sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    if tracing:  # the engine's own text, marked pass by pass (the server's specdec/trace adds the shown text)
        write_trace(args, result.trace, completer.session.tokenizer)
    return 0


def stats_json(result) -> dict:
    """`--json`'s stats of a local generation (specdec complete's, specdec next-edit's)."""
    s = result.stats
    return {"target_passes": s.target_passes, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4), "tokens_per_pass": round(s.tokens_per_pass, 4),
            "new_tokens": s.new_tokens, "seconds": round(s.seconds, 4), "strategy": s.strategy,
            "stop_reason": result.stop_reason, "prefill_computed": s.prefill_computed,
            "prefill_reused": s.prefill_reused, "prefill_seconds": round(s.prefill_seconds, 4),
            "draft_seconds": round(s.draft_seconds, 4), "verify_seconds": round(s.verify_seconds, 4)}


def complete_remotely(args, engine: str, prefix: str, suffix: str, ctx) -> int:
    """`specdec complete --engine KIND --engine-url URL`: the same completion from a shared engine, stopped and
    trimmed by the same rules (ctx: syntax.CursorContext); --json and --trace report the engine's own speculation
    counts (or that it reported none)."""
    from specdec.backends.base import CompletionRequest
    from specdec.backends.remote.cli import engine_bounds, load_engine
    from specdec.completion import syntax

    backend = load_engine(engine, args.engine_url, target=args.target, **engine_bounds(args))
    request = CompletionRequest(prefix=prefix, suffix=suffix, path=args.file, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    result = backend.complete(request, syntax.stop_predicate(ctx))
    if result.stop_reason == "error":
        raise SpecdecError(backend.health.reason or f"{engine} at {backend.endpoint.shown} did not answer")
    text = syntax.finalize(ctx, result.text, result.stop_reason)
    s = result.stats
    if args.json:
        drafted, accepted, passes = s["drafted"], s["accepted"], s["target_passes"]
        stats = {"engine": engine, "speculation": s["speculation"], "target_passes": passes, "drafted": drafted,
                 "accepted": accepted, "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
                 "tokens_per_pass": round(s["new_tokens"] / passes, 4) if passes else None,
                 "new_tokens": s["new_tokens"], "seconds": round(s["seconds"], 4), "stop_reason": result.stop_reason}
        print(json.dumps({"text": text, "stats": stats}))
    else:
        sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    if args.trace or args.trace_json:
        recorded = result.trace.as_dict()
        if args.trace_json:
            write_trace_json(args.trace_json, recorded)
        if args.trace:
            counts = ("not reported" if recorded["speculation"] == "not reported" else
                      f"{recorded['accepted']} of {recorded['drafted']} drafted tokens accepted over "
                      f"{recorded['target_passes'] or '?'} passes ({recorded['speculation']})")
            (sys.stderr if args.json else sys.stdout).write(f"\n{engine}: {recorded['new_tokens']} tokens; "
                                                            f"speculation {counts}; per pass: not sent by engines\n")
    return 0


def check_trace_json(path: str | None) -> None:
    """Refuse a --trace-json path that cannot be written, in one line, before models load or an engine is asked:
    a folder, a missing or read-only folder. What only writing tells (a full disk, /dev/full) write_trace_json
    says."""
    import os
    from pathlib import Path

    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise SpecdecError(f"--trace-json {path}: is a folder, not a file")
    folder = target.resolve().parent
    if not folder.is_dir():
        raise SpecdecError(f"--trace-json {path}: its folder does not exist")
    if not os.access(target if target.exists() else folder, os.W_OK):
        raise SpecdecError(f"--trace-json {path}: not writable")


def write_trace_json(path: str, recorded: dict) -> None:
    """--trace-json FILE: the records as JSON; a failed write (a full disk) is one line, not a traceback."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(recorded, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise SpecdecError(f"--trace-json {path}: {exc.strerror or exc}") from None


def write_trace(args, trace, tokenizer) -> None:
    """--trace: the completion again, marked pass by pass, and the tables (to stderr under --json, so stdout
    stays one JSON line); --trace-json FILE: the records as JSON (the shape the server's specdec/trace returns)."""
    from specdec.engine.trace_render import render, wants_colour

    trace.adapter = getattr(args, "adapter", None) or ""
    recorded = trace.as_dict(tokenizer.decode)
    if args.trace_json:
        write_trace_json(args.trace_json, recorded)
    if args.trace:
        stream = sys.stderr if args.json else sys.stdout
        stream.write("\n" + render(recorded, wants_colour(stream)))


def register(sub) -> None:
    p = sub.add_parser("complete", help="fill-in-the-middle completion at a cursor")
    p.add_argument("file")
    p.add_argument("--line", type=int, required=True, help="1-based line")
    p.add_argument("--col", type=int, required=True, help="1-based column (characters)")
    add_model_args(p)
    p.add_argument("--strategy", choices=STRATEGIES, default="auto")
    p.add_argument("--repo", help="index this folder for the repository drafter (repo, auto, tree); repo's default: "
                                  "the file's git work tree (the file itself is not drafted from)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-draft", type=int, default=8, help="cap on drafted tokens per target pass")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--trace", action="store_true",
                   help="print the completion again marked by what produced each token, then a table per pass and "
                        "per drafter source (colours on a terminal; docs/architecture.md: trace_render.py)")
    p.add_argument("--trace-json", metavar="FILE", help="write the pass trace as JSON to FILE")
    from specdec.backends.remote.cli import add_engine_args

    add_engine_args(p)
    p.set_defaults(func=cmd_complete)
