"""W4A8: the int4 target's matmul on x86 CPUs with AVX512-VNNI, y = x @ W.T, W in asymmetric int4 groups of 32.

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

The C++ source is compiled once per machine by specdec.native.build into `build_dir()` (under
torch's extension cache, keyed by a hash of the source, flags, torch and Python), with
per-function target attributes, so it also builds on a CPU that cannot run it. `load()` answers
None where it cannot run (not x86-64, no AVX512-VNNI, no compiler or ninja, a failed build or one
past the build's time bound, SPECDEC_W4A8=0): the caller keeps ATen's kernel.
"""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path

import torch

GROUP = 32
TILE_N = 16  # output columns per tile: one zmm of int32/fp32 lanes
BLOCK_BYTES = 320  # one (tile, group) block: 256 bytes of codes, 16 bf16 scales, 16 bf16 zeros
# pack()'s output format, named in specdec.models.int4_cache's key: change it whenever pack() changes
PACK_LAYOUT = "v1: [N/16 tiles][K/32 groups] blocks of 4x64 nibble-pair code bytes, 16 bf16 scales, 16 bf16 zeros"
PACK8_LAYOUT = "v1: [N/16 tiles][K/32 groups] blocks of 8x64 bytes code+128; fp32 scale [N] apart"
CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})  # as /proc/cpuinfo names them

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <type_traits>

bool cpu_supported() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")

static constexpr int BLK = 320;
static constexpr int BLK8 = 512;

static inline __m512 bf16x16_to_ps(const void* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const at::BFloat16* p) { return bf16x16_to_ps(p); }

// One row: int8 codes q[K], per-group scale xs[G] (amax / 127) and exact fp32 sums xsum[G].
template <typename T>
static void quantize_row(const T* x, int64_t K, int8_t* q, float* xs, float* xsum) {
  for (int64_t g = 0; g < K / 32; ++g) {
    __m512 a = load16(x + 32 * g), b = load16(x + 32 * g + 16);
    xsum[g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    xs[g] = amax / 127.f;
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));  // round half to even
    __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
    _mm_storeu_si128((__m128i*)(q + 32 * g), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i*)(q + 32 * g + 16), _mm512_cvtsepi32_epi8(qb));
  }
}

// 16 columns' integer dot products over one group of 32: r[j] holds 4 unsigned weights of each column,
// xp the row's 32 int8 activation codes as 8 words of 4 bytes; two accumulators in a fixed order.
static inline __m512i group_dot(const __m512i* r, const int32_t* xp) {
  __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
  for (int j = 0; j < 8; j += 2) {
    i0 = _mm512_dpbusd_epi32(i0, r[j], _mm512_set1_epi32(xp[j]));
    i1 = _mm512_dpbusd_epi32(i1, r[j + 1], _mm512_set1_epi32(xp[j + 1]));
  }
  return _mm512_add_epi32(i0, i1);
}

// Calls f(std::integral_constant<int, MB>) for mb rows, 1..8 (more are 8): each tile kernel is a template on MB.
template <typename F>
static void by_rows(int mb, F&& f) {
  switch (mb) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// MB rows x 16 columns over all G groups of one tile. Block layout: 4 x 64 code bytes P[p] whose low
// nibble is R[p] and high nibble R[p + 4], R[j] byte i = code[col i / 4][k = 4 j + i % 4] of the group;
// then 16 bf16 scales and 16 bf16 zeros.
template <int MB>
static void tile_kernel(const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                        const float* xsum, float* out, int64_t ldo) {
  __m512 acc[MB], accm[MB];
  for (int m = 0; m < MB; ++m) { acc[m] = _mm512_setzero_ps(); accm[m] = _mm512_setzero_ps(); }
  const __m512i lo = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b = w + g * BLK;
    for (int c = 0; c < BLK; c += 64) _mm_prefetch((const char*)(b + 8 * BLK + c), _MM_HINT_T0);
    __m512i r[8];
    for (int p = 0; p < 4; ++p) {
      __m512i v = _mm512_loadu_si512((const void*)(b + 64 * p));
      r[p] = _mm512_and_si512(v, lo);
      r[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
    }
    __m512 sc = bf16x16_to_ps(b + 256);
    __m512 mn = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), sc, bf16x16_to_ps(b + 288));  // zero - 8 scale
    for (int m = 0; m < MB; ++m) {
      __m512i dot = group_dot(r, (const int32_t*)(xq + m * K + 32 * g));
      __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs[m * G + g]));
      acc[m] = _mm512_fmadd_ps(d, sc, acc[m]);
      accm[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum[m * G + g]), accm[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + m * ldo, _mm512_add_ps(acc[m], accm[m]));
}

