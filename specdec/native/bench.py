"""`python -m specdec.native.bench [--forward native|transformers] [--context 512] [--draft SPEC]`: the target's
plain decode step at a given context, and the process's RSS, on one forward; with --draft the pair as the engine
loads it (the draft on the same forward where it can), the draft's step beside the target's and the RSS of the
process holding both. Run once per forward (separate processes, so each RSS is its own); the numbers go to
docs/, not into tests. --isa avx512,avx2 times the native target on each instruction-set path instead (ops and
matmuls: the bits are the same), alternating step by step in one process so both see the same machine load.
--prefill N also times a cold prefill of N tokens (an empty cache, the engine's own chunked `sync`): what a request
whose prompt shares nothing with the cache waits before its first token; llama-bench's pp512 is its anchor."""

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


def step_times(lm, ids: list[int], steps: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of `steps` plain decode steps after the context `ids` (sorted wall times)."""
    import torch

    lm.sync(ids)
    token = int(torch.argmax(lm.extend([ids[-1]])[-1]))  # warm-up step
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        token = int(torch.argmax(lm.extend([token])[-1]))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    times.sort()
    return times, cpu


def prefill_times(lm, ids: list[int], rounds: int = 3) -> list[float]:
    """Wall seconds of `rounds` cold prefills of `ids` (the cache emptied before each), sorted: the first is the
    figure, since contention only adds time."""
    times = []
    for _ in range(rounds):
        lm.truncate(0)
        t0 = time.perf_counter()
        lm.sync(ids)
        times.append(time.perf_counter() - t0)
    lm.truncate(0)
    return sorted(times)


def prefill_line(n: int, seconds: float) -> str:
    """The one wording of a prefill figure: `prefill of N tokens: X ms (Y tok/s)`."""
    return f"prefill of {n} tokens: {1000 * seconds:.1f} ms ({n / seconds:.1f} tok/s)"


def compare_isas(lm, ids: list[int], isas: list[str], steps: int, verify: int) -> str:
    """One line per path: the median wall and CPU time of a plain step (and of a verify pass of `verify` rows),
    the paths taking turns step by step after the context `ids`."""
    import statistics

    from specdec.models import w4a8
    from specdec.native import ops

    def timed(fn) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - t0, time.process_time() - c0

    lm.sync(ids)
    n = len(ids)
    got = {isa: {"step": [], "verify": []} for isa in isas}
    for turn in range(steps + 2):  # the first two turns warm up
        for isa in isas:
            with ops.use_isa(isa), w4a8.use_isa(isa):
                lm.truncate(n)
                step = timed(lambda: lm.extend([ids[-1]]))
                lm.truncate(n)
                check = timed(lambda: lm.extend([ids[-1]] * verify)) if verify else None
            if turn >= 2:
                got[isa]["step"].append(step)
                if check:
                    got[isa]["verify"].append(check)
    lines = []
    for isa, times in got.items():
        parts = []
        for what, label in (("step", f"plain step at {n} context"), ("verify", f"verify pass of {verify} rows")):
            if times[what]:
                wall, cpu = (1000 * statistics.median(t[i] for t in times[what]) for i in (0, 1))
                parts.append(f"{label}: median {wall:.1f} ms, CPU time median {cpu:.1f} ms")
        lines.append(f"  {isa}: " + "; ".join(parts) + f" ({len(times['step'])} turns)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from specdec.models.catalog import DEFAULT_TARGET

    p = argparse.ArgumentParser(prog="python -m specdec.native.bench")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--forward", choices=("native", "transformers"), default="native")
    p.add_argument("--context", type=int, default=512, help="tokens in the cache before the timed steps")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps (the median is reported)")
    p.add_argument("--verify", type=int, default=0, help="also time a verify pass of this many rows (0: none)")
    p.add_argument("--prefill", type=int, default=0, help="also time a cold prefill of this many tokens (0: none)")
    p.add_argument("--draft", default="", help="also load this draft (the default pair: Qwen/Qwen2.5-Coder-0.5B) "
                   "and time its plain step at the same context")
    p.add_argument("--draft-forward", choices=("native", "transformers"), default=None,
                   help="the draft's forward when it differs from --forward (transformers: today's int8 draft beside "
                        "a native target)")
    p.add_argument("--draft-form", choices=("int4", "int8"), default=None,
                   help="the native draft's weights beside its Q4_K codes (default: the loader's, NATIVE_DRAFT_FORM)")
    p.add_argument("--adapter", default="", help="a LoRA adapter folder for the draft (the side matmuls' cost)")
    p.add_argument("--isa", default="", help="instruction-set paths of the native target to compare, alternating in "
                   "this process: avx512,avx2 (the CPU must have them)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 keeps a shared "
                   "machine's scheduling out of the figure")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from specdec.engine.cached_lm import as_cached_lm
    from specdec.models.loading import load_draft, load_pair

    started = time.perf_counter()
    pair = load_pair(args.target, None, target_quant="auto", forward=args.forward)  # the default configuration
    if args.draft:
        pair.draft = load_draft(args.draft, pair.target, adapter=args.adapter or None,
                                forward=args.draft_forward or args.forward, native_form=args.draft_form)
    load_s = time.perf_counter() - started
    if args.context < 1 or args.prefill < 0:
        p.error("--context must be >= 1 and --prefill >= 0")
    text = "def fibonacci(n):\n    "
    ids = pair.target.tokenizer.encode(text * (1 + max(args.context, args.prefill) // 4))
    prefill_ids, ids = ids[: args.prefill], ids[: args.context]
    line = f"{args.forward}: load {load_s:.1f} s, threads {torch.get_num_threads()}"
    if args.isa:
        if not callable(getattr(pair.target.model, "new_cached_lm", None)):
            p.error("--isa compares the native forward's paths; the target is not on it")
        print(f"{line}; target {pair.target.spec}, the paths alternating:\n"
              + compare_isas(as_cached_lm(pair.target.model), ids, args.isa.split(","), args.steps, args.verify),
              flush=True)
        return 0
    if callable(getattr(pair.target.model, "new_cached_lm", None)):
        from specdec.models import w4a8
        from specdec.native import ops

        line += f", isa {ops.isa()} ops / {w4a8.isa()} matmuls"
    steps = {}
    for role, loaded in (("target", pair.target), ("draft", pair.draft)):
        if loaded is None:
            continue
        lm = as_cached_lm(loaded.model)
        times, cpu = step_times(lm, ids, args.steps)
        steps[role] = times[len(times) // 2]
        kind = "native" if callable(getattr(loaded.model, "new_cached_lm", None)) else "transformers"
        quant = pair.target_quant if role == "target" else "int8"
        if role == "draft" and kind == "native":
            from specdec.native.loading import NATIVE_DRAFT_FORM

            quant = f"Q4_K + {args.draft_form or NATIVE_DRAFT_FORM}"
        line += (f"; {role} {loaded.spec} ({kind}, {quant}) plain step at {args.context} context: median "
                 f"{1000 * steps[role]:.1f} ms, best {1000 * times[0]:.1f} ms, CPU time median "
                 f"{1000 * sorted(cpu)[len(cpu) // 2]:.1f} ms ({len(times)} steps)")
        if role == "target" and args.verify:
            lm.truncate(args.context)
            token = ids[-1]
            passes = []
            for _ in range(5):
                t0 = time.perf_counter()
                lm.extend([token] * args.verify)
                passes.append(time.perf_counter() - t0)
                lm.truncate(args.context)
            line += f"; verify pass of {args.verify} rows: best {1000 * min(passes):.1f} ms"
        if role == "target" and args.prefill:
            line += "; " + prefill_line(args.prefill, prefill_times(lm, prefill_ids)[0])
    if len(steps) == 2:
        line += f"; draft/target step {steps['draft'] / steps['target']:.2f}"
    current, peak = rss_mb()
    print(f"{line}; RSS {current:.0f} MiB (peak {peak:.0f} MiB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
