"""`specdec bench --finetune REPO`: does a repository's adapter make speculation faster on its held-out files?
(`specdec bench --repo PKG`, which sets the adapter beside the repository index, registers here: repo_bench.py.)

Fine-tunes the draft on the repository as `specdec finetune` does (held-out files excluded; `--max-minutes` bounds
the whole fine-tune: loading, both measurements, training and registering, and its report gives the time split and
the peak RSS), then runs the engine benchmark on the held-out files twice, with the base draft and with the adapter
(as the server runs it), and prints acceptance, tokens per pass and speedup before/after. The engine benchmark's
own time is not in the budget. With several objectives (finetune_compare.py) and for `--repo` (repo_bench.py),
`--max-minutes` bounds each training alone (per objective, per package), the loading and scoring around it not.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser, Namespace
from copy import copy
from pathlib import Path

from specdec_adapters.registry import Registry
from specdec_finetune.run import finetune_repo
from specdec_finetune.run import register as register_finetune


def _finetune_args(args, repo: str | None = None, **overrides) -> Namespace:
    """`specdec finetune REPO`'s own defaults (one source of truth), with the bench's models and time budget."""
    parser = ArgumentParser()
    register_finetune(parser.add_subparsers())
    ft_args = parser.parse_args(["finetune", str(repo or args.finetune), "--target", args.target, "--draft", args.draft,
                                 "--dtype", args.dtype, "--max-minutes", str(args.max_minutes),
                                 "--draft-quant", args.draft_quant, "--device", getattr(args, "device", "auto")])
    for key, value in overrides.items():
        setattr(ft_args, key, value)
    return ft_args


def register(parser):
    """`specdec bench --finetune REPO` and its flags; the runner answers None unless --finetune was given."""
    parser.add_argument("--finetune", metavar="REPO", help="adapter benchmark instead: fine-tune on REPO, then "
                                                           "compare speculation on its held-out files without/with "
                                                           "the adapter")
    parser.add_argument("--objective", default="distill",
                        help="--finetune: training objective; a comma list (distill,lm,mixed,argmax,tvd) compares "
                             "them instead, each trained for --max-minutes")
    parser.add_argument("--max-minutes", type=float, default=30.0,
                        help="--finetune: the fine-tune's whole time budget, as `specdec finetune --max-minutes` "
                             "(loading, both measurements, training, registering; the report gives the split and "
                             "the peak RSS), the engine benchmark after it not included; with several --objective "
                             "values, each objective's training; --repo: each package's training")
    from specdec_bench import repo_bench

    run_repo = repo_bench.register(parser)
    return lambda args: run(args) if args.finetune else run_repo(args)


def run(args) -> int:
    from specdec_bench.runner import run_bench

    objectives = [o.strip() for o in args.objective.split(",") if o.strip()]
    if len(objectives) > 1:
        return _compare(args, objectives)
    ft_args = _finetune_args(args, objective=args.objective, max_steps=100_000, force=True)
    outcome = finetune_repo(ft_args)
    meta = Registry().get(*outcome["registered"].split("@"))
    files = outcome["heldout_files"]
    out = Path(args.output if args.output != "bench-results/bench.json" else "bench-results/finetune.json")
    runs = {}
    for label, adapter in (("base", None), ("adapter", str(Registry().path(meta)))):
        bench_args = copy(args)
        bench_args.files, bench_args.adapter, bench_args.editor = files, adapter, False
        bench_args.strategies = "hf-plain,draft"
        bench_args.output = str(out.with_name(f"{out.stem}-{label}.json"))
        print(f"\n== engine benchmark on {len(files)} held-out files, {label} draft", flush=True)
        run_bench(bench_args)
        runs[label] = json.loads(Path(bench_args.output).read_text())["summary"]["overall"]["draft"]
    b, a = outcome["before"]["total"], outcome["after"]["total"]
    print(f"\nRepository {args.finetune}: trained {outcome['training']['steps']} steps "
          f"({outcome['training']['seconds'] / 60:.1f} min, {outcome['training']['tokens']} tokens, "
          f"objective {args.objective}); {len(files)} held-out files")
    print(f"{'':26} {'base':>8} {'adapter':>8} {'change':>8}")
    print(f"{'acceptance (fixed k=4)':26} {b['acceptance_rate']:8.3f} {a['acceptance_rate']:8.3f} "
          f"{a['acceptance_rate'] - b['acceptance_rate']:+8.3f}")
    print(f"{'tokens per pass (k=4)':26} {b['tokens_per_pass']:8.2f} {a['tokens_per_pass']:8.2f} "
          f"{a['tokens_per_pass'] / b['tokens_per_pass'] - 1:+8.1%}")
    rb, ra = runs["base"], runs["adapter"]
    print(f"{'bench acceptance (draft)':26} {rb['acceptance_rate']:8.3f} {ra['acceptance_rate']:8.3f} "
          f"{ra['acceptance_rate'] - rb['acceptance_rate']:+8.3f}")
    print(f"{'bench speedup vs hf-plain':26} {rb['speedup_median']:8.2f} {ra['speedup_median']:8.2f} "
          f"{ra['speedup_median'] / rb['speedup_median'] - 1:+8.1%}")
    out.write_text(json.dumps({"finetune": outcome, "bench": runs, "adapter": meta.name}, indent=2, default=str))
    print(f"wrote {out}")
    return 0


def _compare(args, objectives: list[str]) -> int:
    """Several objectives: the same budget each, scored by held-out top-1 agreement (bench/finetune_compare.py)."""
    from specdec_bench.finetune_compare import compare_objectives, print_scores, score_dicts

    compare_args = _finetune_args(args, max_steps=100_000, heldout_samples=10)
    scores = compare_objectives(compare_args, objectives)
    print(f"\nRepository {args.finetune}: {args.max_minutes:g} min per objective")
    print_scores(scores)
    out = Path(args.output if args.output != "bench-results/bench.json" else "bench-results/finetune-objectives.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"repo": args.finetune, "minutes": args.max_minutes, "scores": score_dicts(scores)},
                              indent=2))
    print(f"wrote {out}")
    return 0
