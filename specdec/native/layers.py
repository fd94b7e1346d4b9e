"""What the native model calls, in one place: the row-exact ops (specdec.native.ops, C++) and the matmuls.

Every function here keeps a row's output a function of that row alone (and, for attention, of the ordered keys
it may see), whatever the rows beside it: that is what makes greedy speculation equal plain greedy bit for bit.
Where the compiled ops are missing (not built here, or not yet on this branch) a torch reference computes the
same contract row by row: each row goes through the same torch calls with the same shapes whether it came alone
or among others. It is slow, and only the tests take it; the loader runs the native forward only where
`ops_available()` (specdec.native.loading).

The matmuls: `Linear` holds one weight as the kernel that reads it (W4A8 for Q4_K codes, W8A8 for int8 per
output channel, both row-independent, specdec.models.w4a8), or fp32 (`dense`: the reference the tests compare
transformers against).

Shapes: n rows, d width, I intermediate, Hq/Hk query/kv heads, D head size, S cache slots.
"""

from __future__ import annotations

import os

import torch

from specdec.models import w4a8


def _ops():
    """specdec.native.ops where it is on this tree and runs here, else None."""
    try:
        from specdec.native import ops
    except ImportError:
        return None
    return ops if ops.available() else None


def ops_available() -> bool:
    return _ops() is not None


def ops_unavailable_reason() -> str:
    try:
        from specdec.native import ops
    except ImportError:
        return "the native ops are not part of this build"
    return ops.unavailable_reason()


# ---- row-exact ops ---------------------------------------------------------------------------------------------

def _rms_row(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean() + eps))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x f32[n, d], weight f32[d] -> f32[n, d]."""
    ops = _ops()
    if ops is not None:
        return ops.rms_norm(x, weight, eps)
    return torch.stack([_rms_row(row, weight, eps) for row in x])


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x (in place, f32[n, d]); returns rms_norm(residual)."""
    ops = _ops()
    if ops is not None:
        return ops.add_rms_norm(x, residual, weight, eps)
    residual.add_(x)
    return rms_norm(residual, weight, eps)


def int8_norms(linears: list) -> bool:
    """Whether the norms feeding these Linears may hand them int8 rows (add_rms_norm_int8): every one reads them
    (W4A8/W8A8), the kernels load here, and SPECDEC_FUSED_NORM=0 (the A/B switch) is not set. A model asks once;
    int8_norms_now says whether a pass may."""
    return (os.environ.get("SPECDEC_FUSED_NORM", "1") != "0" and all(lin.kernel in INT8_KERNELS for lin in linears)
            and w4a8.load() is not None)


def int8_norms_now(linears: list) -> bool:
    """Whether this pass's norms hand these Linears int8 rows: the kernels run here (on every path: AVX2's fused norm
    has the AVX512 one's bits) and no Linear has a LoRA adapter set (its side matmul reads fp32 rows)."""
    return w4a8.fused_norm_runs() and all(lin.lora is None for lin in linears)


