"""W4A8: the int4 target's matmul on x86 CPUs (AVX512-VNNI, else AVX2), y = x @ W.T, W in asymmetric int4 groups of 32.

Why: ATen's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes the weights again for every
block of 4 rows with fp32 FMAs, so a verify pass of k + 1 rows costs nearly k + 1 decode steps. This
kernel unpacks each 16 x 32 weight tile once and reuses it for every row of the call with int8 dot
products (`vpdpbusd`: unsigned 4-bit codes x signed 8-bit activations), after quantizing the
activations per row and group of 32 to int8 (symmetric, dynamic, round half to even).

Numerics: w = q * scale + (zero - 8 * scale), scale and zero rounded to bf16 as Int4Linear holds them,
so for one group g of a row: sum_k w x = scale * xs_g * dot(q, xq) + (zero - 8 * scale) * sum_k x.
Rounding the activations moves results away from the exact int4 product (`reference` reproduces it);
it moves them identically whatever the row count: each row is quantized alone and each output element
is accumulated in one fixed order (threads split columns only), so a row's result is bit-identical
alone or among other rows. That is what lossless greedy speculation needs (see specdec.models.int4).

The same module holds W8A8 (`matmul8`) for the int4 target's int8-per-channel layers (the GGUF's Q6_K
tensors, lm_head among them: 0.4 G of the 1.5B's weights): ATen's `_weight_int8pack_mm` converts every
weight to float for one row at a time, several times slower than reading it; here the same activation
codes meet the int8 weights in `vpdpbusd` (weights offset by 128 to unsigned, the offset taken out
exactly with the integer sum of each group's codes), with the same row independence.

Every CPU: the kernels above are AVX512-VNNI's; csrc/w4a8_avx2.cpp holds the same two on AVX2 + FMA (vpmaddubsw
and vpmaddwd instead of vpdpbusd, two 8-lane halves per 16-column tile), reading the same packed weights and
giving the same bits for every output: the integer dots are exact on both, and the activations' rounding and
the fp32 epilogue are the same operations in the same order. Where the CPU has AMX (Intel, and Linux grants the
tile data, as torch.cpu._init_amx asks) blocks of 12 to 16 rows go through AMX tiles instead: TDPBSUD (signed
activation codes x the packed block's unsigned bytes, read as they are) gives the same exact integer dots, and the
epilogue is the VNNI kernels', so the bits are the same again. The C++ picks AMX, else AVX512-VNNI, else AVX2
(`isa()`); SPECDEC_NATIVE_ISA=avx512 or avx2 (its one meaning: specdec/native/build.py), or `use_isa`, forces a
lower path (tests compare the paths here).

The C++ sources (specdec/native/csrc/w4a8_avx2.cpp, then w4a8.cpp, one translation unit) are compiled once per
machine by specdec.native.build into `build_dir()` (under torch's extension cache, keyed by a hash of the
sources, flags, torch and Python), with per-function target attributes, so they also build on a CPU that
cannot run them. `load()` answers None where they cannot run (not x86-64, neither AVX512-VNNI nor AVX2 + FMA,
no compiler or ninja, a failed build or one past the build's time bound, SPECDEC_W4A8=0): the caller keeps
ATen's kernel.
"""

from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

GROUP = 32
TILE_N = 16  # output columns per tile: one zmm of int32/fp32 lanes
BLOCK_BYTES = 320  # one (tile, group) block: 256 bytes of codes, 16 bf16 scales, 16 bf16 zeros
# pack()'s output format, named in specdec.models.int4_cache's key: change it whenever pack() changes
PACK_LAYOUT = "v1: [N/16 tiles][K/32 groups] blocks of 4x64 nibble-pair code bytes, 16 bf16 scales, 16 bf16 zeros"
PACK8_LAYOUT = "v1: [N/16 tiles][K/32 groups] blocks of 8x64 bytes code+128; fp32 scale [N] apart"
# as /proc/cpuinfo names them: what the kernels need at least (the AVX2 path), and what the AVX512 path needs
CPU_FLAGS = frozenset({"avx2", "fma"})
VNNI_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma"})
PATHS = ("avx2", "avx512", "amx")  # the matmuls' instruction-set paths, lowest first

