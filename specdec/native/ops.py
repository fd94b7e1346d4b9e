"""The native forward's row-exact building blocks: RMSNorm, residual add + RMSNorm, SiLU·mul, RoPE (alone, or with
the QKV bias and the cache write), attention over a row's prefix and tree ancestors, argmax, as C++ ops (csrc/)
registered under torch.ops.specdec_native.

Why: a row's output must be a function of that row and the keys it may see, whatever the number of rows in the
pass, the tree's shape or the prefill chunking, so greedy speculation gives plain greedy's output bit for bit.
Every op therefore works row by row on 16 fp32 lanes in a fixed order (AVX512: one register; AVX2: two), with
one fixed tree for each reduction, tails padded into a zeroed 16-lane chunk and an exp of our own, in IEEE's
default FP mode whatever the thread set (no flush-to-zero); the AVX2 and AVX512 paths give the same bits. The
instruction set is picked at load from the CPU (`isa()`) and SPECDEC_NATIVE_ISA (specdec/native/build.py says what
it means: `avx2` forces the AVX2 path).

Shapes: n rows, d model width, I intermediate width, Hq query heads, Hk kv heads, D head size, S cache slots.
"""

from __future__ import annotations

import platform
import sys
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("ops.cpp", "kernels_avx2.cpp", "kernels_avx512.cpp")  # and csrc's headers
PATHS = ("avx2", "avx512")  # the ops' instruction-set paths, lowest first
# -ffp-contract=off: no fused multiply-add the source did not write (the two paths must round alike)
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
_state: dict = {}


