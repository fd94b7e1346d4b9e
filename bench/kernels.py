"""`specdec bench --kernels`: the target's matmul kernels per shape and row count, then whole-model steps.

Rows are the tokens in one call: 1 for a decode step, k + 1 for a verify pass, up to 64 for a
prefill chunk (specdec.engine.kv.PREFILL_CHUNK), 512 for an unchunked prefill. Shapes are the 1.5B
target's (out x in). Each kernel is timed on the same random weight in the same process,
back to back, so their ratios hold even on a loaded machine; absolute times do not.
The whole-model part runs each target quantization in its own process, for its peak RSS;
`--interleave` instead loads them side by side in one process and times their steps in turns, so
their ratios hold on a shared machine, and compares their greedy outputs.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

SHAPES = {  # (out, in) of the 1.5B target's Linear layers
    "q/o 1536x1536": (1536, 1536),
    "k/v 256x1536": (256, 1536),
    "gate/up 8960x1536": (8960, 1536),
    "down 1536x8960": (1536, 8960),
    "lm_head 151936x1536": (151936, 1536),
}
ROWS = (1, 2, 4, 8, 16, 32, 64, 512)


@dataclass
class KernelBenchConfig:
    shapes: tuple[str, ...] = tuple(SHAPES)
    rows: tuple[int, ...] = ROWS
    budget_s: float = 0.25  # timing budget per (kernel, shape, rows) cell, after one warm-up call
    max_reps: int = 20


def _time_interleaved(fns: dict, config: KernelBenchConfig) -> dict[str, float]:
    """Best ms per call of each fn, calls interleaved round-robin so all see the same load.

    The minimum, not the median: on a shared machine a call's excess over its best is time
    spent waiting for a core, which says nothing about the kernel.
    """
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    spent, reps = 0.0, 0
    while reps < 3 or (spent < config.budget_s * len(fns) and reps < config.max_reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            best[name] = min(best[name], elapsed)
            spent += elapsed
        reps += 1
    return {name: round(t * 1e3, 3) for name, t in best.items()}


def kernels(shape: tuple[int, int]) -> dict:
    """name -> fn(x) for one random weight of `shape`, each in the form the target would hold it.
    int4 / int8 are ATen's kernels; w4a8 / w8a8 (where they run here) specdec's, on the same codes."""
    import torch

    from specdec.models import w4a8
    from specdec.models.gguf_codes import int8_per_channel, q4k_codes, quantize_q4k
    from specdec.models.int4 import Int4Linear, Int8ChannelLinear

    out, inp = shape
    weight = torch.randn(out, inp) * 0.02
    dense = weight.bfloat16()
    codes = q4k_codes(quantize_q4k(weight), inp)
    int4 = Int4Linear(codes, dense_rows=0, kernel="aten")
    int8 = Int8ChannelLinear(int8_per_channel(weight))
    fns = {"bf16": lambda x: torch.nn.functional.linear(x, dense), "int4": int4, "int8": int8}
    if w4a8.load() is not None:
        fns["w4a8"] = Int4Linear(codes, dense_rows=0, kernel="w4a8")
        fns["w8a8"] = Int8ChannelLinear(int8_per_channel(weight), kernel="w8a8")
    return fns


def kernel_table(config: KernelBenchConfig) -> list[dict]:
    import torch

    rows_out = []
    for name in config.shapes:
        fns = kernels(SHAPES[name])
        for rows in config.rows:
            x = torch.randn(rows, SHAPES[name][1]).bfloat16()
            with torch.inference_mode():
                row = {"shape": name, "rows": rows, **_time_interleaved({k: (lambda f=f: f(x)) for k, f in fns.items()},
                                                                         config)}
            rows_out.append(row)
            print(f"{name:22} {rows:4d} " + " ".join(f"{k}={row[k]:9.3f}" for k in fns), flush=True)
        del fns
    return rows_out


def load_mode(target: str, mode: str):
    """The target as a whole-model mode names it: a TARGET_QUANT, int4 optionally as int4:KERNEL (one of
    INT4_KERNELS), and int4:w4a8:aten8 for W4A8 int4 layers beside ATen int8 ones (SPECDEC_W8A8=0)."""
    import os
    from unittest import mock

    from specdec.models.loading import load_pair

    quant, _, rest = mode.partition(":")
    kernel, _, int8 = rest.partition(":")
    if int8 not in ("", "aten8"):
        raise ValueError(f"unknown int8 kernel suffix {int8!r} in {mode!r} (aten8)")
    with mock.patch.dict(os.environ, {"SPECDEC_W8A8": "0"} if int8 == "aten8" else {}):
        return load_pair(target, None, target_quant=quant, int4_kernel=kernel or "auto", forward="transformers")


def model_steps(target: str, mode: str, context: int = 256, reps: int = 5) -> dict:
    """Decode-step (1 row) and verify (8 rows) ms of the whole target at `context` tokens of cache.
    mode: a TARGET_QUANT, int4 optionally as int4:KERNEL (one of INT4_KERNELS)."""
    from specdec.engine.kv import KVModel

    start = time.perf_counter()
    pair = load_mode(target, mode)
    load_s = time.perf_counter() - start
    kv = KVModel(pair.target.model)
    prompt = _timing_prompt(pair.target.tokenizer)
    kv.sync(prompt[:context])
    result = {"mode": mode, "load_s": round(load_s, 1)}
    for label, n in (("decode_1_ms", 1), ("verify_8_ms", 8)):
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            kv.extend(prompt[context:context + n])
            times.append(time.perf_counter() - t0)
            kv.truncate(context)
        result[label] = round(min(times[1:]) * 1e3, 1)  # best: see _time_interleaved
        result[label.replace("_ms", "_median_ms")] = round(statistics.median(times[1:]) * 1e3, 1)
    t0 = time.perf_counter()
    kv.truncate(0)
    kv.sync(prompt[:context])
    result[f"prefill_{context}_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def _timing_prompt(tokenizer) -> list[int]:
    return tokenizer.encode("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)\n") * 64


def interleaved_steps(target: str, modes: list[str], context: int = 256, reps: int = 10, rows=(1, 4, 8),
                      agreement_holes: int = 4, agreement_tokens: int = 32) -> dict:
    """Each mode's whole target ("none", "int8", "int4", "int4:aten", "int4:w4a8"), loaded side by side,
    its n-row steps at `context` tokens of cache timed in turns (order shuffled per round): ms best
    and median per mode and row count. Then each greedy-completes the same workload holes; tokens
    equal to the first mode's, up to the first difference, are reported as agreement.

    The int4 layers' dense prefill copies are dropped (memory: three targets side by side): steps of
    <= 9 rows never read them, and the completions' prefills run on the int4 kernels too."""
    import torch

    from specdec_bench.workload import load_workload
    from specdec.engine.kv import KVModel
    from specdec.engine.session import GenerationConfig, Session
    from specdec.models.int4 import Int4Linear, int4_kernel_in_use
    from specdec.prompts.completion import Completer

    models, tokenizer, result = {}, None, {}
    for mode in modes:
        start = time.perf_counter()
        pair = load_mode(target, mode)
        for layer in pair.target.model.modules():
            if isinstance(layer, Int4Linear):
                layer.dense = None
        models[mode], tokenizer = pair.target.model, pair.target.tokenizer
        result[mode] = {"load_s": round(time.perf_counter() - start, 1), "int4_kernel": int4_kernel_in_use(models[mode])}
        print(f"loaded {mode} in {result[mode]['load_s']} s", file=sys.stderr, flush=True)
    prompt = _timing_prompt(tokenizer)
    kvs = {mode: KVModel(model) for mode, model in models.items()}
    for kv in kvs.values():
        kv.sync(prompt[:context])
    times = {(mode, n): [] for mode in modes for n in rows}
    order = [(mode, n) for mode in modes for n in rows]
    with torch.inference_mode():
        for rep in range(reps + 1):
            random.Random(rep).shuffle(order)
            for mode, n in order:
                t0 = time.perf_counter()
                kvs[mode].extend(prompt[context:context + n])
                if rep:  # the first round warms up
                    times[mode, n].append(time.perf_counter() - t0)
                kvs[mode].truncate(context)
    for (mode, n), ts in times.items():
        result[mode][f"rows_{n}_ms"] = round(min(ts) * 1e3, 1)  # best: see _time_interleaved
        result[mode][f"rows_{n}_median_ms"] = round(statistics.median(ts) * 1e3, 1)
    del kvs
    print(f"timed {reps} rounds: {json.dumps(result)}; greedy completions of {agreement_holes} holes next",
          file=sys.stderr, flush=True)
    holes = load_workload(None, 1)[:agreement_holes]  # one hole per workload file, languages mixed
    outputs = {mode: [] for mode in modes}
    for mode, model in models.items():
        # short prompts: without the dense copies an int4 prefill runs on the int4 kernel, slowly
        completer = Completer.for_session(Session(model, tokenizer), max_prefix_tokens=256, max_suffix_tokens=64)
        for hole in holes:
            outputs[mode].append(completer.complete(hole.prefix, hole.suffix,
                                                    GenerationConfig(max_new_tokens=agreement_tokens)).tokens)
    first = modes[0]
    for mode in modes:
        same = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
                for x, y in zip(outputs[first], outputs[mode])]
        result[mode][f"tokens_equal_to_{first}"] = f"{sum(same)}/{sum(len(x) for x in outputs[first])}"
        result[mode]["identical_holes"] = sum(x == y for x, y in zip(outputs[first], outputs[mode]))
    result["holes"] = [hole.name for hole in holes]
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def run_kernels(args) -> int:
    config = KernelBenchConfig()
    if getattr(args, "kernel_rows", ""):
        config.rows = tuple(int(r) for r in args.kernel_rows.split(","))
    if getattr(args, "kernel_shapes", ""):
        config.shapes = tuple(s for s in SHAPES if any(k in s for k in args.kernel_shapes.split(",")))
    import torch

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    print(f"ms per call (best of interleaved calls), {torch.get_num_threads()} threads", flush=True)
    table = kernel_table(config) if not getattr(args, "skip_kernels", False) else []
    steps = []
    modes = [m for m in getattr(args, "target_quants", "none,int4,int8").split(",") if m]
    if getattr(args, "interleave", False) and modes:
        steps.append(interleaved_steps(args.target, modes))
        print(json.dumps(steps[-1]), flush=True)
        modes = []
    for mode in modes:
        cmd = [sys.executable, "-m", "specdec_bench.kernels", "--model-step", mode, "--target", args.target,
               "--threads", str(torch.get_num_threads())]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            continue
        steps.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(steps[-1], flush=True)
    if args.output:
        from pathlib import Path

        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"kernels": table, "model_steps": steps}, indent=2))
    return 0