SOURCE = Path(__file__).resolve().parent.parent / "native" / "csrc" / "w4a8.cpp"  # shipped as package data
AVX2_SOURCE = SOURCE.with_name("w4a8_avx2.cpp")  # before SOURCE in the one translation unit

# -ffp-contract=off: no fused multiply-adds the source did not write, so every row's arithmetic is the one above
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
_state: dict = {}
NAME = "specdec_w4a8"
FUNCTIONS = ("w4a8_mm", "w8a8_mm", "w4a8_mm_q", "w8a8_mm_q", "add_rms_norm_q8", "cpu_supported", "cpu_isa", "isa",
             "set_isa")


def _extension() -> dict:
    """What specdec.native.build compiles: the source's text (load_inline binds `functions` to Python by name),
    the flags."""
    return {"sources": [AVX2_SOURCE.read_text(), SOURCE.read_text()], "functions": list(FUNCTIONS), "extra_cflags": list(CFLAGS),
            "extra_ldflags": list(LDFLAGS)}


def build_dir() -> Path:
    """One directory per machine and source version (specdec.native.build, beside torch's own extension builds):
    every process and test session reuses it."""
    from specdec.native.build import build_dir as native_build_dir

    return native_build_dir(NAME, **_extension())


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _why_not() -> str:
    """Why the kernel cannot run here, or '' when it can (the build's own reasons come from specdec.native.build)."""
    if os.environ.get("SPECDEC_W4A8", "1") == "0":
        return "disabled by SPECDEC_W4A8=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"not an x86-64 CPU ({platform.machine()})"
    if not CPU_FLAGS <= cpu_flags():
        return "the CPU lacks AVX2 + FMA (and AVX512-VNNI)"
    return ""


def _build():
    """(module, '') or (None, why not): built once per machine, within specdec.native.build's time bound, never
    waiting on a build that was killed."""
    from specdec.native.build import load_extension

    return load_extension(NAME, label="the W4A8 int4 kernel", **_extension())


def load():
    """The compiled kernel module, or None where it cannot run here (`unavailable_reason()` says why).

    Built once per machine (build_dir()); later processes only load the shared object. The answer
    is kept for the process: load() costs nothing after its first call."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        module, reason = None, _why_not()
        if not reason:
            try:
                module, reason = _build()
                if module is not None and not module.cpu_supported():
                    module, reason = None, "the CPU lacks AVX2 + FMA (and AVX512-VNNI)"
                if module is not None:  # SPECDEC_NATIVE_ISA, as specdec/native/build.py says (one warning if refused)
                    from specdec.native.build import native_isa

                    module.set_isa(native_isa(PATHS, module.cpu_isa()))
            except Exception as exc:  # noqa: BLE001 - a failed build leaves ATen's kernel working
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                module, reason = None, f"its build failed ({first})"
        _state["module"], _state["reason"] = module, reason
        return module


def unavailable_reason() -> str:
    """'' when load() found the kernel, else why not (calls load())."""
    load()
    return _state["reason"]


def isa() -> str:
    """The instruction set the matmuls run on now: 'amx' (AVX512-VNNI, and AMX tiles for 12 rows or more), 'avx512'
    (AVX512-VNNI) or 'avx2' (calls load())."""
    return _module().isa()


def cpu_isa() -> str:
    """The best instruction set this CPU (and OS) runs the matmuls on: 'amx', 'avx512' or 'avx2'."""
    return _module().cpu_isa()


def use_isa(name: str):
    """Run the matmuls on `name` ('avx2', 'avx512' or 'amx') inside the block (process-wide; for tests and benchmarks).
    A path this CPU lacks is a RuntimeError."""
    from specdec.native.build import isa_switched

    return isa_switched(_module(), name)


def _module():
    module = load()
    if module is None:
        raise RuntimeError(f"the W4A8 kernel is unavailable: {_state['reason']}")
    return module


def packed_bytes(out_features: int, in_features: int) -> int:
    """The length of pack()'s output for an [out_features, in_features] weight."""
    return out_features // TILE_N * (in_features // GROUP) * BLOCK_BYTES


