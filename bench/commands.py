"""`specdec bench` (registered through the `specdec.commands` entry point): the engine benchmark, and its modes.

Each mode's `register(parser)` adds its flags to the bench parser and returns its runner, which answers None when
its mode was not asked for: specdec's own (`--kernels`, `--editor`, `--finetune` and `--repo`, `--humaneval`,
`--next-edit`) here, another package's through an entry point in the `specdec.bench` group. The first runner that
answers decides; with none, the engine benchmark runs.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from specdec.engine.drafters.draft_view import DRAFT_SUFFIX_TOKENS
from specdec.models.commands import add_model_args

BENCH_GROUP = "specdec.bench"
BENCH_OUTPUT = "bench-results/bench.json"
Runner = Callable[[object], "int | None"]


def cmd_bench(args) -> int:
    for runner in args.bench_runners:
        code = runner(args)
        if code is not None:
            return code
    from specdec_bench.runner import run_bench

    return run_bench(args)


def draft_suffix_tokens(text: str) -> int | None:
    """--draft-suffix-tokens: a count, or `all` (None: the draft reads the whole suffix)."""
    import argparse

    if text == "all":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'all', got {text!r}")
    return int(text)


def register(sub) -> None:
    from specdec_bench import editor, finetune, humaneval_bench, kernels, next_edit_bench

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
    p.add_argument("--fim-order", choices=("", "psm", "spm"), default="",
                   help="--humaneval and --editor: the prompt's section order (the server's fimOrder; "
                        "default: the family's own)")
    p.add_argument("--draft-suffix-tokens", type=draft_suffix_tokens, default=DRAFT_SUFFIX_TOKENS,
                   help="FIM suffix tokens the draft model reads (the target reads all); 'all' for the whole "
                        f"suffix (default {DRAFT_SUFFIX_TOKENS}; docs/benchmarks.md, Round 3)")
    p.add_argument("--output", default=BENCH_OUTPUT)
    p.add_argument("--cold", action="store_true", help="no warm previous-keystroke request for our strategies")
    p.add_argument("--repo", action="append", default=[], metavar="PKG",
                   help="repository benchmark: pinned PyPI packages (name==version) or local folders, repeated or "
                        "comma-separated; with --editor: the folder whose index the typing replay runs with")
    p.add_argument("--engine", choices=("local", "llama-server", "vllm", "sglang"),
                   help="also run the holes through a remote engine (rows engine-1, ...); docs/teams.md")
    p.add_argument("--engine-url", metavar="URL[,URL...]", help="the engine's base URL; several: one row each")
    runners: list[Runner] = [kernels.register(p), editor.register(p), finetune.register(p), humaneval_bench.register(p),
                             next_edit_bench.register(p)]  # after humaneval_bench: --next-edit reads its --limit
    runners += [plugin.load()(p) for plugin in entry_points(group=BENCH_GROUP)]  # other packages' modes
    p.set_defaults(func=cmd_bench, bench_runners=runners)
