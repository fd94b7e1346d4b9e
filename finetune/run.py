"""`specdec finetune REPO`: select files, build samples, measure, train, measure again, register if it helps."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from specdec_adapters.registry import AdapterMeta, Registry, repo_identity
from specdec_finetune.dataset import split_files
from specdec.repository.files import HOLDOUT, select
from specdec.errors import SpecdecError
from specdec.models.choices import LORA_MODULES as TARGET_MODULES  # the modules the server can switch per workspace
from specdec.paths import data_dir
from specdec_finetune.choices import OBJECTIVES

# torch loads with a run (the imports inside the functions), not with the parser: `specdec serve` builds every
# subcommand's parser before it answers the editor's initialize (tests/test_layering.py checks it)

MAX_SAMPLES = 2000  # more than a 30-minute CPU budget consumes; a larger budget cycles through them again


def print_selection(selection) -> None:
    print(f"{len(selection.files)} files selected, {len(selection.skipped)} skipped")
    for reason, n in sorted(selection.reasons().items()):
        print(f"  skipped {n:4d}  {reason}")
    for path, reason in sorted(selection.skipped.items()):
        if reason.startswith("secret"):
            print(f"  never trained on: {path} ({reason})")


def split_repo(repo: str, holdout: float, seed: int, show=None):
    """(root, selection, split): the repository's usable files, split by file into train and held out.
    `show(selection)` runs before a too-small repository is refused, so the user sees what was skipped."""
    root = Path(repo).expanduser()
    if not root.is_dir():
        raise SpecdecError(f"not a directory: {repo}")
    selection = select(root)
    if show:
        show(selection)
    split = split_files(selection, holdout, seed)
    if not split.train or not split.heldout:
        raise SpecdecError("need at least two usable source files (one to train on, one held out)")
    return root, selection, split


def train_config(args, objective: str | None = None):
    """The training settings (TrainConfig) `specdec finetune`'s arguments describe (the objective may be
    overridden)."""
    from specdec_finetune.train import TrainConfig

    modules = tuple(m.strip() for m in args.target_modules.split(","))
    unusable = [m for m in modules if m not in TARGET_MODULES]
    if unusable:  # refused before a long run, not by the server after it
        raise SpecdecError(f"--target-modules: {', '.join(unusable) or 'empty'} cannot be switched per workspace "
                           f"by the server (choose from {','.join(TARGET_MODULES)})")
    return TrainConfig(objective=objective or args.objective, rank=args.rank, alpha=args.alpha,
                       target_modules=modules, learning_rate=args.lr,
                       batch_size=args.batch_size, seq_len=args.seq_len, max_steps=args.max_steps,
                       max_minutes=args.max_minutes, max_tokens=args.max_tokens, seed=args.seed,
                       precision=args.precision, vocab=args.vocab, top_layers=args.top_layers,
                       quant=args.draft_quant)


def finetune_repo(args, report=print, on_step=None, clock=None, spent: float = 0.0) -> dict:
    """Select, build samples, measure, train, measure again, register if it helps, all within `--max-minutes`
    (specdec_finetune.budget: a deadline from the command's start). clock: a monotonic clock in seconds (tests
    inject one; None: time.monotonic); spent: seconds the command ran before this call (cmd_finetune: the
    process's start, imports and parser)."""
    import time

    from specdec_finetune.budget import (Budget, peak_rss_bytes, peak_rss_line, release_freed_memory,
                                         return_large_frees)

    budget = Budget(args.max_minutes * 60, clock or time.monotonic, spent=spent)
    return_large_frees()
    from specdec.engine.sampling import SamplingConfig
    from specdec.hardware import torch_device
    from specdec.prompts import fim
    from specdec_finetune.dataset import SampleBuilder
    from specdec_finetune.budget import REGISTER_RESERVE_S
    from specdec_finetune.evaluate import aggregate, holes_for, measure, spread
    from specdec_finetune.models import load_models
    from specdec_finetune.train import discard_checkpoint, train

    config = train_config(args)
    device = torch_device(getattr(args, "device", None))  # a GPU this machine lacks fails here, before loading
    sampling = SamplingConfig(temperature=args.eval_temperature, seed=args.seed)  # bad input fails before loading
    forward = getattr(args, "forward", "auto")
    root, selection, split = split_repo(args.repo, args.holdout, args.seed, show=print_selection)
    key, remote, commit = repo_identity(root)
    with budget.phase("load"):
        models = load_models(args.target, args.draft, args.dtype, device, config.quant, forward)
    target, draft, tokenizer = models.target, models.draft, models.target.tokenizer
    with budget.phase("dataset"):
        template = fim.detect(tokenizer)
        count = min(config.max_steps * config.batch_size, MAX_SAMPLES)  # training cycles through the pool
        if config.max_tokens:
            count = min(count, config.max_tokens // max(16, config.seq_len // 2) + config.batch_size)
        samples = SampleBuilder(tokenizer, template, config.seq_len).samples(split.train, count, args.seed)
        holes = spread(holes_for(split.heldout, args.eval_holes, args.seed))
    report(f"dataset: {json.dumps(split.summary())}; {len(samples)} samples; {len(holes)} held-out holes")
    teacher = models.target_forward if config.objective != "lm" else None
    report(f"the target on the {models.target_forward} forward {'teaches and verifies' if teacher else 'verifies'}; "
           f"the {models.evaluated_with} draft drafts the measurement, as the server runs it")
    before_holes, after_holes = [], []
    with budget.phase("before_eval"):
        before = measure(target.model, served_draft(models, config.quant), tokenizer, holes, args.eval_tokens,
                         sampling=sampling, deadline=budget.eval_deadline(), clock=budget.clock,
                         records=before_holes)
        models.release_served()  # not needed while training
    available, holes = len(holes), holes[: before["total"]["holes"]]
    if len(holes) < available:
        report(f"measuring {len(holes)} of the {available} held-out holes: the rest do not fit the evaluation's "
               f"share of the budget")
    report(f"before: acceptance {before['total']['acceptance_rate']:.3f}, "
           f"tokens/pass {before['total']['tokens_per_pass']:.2f}")
    workdir = data_dir() / "runs" / key
    with budget.phase("train"):
        model, result = train(draft.model, target.model if config.objective != "lm" else None, tokenizer, samples,
                              config, workdir, progress=not (args.quiet or args.progress_json), on_step=on_step,
                              device=device, deadline=budget.train_deadline(budget.split["before_eval"]),
                              clock=budget.clock)
    report(f"trained {result.steps} steps in {result.seconds:.0f} s (stopped by {result.stopped_by})")
    outcome = {"repo_key": key, "before": before, "after": before, "acceptance_gain": 0.0,
               "training": {**asdict(result), **asdict(config)}, "dataset": split.summary(),
               "skipped": selection.skipped, "registered": None,
               "heldout_files": [str((root / f.path).resolve()) for f in split.heldout],
               "teacher": teacher, "target_forward": models.target_forward, "evaluated_with": models.evaluated_with,
               "eval_holes": {"available": available, "measured": len(holes), "compared": len(holes)}}
    with tempfile.TemporaryDirectory(prefix="specdec-adapter-") as tmp:
        if result.steps:
            with budget.phase("after_eval"):
                model.save_pretrained(tmp)
                if models.load_served is not None:  # measured on the native draft: the trainable one is done
                    model = draft.model = None
                    release_freed_memory()
                try:  # the same holes, as many as the deadline leaves room for
                    after = measure(target.model, served_draft(models, config.quant, model, Path(tmp)), tokenizer,
                                    holes, args.eval_tokens, sampling=sampling, clock=budget.clock,
                                    deadline=budget.deadline - REGISTER_RESERVE_S, records=after_holes)
                finally:
                    models.release_served()
            if len(after_holes) < len(before_holes):
                before = aggregate(before_holes[: len(after_holes)])
                report(f"the measurement after training ran out of budget after {len(after_holes)} of "
                       f"{len(before_holes)} holes: before and after are compared on those "
                       f"(before: acceptance {before['total']['acceptance_rate']:.3f})")
            gain = after["total"]["acceptance_rate"] - before["total"]["acceptance_rate"]
            outcome.update(before=before, after=after, acceptance_gain=gain)
            outcome["eval_holes"]["compared"] = len(after_holes)
            report(f"after:  acceptance {after['total']['acceptance_rate']:.3f} ({gain:+.3f}), "
                   f"tokens/pass {after['total']['tokens_per_pass']:.2f}")
            if gain > 0 or args.force:
                with budget.phase("register"):
                    meta = AdapterMeta(repo_key=key, version="", repo_root=str(root.resolve()), git_remote=remote,
                                       git_commit=commit, base_draft=args.draft, base_draft_hash=draft.weight_hash,
                                       target=args.target, dataset=split.summary(), metrics_before=before,
                                       metrics_after=after, training=outcome["training"])
                    meta = Registry().register(Path(tmp), meta)
                outcome["registered"] = meta.name
                report(f"registered adapter {meta.name}" + (" (--force)" if gain <= 0 else ""))
            else:
                report("not registered: the adapter did not raise acceptance (use --force to keep it anyway)")
        else:
            report(f"not registered: no training step fit in the budget ({args.max_minutes:g} min; "
                   f"{budget.elapsed():.0f} s spent before training could start)")
    discard_checkpoint(workdir)  # only now: a crash before this point resumes the finished run and registers it
    peak = peak_rss_bytes()
    outcome.update(time=budget.summary(), peak_rss_bytes=peak, peak_rss_gb=round(peak / 1e9, 2),
                   peak_rss_phase=budget.peak_phase(),
                   peak_rss_by_phase={name: round(b / 1e9, 2) for name, b in budget.peaks.items()})
    report(budget.line())
    report(peak_rss_line(peak, budget.peak_phase()))
    return outcome


def served_draft(models, quant: str, model=None, adapter: Path | None = None):
    """The draft the measurement speculates with, as the server runs it: the native draft (models.served) with the
    adapter at `adapter` as its side matmuls (None: the base), else the transformers draft (`model`, a peft model
    with the adapter, or the base) folded and quantized (evaluate.as_served)."""
    if models.load_served is None:
        from specdec_finetune.evaluate import as_served

        return as_served(model if model is not None else models.draft.model, quant)
    return models.served(adapter)


def cmd_finetune(args) -> int:
    report, on_step = print, None
    if args.progress_json:  # machine-readable progress for the language server
        def report(message):
            print(json.dumps({"event": "log", "message": message}), flush=True)

        def on_step(step, loss):
            print(json.dumps({"event": "step", "step": step, "max": args.max_steps, "loss": loss}), flush=True)
    from specdec_finetune.budget import process_age

    try:
        outcome = finetune_repo(args, report, on_step, spent=process_age())  # the command began with the process
    except KeyboardInterrupt:
        print("interrupted: the checkpoint is saved and the registry is unchanged; run the same command to resume")
        return 130
    if args.progress_json:
        print(json.dumps({"event": "done", "registered": outcome["registered"], "gain": outcome["acceptance_gain"],
                          "time": outcome["time"], "peak_rss_gb": outcome["peak_rss_gb"]}), flush=True)
    if args.report:
        Path(args.report).write_text(json.dumps(outcome, indent=2, default=str))
    return 0


def register(sub) -> None:
    from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
    from specdec.models.choices import DRAFT_QUANT, DTYPES, FORWARDS
    from specdec.models.commands import add_device_arg

    p = sub.add_parser("finetune", help="train a LoRA adapter for the draft on a repository's own code")
    p.add_argument("repo", help="repository root")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--dtype", choices=DTYPES, default="auto", help="target dtype (auto: bf16 where native, else fp32)")
    p.add_argument("--objective", choices=OBJECTIVES, default="distill")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=int, default=32)
    p.add_argument("--target-modules", default=",".join(TARGET_MODULES))
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=384)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--max-minutes", type=float, default=30.0,
                   help="the whole command's time budget: loading, both measurements, training and registering "
                        "(training gets what the rest leaves; the report gives the split)")
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--holdout", type=float, default=HOLDOUT, help="fraction of files held out (by file)")
    p.add_argument("--eval-holes", type=int, default=3, help="FIM holes per held-out file")
    p.add_argument("--eval-tokens", type=int, default=32)
    p.add_argument("--eval-temperature", type=float, default=0.0,
                   help="measure acceptance at this sampling temperature (seeded; default 0: greedy, as completions)")
    p.add_argument("--seed", type=int, default=0)
    add_device_arg(p)
    p.add_argument("--forward", choices=FORWARDS, default="auto",
                   help="the target's forward, as `specdec serve` picks it (auto: native where a GGUF target runs "
                        "on this CPU, its int4 codes teaching the draft; transformers: a dequantized copy)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="training precision (auto: bf16 where the hardware runs it natively; on CUDA the frozen "
                        "base is held in bf16 too, and the draft is trained unquantized, as a GPU serves it)")
    p.add_argument("--vocab", choices=("full", "repo"), default="full",
                   help="compute the losses over the full vocabulary or only the repository's tokens (faster "
                        "steps; measured the same acceptance gain after 30 minutes)")
    p.add_argument("--draft-quant", choices=DRAFT_QUANT, default="int8",
                   help="the draft quantization the adapter is trained over and measured with; keep it the "
                        "server's draftQuant (an adapter fitted over the int8 base corrects part of its rounding)")
    p.add_argument("--top-layers", type=int, default=0,
                   help="LoRA on the draft's last N decoder layers only (faster steps); 0: every layer")
    p.add_argument("--force", action="store_true", help="register even if acceptance did not improve")
    p.add_argument("--report", help="write the full JSON report here")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--progress-json", action="store_true", help="JSON lines of progress on stdout (for editors)")
    p.set_defaults(func=cmd_finetune)