def add_rms_norm_int8(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> w4a8.Int8Rows:
    """add_rms_norm (rms_norm when x is None) with its output rounded as W4A8/W8A8 round activations, in one C++
    pass: the same bits their matmuls give add_rms_norm's rows, one rounding for every matmul that reads them."""
    return w4a8.add_rms_norm_int8(x, residual, weight, eps)


def last_rows(h: torch.Tensor | w4a8.Int8Rows, keep: int) -> torch.Tensor | w4a8.Int8Rows:
    """The last keep rows of a norm's output, fp32 or int8 rows."""
    return h.last(keep) if isinstance(h, w4a8.Int8Rows) else h[len(h) - keep :].contiguous()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up f32[n, 2I] (gate | up) -> f32[n, I]: silu(gate) * up."""
    ops = _ops()
    if ops is not None:
        return ops.silu_mul(gate_up)
    half = gate_up.shape[1] // 2
    return torch.stack([torch.nn.functional.silu(row[:half]) * row[half:] for row in gate_up])


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix: torch.Tensor,
              extra: torch.Tensor, scale: float) -> torch.Tensor:
    """q f32[n, Hq, D]; k_cache, v_cache [Hk, S, D]; prefix i64[n]; extra i64[n, E] -> f32[n, Hq, D].

    Row i sees slots 0 .. prefix[i]-1, then extra[i, :] up to the first -1, in that order."""
    ops = _ops()
    if ops is not None:
        return ops.attention(q, k_cache, v_cache, prefix, extra, scale)
    hq, hk = q.shape[1], k_cache.shape[0]
    out = []
    for i in range(q.shape[0]):
        tail = extra[i]
        ends = (tail < 0).nonzero()
        tail = tail[: int(ends[0]) if len(ends) else len(tail)]
        slots = torch.cat([torch.arange(int(prefix[i])), tail])
        keys = k_cache[:, slots].float().repeat_interleave(hq // hk, 0)  # [Hq, L, D]
        values = v_cache[:, slots].float().repeat_interleave(hq // hk, 0)
        scores = (keys @ q[i][:, :, None])[:, :, 0] * scale  # [Hq, L]
        out.append((torch.softmax(scores, -1)[:, None, :] @ values)[:, 0])
    return torch.stack(out)


def rope_table(positions: int, head_dim: int, theta: float, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin f32[positions, D/2] as transformers' default rotary embedding computes them (inv_freq and angles in
    fp32), its "linear" one for scale != 1 (inv_freq / scale). Made once per model: a position's entry never
    depends on the pass that reads it."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scale != 1.0:
        inv_freq = inv_freq / scale
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half: x f32[n, H, D] (a view into fused QKV is fine), positions i64[n], cos/sin f32[P, D/2]
    -> x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) for halves x1 | x2."""
    ops = _ops()
    if ops is not None:
        return ops.rope(x, positions, cos, sin)
    c, s = cos[positions], sin[positions]
    c, s = torch.cat([c, c], -1)[:, None, :], torch.cat([s, s], -1)[:, None, :]
    half = x.shape[-1] // 2
    return x * c + torch.cat([-x[..., half:], x[..., :half]], -1) * s


def qkv_rope_cache(qkv: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                   num_heads: int) -> torch.Tensor:
    """After the fused QKV projection: bias, RoPE of q and k, k and v into the cache at `slots`; returns q.

    qkv f32[n, (Hq + 2 Hk) D] (q heads | k heads | v heads), bias f32[(Hq + 2 Hk) D] or None, positions i64[n],
    cos/sin f32[P, D/2], k_cache/v_cache [Hk, S, D] -> q f32[n, Hq, D]."""
    ops = _ops()
    if ops is not None:
        return ops.qkv_rope_cache(qkv, bias, positions, cos, sin, k_cache, v_cache, slots, num_heads)
    n, (hk, _, d) = qkv.shape[0], k_cache.shape
    x = qkv if bias is None else qkv + bias
    q = rope(x[:, : num_heads * d].view(n, num_heads, d), positions, cos, sin)
    k = rope(x[:, num_heads * d : (num_heads + hk) * d].view(n, hk, d), positions, cos, sin)
    k_cache[:, slots] = k.transpose(0, 1).to(k_cache.dtype)
    v_cache[:, slots] = x[:, (num_heads + hk) * d :].reshape(n, hk, d).transpose(0, 1).to(v_cache.dtype)
    return q


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits f32[n, V] -> i64[n], the lowest index among equal maxima."""
    ops = _ops()
    if ops is not None:
        return ops.argmax(logits)
    return torch.argmax(logits, dim=-1)


# ---- matmuls ---------------------------------------------------------------------------------------------------

KERNELS = ("w4a8", "w8a8", "dense")
INT8_KERNELS = ("w4a8", "w8a8")  # the ones that read int8 rows (w4a8.Int8Rows) as they read fp32 ones


class Linear:
    """y = x @ W.T (+ bias): x f32[n, in] (or int8 rows, w4a8.Int8Rows, for W4A8/W8A8) -> f32[n, out], W held as
    its kernel reads it.

    w4a8: `packed` = w4a8.pack of Q4_K codes; w8a8: `packed` = w4a8.pack8 of int8 codes, `scale` fp32[out];
    dense: `weight` fp32[out, in] (the reference; torch's matmul is not row-independent).
    `lora`, when set (a draft's adapter, specdec.native.lora): (A f32[in, r], B f32[r, out]) with the scaling in B,
    a side matmul y += (x A) B beside the packed base, switched by setting another pair or None."""

    def __init__(self, kernel: str, out_features: int, in_features: int, *, packed: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None, weight: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None):
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; use one of {', '.join(KERNELS)}")
        self.kernel, self.out_features, self.in_features = kernel, out_features, in_features
        self.packed, self.scale, self.weight = packed, scale, weight
        self.bias = None if bias is None else bias.float().contiguous()
        self.lora: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor | w4a8.Int8Rows) -> torch.Tensor:
        if isinstance(x, w4a8.Int8Rows):  # rows a fused norm already rounded (add_rms_norm_int8)
            if self.kernel not in INT8_KERNELS or self.lora is not None:
                raise TypeError(f"a {self.kernel} Linear{' with a LoRA adapter' if self.lora is not None else ''} "
                                "reads fp32 rows, not int8 ones")
            out = (w4a8.matmul_rows(x, self.packed, self.out_features) if self.kernel == "w4a8"
                   else w4a8.matmul8_rows(x, self.packed, self.scale))
            return out if self.bias is None else out + self.bias
        if self.kernel == "w4a8":
            out = w4a8.matmul(x, self.packed, self.out_features)
        elif self.kernel == "w8a8":
            out = w4a8.matmul8(x, self.packed, self.scale)
        else:
            out = x @ self.weight.T
        out = out if self.bias is None else out + self.bias
        if self.lora is not None:
            a, b = self.lora
            out = torch.addmm(out, x @ a, b)
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale, self.weight, self.bias)
                   if t is not None)