def tiles(out_features: int, in_features: int) -> bool:
    """Whether the kernels' 16-column tiles and 32-input groups cover an [out_features, in_features] weight."""
    return out_features % TILE_N == 0 and in_features % GROUP == 0


def w8a8_enabled() -> bool:
    """False under SPECDEC_W8A8=0, which keeps int8 layers on ATen's (target) and fbgemm's (draft) kernels:
    the A/B switch for benchmarks."""
    return os.environ.get("SPECDEC_W8A8", "1") != "0"


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """codes uint8 [N, K] (0..15), scale/zero [N, K / 32] -> the kernel's weight, uint8 [N / 16 * K / 32 * 320].

    A pure function of its inputs (cacheable). Blocks go tile by tile (16 columns), group by group
    within a tile, so a tile's weights stream contiguously. Within a block: 4 x 64 code bytes P[p],
    low nibble R[p] and high nibble R[p + 4], R[j] byte i = code[column i // 4][k = 4 j + i % 4] of
    the group; then the 16 columns' scales and zeros, rounded to bf16."""
    n, k = codes.shape
    if not tiles(n, k):
        raise ValueError(f"w4a8 needs out % {TILE_N} == 0 and in % {GROUP} == 0, got {n}x{k}")
    nt, g = n // TILE_N, k // GROUP
    r = codes.to(torch.uint8).reshape(nt, TILE_N, g, 8, 4).permute(0, 2, 3, 1, 4).reshape(nt, g, 8, 64)
    nibbles = r[:, :, :4] | (r[:, :, 4:] << 4)

    def per_tile(v: torch.Tensor) -> torch.Tensor:  # [N, G] -> [NT, G, 32] bytes of bf16
        return v.to(torch.bfloat16).reshape(nt, TILE_N, g).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat([nibbles.reshape(nt, g, 256), per_tile(scale), per_tile(zero)], -1).reshape(-1).contiguous()


def pack8(codes: torch.Tensor) -> torch.Tensor:
    """codes int8 [N, K] (one scale per output channel, kept apart) -> w8a8's weight, uint8 [N / 16 * K / 32 * 512].

    Tile by tile (16 columns), group by group (32 inputs) as pack(); within a block 8 x 64 bytes R[j],
    R[j] byte i = code[column i // 4][k = 4 j + i % 4] + 128 (vpdpbusd multiplies unsigned by signed)."""
    n, k = codes.shape
    if not tiles(n, k):
        raise ValueError(f"w8a8 needs out % {TILE_N} == 0 and in % {GROUP} == 0, got {n}x{k}")
    nt, g = n // TILE_N, k // GROUP
    unsigned = (codes.to(torch.int16) + 128).to(torch.uint8)
    return unsigned.reshape(nt, TILE_N, g, 8, 4).permute(0, 2, 3, 1, 4).reshape(-1).contiguous()


