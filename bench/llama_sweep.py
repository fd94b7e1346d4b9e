"""`python -m specdec_bench.llama_sweep`: llama.cpp's own speculation at its best on this machine.

A benchmark that claims to beat llama.cpp must beat it at its fastest configuration, not at a pathological one:
this runs llama-server configurations (threads for target and draft, polling, draft lengths, n-gram kinds) on the
engine benchmark's holes, as `specdec bench` runs its llama rows (same GGUFs, same prompts as token ids, the
previous keystroke's prompt sent first, greedy), one configuration after another, and prints each one's median and
worst tokens/s beside llama-plain's, and whether its output equals llama-plain's. The winners are the bench's
`llama-draft` and `llama-ngram` rows (specdec_bench.llama.server_args); docs/benchmarks.md keeps the table.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

DRAFT = "{draft}"  # replaced by the draft GGUF's path

# name -> llama-server arguments beside `-m TARGET -t 2` (the first is the reference every row is compared with)
CONFIGS: dict[str, list[str]] = {
    "plain": [],
    "plain-poll0": ["--poll", "0"],
    "draft-n3-td2": ["-md", DRAFT, "--spec-type", "draft-simple", "-td", "2"],
    "draft-n8-td2": ["-md", DRAFT, "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "-td", "2"],
    "draft-n16-td2": ["-md", DRAFT, "--spec-type", "draft-simple", "--spec-draft-n-max", "16",
                      "--spec-draft-n-min", "0", "-td", "2"],
    "draft-n8-td1": ["-md", DRAFT, "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "-td", "1"],
    "draft-n8-td2-poll0": ["-md", DRAFT, "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "-td", "2",
                           "--poll", "0"],
    "draft-n8-pmin": ["-md", DRAFT, "--spec-type", "draft-simple", "--spec-draft-n-max", "8", "-td", "2",
                      "--spec-draft-p-min", "0.75"],
    "spec-default": ["--spec-default"],
    "ngram-simple-m16": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "16"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}


@dataclass
class ConfigRun:
    """One configuration's figures over the holes: tokens/s per hole, drafted/accepted, and its outputs."""

    name: str
    rates: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    failed: str = ""

    def line(self, reference: ConfigRun | None, plain_median: float) -> str:
        if self.failed or not self.rates:
            return f"{self.name:<20} failed: {self.failed or 'no hole ran'}"
        median = statistics.median(self.rates)
        same = sum(a == b for a, b in zip(self.outputs, reference.outputs)) if reference else len(self.outputs)
        accept = f"{self.accepted / self.drafted:.2f}" if self.drafted else "-"
        return (f"{self.name:<20} {median:7.2f} {min(self.rates):7.2f} {median / plain_median:6.2f}x "
                f"{accept:>6} {100 * same / len(self.outputs):5.0f}%")


def run_config(binary, target, args: list[str], prompts: list[tuple[list[int], list[int]]], max_new: int,
               stops: set[int], name: str) -> ConfigRun:
    """Start llama-server with `args`, send every hole (the previous keystroke's prompt first, untimed), stop it."""
    from specdec_bench.llama import anchor_server

    run = ConfigRun(name)
    with anchor_server(binary, target, args) as anchor:
        if anchor.failed:
            run.failed = anchor.failed
            return run
        for prompt, previous in prompts:
            if anchor.complete(previous, 1, stops) is None:
                run.failed = anchor.failed
                return run
            result = anchor.complete(prompt, max_new, stops)
            if result is None:
                run.failed = anchor.failed
                return run
            run.rates.append(len(result.tokens) / result.seconds if result.seconds else 0.0)
            run.drafted += result.drafted
            run.accepted += result.accepted
            run.outputs.append(list(result.tokens))
    return run


def main(argv: list[str] | None = None) -> int:
    from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

    p = argparse.ArgumentParser(prog="python -m specdec_bench.llama_sweep", description=__doc__.splitlines()[0])
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of: {', '.join(CONFIGS)}")
    p.add_argument("--holes", type=int, default=2, help="holes per workload file (the engine benchmark's: 2)")
    p.add_argument("--limit", type=int, default=0, help="only the first N holes (0: all)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")

    from specdec.backends import llama_server
    from specdec.backends.local import LoadSpec, build
    from specdec.models.store import target_gguf
    from specdec_bench.workload import SOURCES, load_workload

    binary = llama_server.find_server()
    if binary is None:
        p.error(f"llama.cpp is not installed: {llama_server.INSTALL_HINT}")
    target, draft = target_gguf(args.target), target_gguf(args.draft)
    if target is None or draft is None:
        p.error(f"no GGUF for {args.target if target is None else args.draft}")
    # the prompts exactly as `specdec bench` builds them (its default prefix and suffix budgets)
    built = build(LoadSpec(args.target, "", "plain", max_prefix_tokens=512, max_suffix_tokens=128))
    completer = built.completer
    stops = set(completer.session.stop_token_ids)
    holes = load_workload(None, args.holes, SOURCES)
    holes = holes[: args.limit] if args.limit > 0 else holes
    prompts = [(completer.prompt(h.prefix, h.suffix).ids, completer.prompt(h.prefix[:-1], h.suffix).ids)
               for h in holes]
    print(f"{len(holes)} holes, {args.max_new_tokens} new tokens, target {target.name}, draft {draft.name}, "
          f"llama-server {binary}", flush=True)
    runs = []
    for name in names:
        extra = [str(draft) if a == DRAFT else a for a in CONFIGS[name]]
        runs.append(run_config(binary, target, ["-t", "2", *extra], prompts, args.max_new_tokens, stops, name))
        print(f"  {name}: done", flush=True)
    reference = runs[0] if runs and not runs[0].failed else None
    plain_median = statistics.median(reference.rates) if reference else 1.0
    print(f"{'config':<20} {'tok/s':>7} {'worst':>7} {'vs ' + names[0]:>7} {'accept':>6} {'=ref':>6}")
    for run in runs:
        print(run.line(reference, plain_median))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
