"""`python -m specdec.native.bench [--forward native|transformers] [--context 512]`: the target's plain decode step
at a given context, and the process's RSS, on one forward. Run once per forward (separate processes, so each RSS
is its own); the numbers go to docs/, not into tests."""

from __future__ import annotations

import argparse
import resource
import time


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MiB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    current = int(fields["VmRSS"].split()[0]) / 1024
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    from specdec.models.catalog import DEFAULT_TARGET

    p = argparse.ArgumentParser(prog="python -m specdec.native.bench")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--forward", choices=("native", "transformers"), default="native")
    p.add_argument("--context", type=int, default=512, help="tokens in the cache before the timed steps")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps (the median is reported)")
    p.add_argument("--verify", type=int, default=0, help="also time a verify pass of this many rows (0: none)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 keeps a shared "
                   "machine's scheduling out of the figure")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from specdec.engine.cached_lm import as_cached_lm
    from specdec.models.loading import load_pair

    started = time.perf_counter()
    pair = load_pair(args.target, None, target_quant="auto", forward=args.forward)  # the default configuration
    load_s = time.perf_counter() - started
    lm = as_cached_lm(pair.target.model)
    ids = pair.target.tokenizer.encode("def fibonacci(n):\n    " * 200)[: args.context]
    lm.sync(ids)
    token = int(torch.argmax(lm.extend([ids[-1]])[-1]))  # warm-up step
    times, cpu = [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        token = int(torch.argmax(lm.extend([token])[-1]))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if len(lm.tokens) >= args.context + args.steps:
            break
    times.sort()
    line = (f"{args.forward}: {args.target} quant {pair.target_quant}, threads {torch.get_num_threads()}, "
            f"load {load_s:.1f} s; plain step at {args.context} context: median {1000 * times[len(times) // 2]:.1f} ms, "
            f"best {1000 * times[0]:.1f} ms, CPU time median {1000 * sorted(cpu)[len(cpu) // 2]:.1f} ms "
            f"({len(times)} steps)")
    if args.verify:
        lm.truncate(args.context)
        passes = []
        for _ in range(5):
            t0 = time.perf_counter()
            lm.extend([token] * args.verify)
            passes.append(time.perf_counter() - t0)
            lm.truncate(args.context)
        line += f"; verify pass of {args.verify} rows: best {1000 * min(passes):.1f} ms"
    current, peak = rss_mb()
    print(f"{line}; RSS {current:.0f} MiB (peak {peak:.0f} MiB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