def _why_not() -> str:
    """Why the ops cannot run here before any build is tried, or '' (build.py says why a build cannot)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    return ""


def _load_extension() -> str:
    """Build (once per machine and source version, within build.py's time bound) and load the library; '' or
    why not. Its ops register themselves under torch.ops.specdec_native."""
    from specdec.native.build import load_extension

    loaded = load_extension("specdec_native", [CSRC / s for s in SOURCES], extra_cflags=CFLAGS,
                            extra_ldflags=LDFLAGS, extra_include_paths=[CSRC], python_module=False,
                            label="the native ops")
    return loaded.reason


def _load() -> bool:
    with _lock:
        if "ok" in _state:
            return _state["ok"]
        reason = _why_not() or _load_extension()
        if not reason and torch.ops.specdec_native.cpu_isa() == "none":
            reason = "the CPU has neither AVX2+FMA nor AVX512F"
        if not reason:  # SPECDEC_NATIVE_ISA, as build.py's docstring says (a name it refuses: one warning line)
            from specdec.native.build import native_isa

            torch.ops.specdec_native.set_isa(native_isa(PATHS, torch.ops.specdec_native.cpu_isa()))
        _state["ok"], _state["reason"] = not reason, reason
        return not reason


def available() -> bool:
    """Whether the native ops run here (built on first call; cheap afterwards)."""
    return _load()


def unavailable_reason() -> str:
    """'' when available(), else why not."""
    _load()
    return _state["reason"]


def _ops():
    if not _load():
        raise RuntimeError(f"specdec native ops unavailable: {_state['reason']}")
    return torch.ops.specdec_native


def isa() -> str:
    """The instruction set the ops run on now: 'avx512' or 'avx2'."""
    return _ops().isa()


def cpu_isa() -> str:
    """The best instruction set this CPU (and OS) supports: 'avx512' or 'avx2'."""
    return _ops().cpu_isa()


def use_isa(name: str):
    """Run the ops on `name` ('avx2' or 'avx512') inside the block (process-wide; for tests and benchmarks)."""
    from specdec.native.build import isa_switched

    return isa_switched(_ops(), name)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x f32[n, d], weight f32[d] -> f32[n, d]: weight * (x * (1 / sqrt(mean(x²) + eps))), each row on its own
    (Qwen2's and Llama's order of operations)."""
    return _ops().rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x (in place, f32[n, d]), then rms_norm(residual, weight, eps)."""
    return _ops().add_rms_norm(x, residual, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up f32[n, 2I] (gate | up) -> f32[n, I]: silu(gate) * up, with the ops' own exp."""
    return _ops().silu_mul(gate_up)


def exp(x: torch.Tensor) -> torch.Tensor:
    """The ops' exp, element by element (f32, any shape): the one every op uses, exposed for tests."""
    return _ops().exp(x)


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, NeoX's rotate-half (Qwen2, Llama): x f32[n, H, D] (last dim contiguous; a view into a
    fused QKV output is fine), positions i64[n], cos and sin f32[P, D/2] (rope_table; HF's [P, D] also works)
    -> f32[n, H, D], bitwise equal to HF's fp32 `x * cos + rotate_half(x) * sin` at those positions."""
    return _ops().rope(x, positions, cos, sin)


def qkv_rope_cache(qkv: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                   num_heads: int) -> torch.Tensor:
    """After the fused QKV projection, in one op: bias, RoPE, and the new keys and values into the cache.

    qkv f32[n, (Hq + 2 Hk) D] ([q heads | k heads | v heads]), bias f32[(Hq + 2 Hk) D] or None, positions i64[n],
    cos and sin f32[P, D/2] (rope_table), k_cache and v_cache [Hk, S, D] (bf16 or f32; written: slot slots[i]
    gets row i's roped k and its v, rounded to nearest even as .to(torch.bfloat16) does), num_heads = Hq
    -> q f32[n, Hq, D], roped. Bitwise the same as: x = qkv + bias; rope(q part), rope(k part), cache writes."""
    return _ops().qkv_rope_cache(qkv, bias, positions, cos, sin, k_cache, v_cache, slots, num_heads)


def rope_table(positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin f32[positions, head_dim/2] as HF's default rotary embedding computes them (inv_freq =
    theta^(-2i/D) in fp32, angle = position * inv_freq in fp32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix: torch.Tensor,
              extra: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of each row over the keys it may see.

    q f32[n, Hq, D]; k_cache, v_cache [Hk, S, D] (bf16 or f32); prefix i64[n]; extra i64[n, E] -> f32[n, Hq, D].
    Row i sees cache slots 0 .. prefix[i]-1, then extra[i, 0], extra[i, 1], ... up to the first -1 (its tree
    ancestors by depth, then itself); query head h reads kv head h // (Hq // Hk). Its output depends only on
    q[i] and that ordered sequence of keys and values: not on n, E, other rows or which slots hold them.
    A row that sees no key gets zeros."""
    return _ops().attention(q, k_cache, v_cache, prefix, extra, scale)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits f32[n, V] -> i64[n]: the lowest index among equal maxima (torch.argmax's documented rule,
    tested for ties in tests/native/test_native_ops.py)."""
    return torch.argmax(logits, dim=-1)


# ---- the benchmark: python -m specdec.native.ops --bench ------------------------------------------------------

def _time_ms(fn, repeat: int = 50) -> float:
    """The fastest of `repeat` calls: on a shared machine the least disturbed one says what the op costs."""
    import time

    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def bench() -> None:
    """ms per call for Qwen2.5-Coder-1.5B's shapes beside torch's equivalent, on this machine's threads."""
    import torch.nn.functional as F

    d, Hq, Hk, D, I, V = 1536, 12, 2, 128, 8960, 151936
    print(f"specdec native ops: isa={isa()} (cpu {cpu_isa()}), threads={torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'op (fastest call)':<34}{'native ms':>11}{'torch ms':>11}")
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(d, generator=gen) + 0.5
    for n in (1, 4, 8):
        x = torch.randn(n, d, generator=gen)
        r = torch.randn(n, d, generator=gen)
        print(f"{f'rms_norm n={n}':<34}{_time_ms(lambda: rms_norm(x, w, 1e-6)):>11.4f}"
              f"{_time_ms(lambda: F.rms_norm(x, (d,), w, 1e-6)):>11.4f}")
        print(f"{f'add_rms_norm n={n}':<34}{_time_ms(lambda: add_rms_norm(x, r, w, 1e-6)):>11.4f}"
              f"{_time_ms(lambda: F.rms_norm(r.add_(x), (d,), w, 1e-6)):>11.4f}")
        gu = torch.randn(n, 2 * I, generator=gen)
        print(f"{f'silu_mul n={n}':<34}{_time_ms(lambda: silu_mul(gu)):>11.4f}"
              f"{_time_ms(lambda: F.silu(gu[:, :I]) * gu[:, I:]):>11.4f}")
    cos, sin = rope_table(4096, D, 1_000_000.0)
    for n in (1, 4, 8):
        qkv = torch.randn(n, (Hq + 2 * Hk) * D, generator=gen)
        q_view = qkv[:, :Hq * D].view(n, Hq, D)
        positions = torch.arange(600, 600 + n)

        def rope_reference():
            c = torch.cat([cos, cos], -1)[positions].unsqueeze(1)
            s = torch.cat([sin, sin], -1)[positions].unsqueeze(1)
            return q_view * c + torch.cat([-q_view[..., D // 2:], q_view[..., :D // 2]], -1) * s

        print(f"{f'rope q n={n}':<34}{_time_ms(lambda: rope(q_view, positions, cos, sin)):>11.4f}"
              f"{_time_ms(rope_reference):>11.4f}")
        bias = torch.randn((Hq + 2 * Hk) * D, generator=gen)
        kc = torch.zeros(Hk, 1024, D, dtype=torch.bfloat16)
        vc = torch.zeros(Hk, 1024, D, dtype=torch.bfloat16)
        slots = positions.clone()

        def qkv_reference():  # bias, rope of q and k, the cache writes, as eager torch does them
            x = qkv + bias
            c = torch.cat([cos, cos], -1)[positions].unsqueeze(1)
            s = torch.cat([sin, sin], -1)[positions].unsqueeze(1)
            q, k, v = x.view(n, Hq + 2 * Hk, D).split([Hq, Hk, Hk], 1)
            q = q * c + torch.cat([-q[..., D // 2:], q[..., :D // 2]], -1) * s
            k = k * c + torch.cat([-k[..., D // 2:], k[..., :D // 2]], -1) * s
            kc[:, slots] = k.transpose(0, 1).to(torch.bfloat16)
            vc[:, slots] = v.transpose(0, 1).to(torch.bfloat16)
            return q

        print(f"{f'qkv_rope_cache bf16 n={n}':<34}"
              f"{_time_ms(lambda: qkv_rope_cache(qkv, bias, positions, cos, sin, kc, vc, slots, Hq)):>11.4f}"
              f"{_time_ms(qkv_reference):>11.4f}")
    for ctx in (512, 2048):
        k = torch.randn(Hk, ctx + 64, D, generator=gen).to(torch.bfloat16)
        v = torch.randn(Hk, ctx + 64, D, generator=gen).to(torch.bfloat16)
        for n in (1, 4, 8):
            q = torch.randn(n, Hq, D, generator=gen)
            prefix = torch.full((n,), ctx, dtype=torch.long)
            extra = torch.tensor([[ctx + j for j in range(i + 1)] + [-1] * (n - i - 1) for i in range(n)])
            # torch: the way an eager verify pass does it (bf16 cache to f32, GQA expand, causal tree mask)
            mask = torch.zeros(n, ctx + n, dtype=torch.bool)
            mask[:, :ctx] = True
            for i in range(n):
                mask[i, ctx:ctx + i + 1] = True

            def reference():
                kk = k[:, :ctx + n].float().repeat_interleave(Hq // Hk, 0)
                vv = v[:, :ctx + n].float().repeat_interleave(Hq // Hk, 0)
                return F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask, scale=D ** -0.5)

            print(f"{f'attention bf16 ctx={ctx} n={n}':<34}"
                  f"{_time_ms(lambda: attention(q, k, v, prefix, extra, D ** -0.5), 20):>11.4f}"
                  f"{_time_ms(reference, 20):>11.4f}")
    for n in (1, 8):
        logits = torch.randn(n, V, generator=gen)
        print(f"{f'argmax V={V} n={n}':<34}{_time_ms(lambda: argmax(logits)):>11.4f}"
              f"{_time_ms(lambda: torch.argmax(logits, -1)):>11.4f}")


if __name__ == "__main__":
    if "--bench" not in sys.argv[1:]:
        sys.exit("usage: python -m specdec.native.ops --bench")
    if not available():
        sys.exit(f"specdec native ops unavailable: {unavailable_reason()}")
    bench()