def matmul8(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 or bf16 -> [M, N] in x's dtype: int8 weights (pack8) times int8 activations, scale fp32 [N]."""
    module = load()
    if module is None:
        raise RuntimeError(f"the W4A8 kernel is unavailable: {_state['reason']}")
    return module.w8a8_mm(x, packed, scale)


def reference8(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """matmul8's arithmetic in float64: x [M, K], int8 codes [N, K], scale [N] -> [M, N] fp64."""
    q, xs, _ = quantize_activations(x)
    m, n, g = x.shape[0], codes.shape[0], codes.shape[1] // GROUP
    dots = torch.einsum("mgk,ngk->mng", q.double().reshape(m, g, GROUP), codes.double().reshape(n, g, GROUP))
    return (dots * xs.double()[:, None, :]).sum(-1) * scale.double()[None]


def matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [M, K] fp32 or bf16 (K % 32 == 0) -> [M, out_features] in x's dtype, through the compiled kernel."""
    module = load()
    if module is None:
        raise RuntimeError(f"the W4A8 kernel is unavailable: {_state['reason']}")
    return module.w4a8_mm(x, packed, out_features)


@dataclass
class Int8Rows:
    """Activations already rounded as both kernels round them (per row and group of 32, symmetric, round half to
    even): codes int8 [M, K], scales fp32 [M, K / 32] (amax / 127), sums fp32 [M, K / 32] (of the unrounded
    group, W4A8's zero term), code_sums int32 [M, K / 32] (W8A8's offset term). What `add_rms_norm_int8` makes
    and `matmul_rows` / `matmul8_rows` read, so one rounding serves every matmul over the same rows."""

    codes: torch.Tensor
    scales: torch.Tensor
    sums: torch.Tensor
    code_sums: torch.Tensor

    def __len__(self) -> int:
        return self.codes.shape[0]

    def last(self, keep: int) -> Int8Rows:
        """The last `keep` rows (contiguous: a row block of each tensor)."""
        first = len(self) - keep
        return Int8Rows(*(t[first:] for t in (self.codes, self.scales, self.sums, self.code_sums)))


def fused_norm_runs() -> bool:
    """Whether add_rms_norm_int8 runs here: wherever the kernels load (every path, AVX2 included, gives the same
    bits)."""
    return load() is not None


def add_rms_norm_int8(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> Int8Rows:
    """residual += x (in place, fp32 [M, K]; x None: no add), then RMSNorm and the activations' rounding in one
    C++ pass per row: bit for bit the rows quantizing specdec.native's add_rms_norm (or rms_norm) output gives, on
    every path (csrc/w4a8_avx2.cpp's on AVX2). Where fused_norm_runs()."""
    return Int8Rows(*_module().add_rms_norm_q8(x, residual, weight, eps))


def matmul_rows(rows: Int8Rows, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """matmul on rows already rounded -> fp32 [M, out_features], the bits matmul gives their fp32 source."""
    return _module().w4a8_mm_q(rows.codes, rows.scales, rows.sums, packed, out_features)


def matmul8_rows(rows: Int8Rows, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """matmul8 on rows already rounded -> fp32 [M, N], the bits matmul8 gives their fp32 source."""
    return _module().w8a8_mm_q(rows.codes, rows.scales, rows.code_sums, packed, scale)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> int8 codes [M, K], scales [M, K / 32] (amax / 127), exact sums [M, K / 32], as the kernel."""
    xf = x.float().reshape(x.shape[0], -1, GROUP)
    amax = xf.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    q = torch.round(xf * inv[..., None]).clamp(-128, 127).to(torch.int8)  # round half to even, as cvtps2dq
    return q.reshape(x.shape), amax / 127.0, xf.sum(-1)


def reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in float64, pure torch: x [M, K], codes [N, K] -> [M, N] fp64.

    Equal to the kernel up to its fp32 accumulation; the activation quantization is the same."""
    q, xs, xsum = quantize_activations(x)
    m, n, g = x.shape[0], codes.shape[0], codes.shape[1] // GROUP
    dots = torch.einsum("mgk,ngk->mng", q.double().reshape(m, g, GROUP), codes.double().reshape(n, g, GROUP))
    sc, zr = scale.to(torch.bfloat16).double(), zero.to(torch.bfloat16).double()
    return (dots * xs.double()[:, None, :] * sc[None]).sum(-1) + xsum.double() @ (zr - 8 * sc).T