// W8A8: MB rows x 16 columns of int8 weights (per output channel), G groups. Block layout: 8 x 64 bytes
// R[j], R[j] byte i = code[col i / 4][k = 4 j + i % 4] + 128 (unsigned for vpdpbusd), 512 bytes a group.
// dot(q + 128, x) = dot(q, x) + 128 * sum(x): the group's integer sum of x's codes takes the 128 out exactly.
template <int MB>
static void tile_kernel8(const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                         const int32_t* qsum, const float* scale, float* out, int64_t ldo) {
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b = w + g * BLK8;
    for (int c = 0; c < BLK8; c += 64) _mm_prefetch((const char*)(b + 4 * BLK8 + c), _MM_HINT_T0);
    __m512i r[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm512_loadu_si512((const void*)(b + 64 * j));
    for (int m = 0; m < MB; ++m) {
      __m512i dot = _mm512_sub_epi32(group_dot(r, (const int32_t*)(xq + m * K + 32 * g)),
                                     _mm512_set1_epi32(128 * qsum[m * G + g]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs[m * G + g]), acc[m]);
    }
  }
  __m512 sc = _mm512_loadu_ps(scale);
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + m * ldo, _mm512_mul_ps(acc[m], sc));
}

#pragma GCC pop_options

static void quantize_rows(const at::Tensor& x, at::Tensor& xq, at::Tensor& xs, at::Tensor& xsum) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 32;
  int8_t* q = xq.data_ptr<int8_t>();
  float *s = xs.data_ptr<float>(), *sm = xsum.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    if (x.scalar_type() == at::kFloat)
      quantize_row(x.data_ptr<float>() + m * K, K, q + m * K, s + m * G, sm + m * G);
    else
      quantize_row(x.data_ptr<at::BFloat16>() + m * K, K, q + m * K, s + m * G, sm + m * G);
  }
}

static void check_x(const at::Tensor& x, int64_t N, const char* name) {
  TORCH_CHECK(cpu_supported(), name, " needs AVX512-VNNI");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 32 == 0 && N % 16 == 0, name, ": bad shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name, ": fp32 or bf16 x");
}

// Every (16-column tile, block of <= 8 rows) of an M x N output: threads split tiles (columns) only, so each
// output element is computed by one thread in one order whatever M is. tile(t, m0, mb) with mb a constant.
template <typename F>
static void over_tiles(int64_t NT, int64_t M, F&& tile) {
  at::parallel_for(0, NT, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t m0 = 0; m0 < M; m0 += 8)
        by_rows((int)std::min<int64_t>(8, M - m0), [&](auto mb) { tile(t, m0, mb); });
  });
}

