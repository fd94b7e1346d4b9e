"""Teacher-forced next-token agreement of a quantized target with the same target unquantized.

The reference is `--target-quant none` (the GGUF dequantized to bf16), so this measures what
the int4/int8 kernels and roundings change, not the published Q4_K_M's own loss. Int4 layers
run their int4 kernel for every row here (dense_rows=0), as decode steps and verifies do; a mode
may name that kernel (int4:int8:w4a8, int4:int8:aten; default auto).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def logits(spec: str, mode: str, other: str, files: list[str], tokens: int, kernel: str = "auto") -> list:
    import torch

    from specdec.models.int4 import TargetQuantConfig, quantize_target
    from specdec.models.loading import load
    from specdec.models.store import target_gguf

    target = load(spec, "bf16")
    if mode != "none":
        gguf = target_gguf(spec) if mode == "int4" else None
        quantize_target(target.model, TargetQuantConfig(mode, dense_rows=0, other=other, kernel=kernel), gguf)
    out = []
    with torch.inference_mode():
        for f in files:
            ids = target.tokenizer.encode(Path(f).read_text())[:tokens]
            out.append(target.model(torch.tensor([ids])).logits[0].float())
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="Qwen/Qwen2.5-Coder-1.5B")
    parser.add_argument("--files", nargs="+", default=["specdec/engine/session.py", "specdec/prompts/fim.py"])
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--modes", default="int4:int8,int4:bf16,int8:int8",
                        help="mode:other pairs, int4 ones optionally :aten or :w4a8 (the int4 kernel)")
    args = parser.parse_args(argv)
    reference = logits(args.target, "none", "int8", args.files, args.tokens)
    total = sum(len(r) for r in reference)
    for pair in args.modes.split(","):
        mode, other, kernel = (pair.split(":") + ["auto"])[:3]
        start = time.perf_counter()
        got = logits(args.target, mode, other, args.files, args.tokens, kernel)
        agree = sum((a.argmax(-1) == b.argmax(-1)).sum().item() for a, b in zip(reference, got)) / total
        kl = sum(torch.nn.functional.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True,
                                            reduction="sum").item() for a, b in zip(reference, got)) / total
        print(f"{mode:5} other={other:5} kernel={kernel:5} top-1 agreement {agree:.4f}  KL(none || {mode}) {kl:.4f}  "
              f"({total} positions, {time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