def register(parser) -> "callable":
    """`specdec bench --kernels` and its flags; the runner answers None unless --kernels was given."""
    parser.add_argument("--kernels", action="store_true",
                        help="kernel benchmark instead: bf16/int4/int8 matmul ms per shape and row count, then the "
                             "whole target's decode and verify step per --target-quants mode")
    parser.add_argument("--target-quants", default="none,int4,int8",
                        help="--kernels: whole-model modes ('' for none; int4:aten, int4:w4a8 pick the int4 kernel)")
    parser.add_argument("--kernel-rows", default="", help="--kernels: comma-separated row counts (default ROWS)")
    parser.add_argument("--interleave", action="store_true",
                        help="--kernels: load the --target-quants modes side by side in one process, time their "
                             "steps in turns and compare their greedy outputs")

    def run(args) -> int | None:
        if not args.kernels:
            return None
        if args.output == "bench-results/bench.json":
            args.output = "bench-results/kernels.json"
        return run_kernels(args)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kernel and whole-model step timings of the target")
    parser.add_argument("--model-step", help="internal: time the whole target in this quantization, print JSON")
    parser.add_argument("--target", default="Qwen/Qwen2.5-Coder-1.5B")
    parser.add_argument("--kernel-shapes", default="", help="comma-separated substrings of SHAPES' names")
    parser.add_argument("--kernel-rows", default="", help="comma-separated row counts (default ROWS)")
    parser.add_argument("--target-quants", default="none,int4,int8",
                        help="whole-model modes ('' for none; int4:aten, int4:w4a8 pick the int4 kernel)")
    parser.add_argument("--interleave", action="store_true", help="see `specdec bench --kernels --interleave`")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--output", default="")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads or min(2, torch.get_num_threads()))
    if args.model_step:
        print(json.dumps(model_steps(args.target, args.model_step)))
        return 0
    return run_kernels(args)


if __name__ == "__main__":
    sys.exit(main())