// x [M, K] fp32 or bf16 (K % 32 == 0); packed: uint8 [N / 16 * K / 32 * 320]; returns [M, N] in x's dtype.
at::Tensor w4a8_mm(const at::Tensor& x_in, const at::Tensor& packed, int64_t N) {
  check_x(x_in, N, "w4a8_mm");
  const int64_t M = x_in.size(0), K = x_in.size(1), G = K / 32, NT = N / 16;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == NT * G * BLK,
              "w4a8_mm: packed weight does not match N x K");
  at::Tensor xq = at::empty({M, K}, at::kChar), xs = at::empty({M, G}, at::kFloat),
             xsum = at::empty({M, G}, at::kFloat), yf = at::empty({M, N}, at::kFloat);
  quantize_rows(x_in.contiguous(), xq, xs, xsum);
  int8_t* q = xq.data_ptr<int8_t>();
  float *s = xs.data_ptr<float>(), *sm = xsum.data_ptr<float>(), *o = yf.data_ptr<float>();
  const uint8_t* w = packed.data_ptr<uint8_t>();
  over_tiles(NT, M, [&](int64_t t, int64_t m0, auto mb) {
    tile_kernel<decltype(mb)::value>(w + t * G * BLK, G, q + m0 * K, K, s + m0 * G, sm + m0 * G, o + m0 * N + 16 * t, N);
  });
  return x_in.scalar_type() == at::kFloat ? yf : yf.to(x_in.scalar_type());
}

// x [M, K] fp32 or bf16 (K % 32 == 0); packed: uint8 [N / 16 * K / 32 * 512]; scale fp32 [N] per output channel;
// returns [M, N] in x's dtype.
at::Tensor w8a8_mm(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& scale) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.is_contiguous(), "w8a8_mm: fp32 scale [N]");
  const int64_t N = scale.size(0);
  check_x(x_in, N, "w8a8_mm");
  const int64_t M = x_in.size(0), K = x_in.size(1), G = K / 32, NT = N / 16;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == NT * G * BLK8,
              "w8a8_mm: packed weight does not match N x K");
  at::Tensor xq = at::empty({M, K}, at::kChar), xs = at::empty({M, G}, at::kFloat),
             xsum = at::empty({M, G}, at::kFloat), qs = at::empty({M, G}, at::kInt), yf = at::empty({M, N}, at::kFloat);
  quantize_rows(x_in.contiguous(), xq, xs, xsum);
  int8_t* q = xq.data_ptr<int8_t>();
  int32_t* qsum = qs.data_ptr<int32_t>();
  for (int64_t i = 0; i < M * G; ++i) {
    int32_t total = 0;
    for (int k = 0; k < 32; ++k) total += q[32 * i + k];
    qsum[i] = total;
  }
  const float *s = xs.data_ptr<float>(), *sc = scale.data_ptr<float>();
  float* o = yf.data_ptr<float>();
  const uint8_t* w = packed.data_ptr<uint8_t>();
  over_tiles(NT, M, [&](int64_t t, int64_t m0, auto mb) {
    tile_kernel8<decltype(mb)::value>(w + t * G * BLK8, G, q + m0 * K, K, s + m0 * G, qsum + m0 * G, sc + 16 * t,
                                      o + m0 * N + 16 * t, N);
  });
  return x_in.scalar_type() == at::kFloat ? yf : yf.to(x_in.scalar_type());
}
"""

_CPP_DECLS = ("bool cpu_supported();\nat::Tensor w4a8_mm(const at::Tensor& x_in, const at::Tensor& packed, int64_t N);\n"
              "at::Tensor w8a8_mm(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& scale);\n")
# -ffp-contract=off: no fused multiply-adds the source did not write, so every row's arithmetic is the one above
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
_state: dict = {}
NAME = "specdec_w4a8"
FUNCTIONS = ("w4a8_mm", "w8a8_mm", "cpu_supported")


def _extension() -> dict:
    """What specdec.native.build compiles: the source text, the functions bound to Python, the flags."""
    return {"sources": [_CPP_DECLS, CPP_SOURCE], "functions": list(FUNCTIONS), "extra_cflags": list(CFLAGS),
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
        return "the CPU lacks AVX512-VNNI"
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
                    module, reason = None, "the CPU lacks AVX512-VNNI"
            except Exception as exc:  # noqa: BLE001 - a failed build leaves ATen's kernel working
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                module, reason = None, f"its build failed ({first})"
        _state["module"], _state["reason"] = module, reason
        return module


def unavailable_reason() -> str:
    """'' when load() found the kernel, else why not (calls load())."""
    load()
    return _state["reason"]


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
