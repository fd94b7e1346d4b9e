// W4A8 and W8A8: the int4 target's and the int8 draft's matmuls on AVX512-VNNI (specdec/models/w4a8.py says
// why and how: one weight tile unpacked once for every row of a call, int8 dot products on activations
// rounded per row and group of 32, each output accumulated in one fixed order so a row's bits do not
// depend on the rows beside it). Built once per machine by specdec/native/build.py (load_inline: the
// functions below are bound to Python by name, w4a8.FUNCTIONS). The AVX2 path (w4a8_avx2.cpp, namespace
// w4a8_avx2) comes before this text in the same translation unit and gives the same bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <cstdint>
#include <type_traits>
#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

// Which kernels run: the AVX512-VNNI ones below where the CPU (and the OS: __builtin_cpu_supports reads XCR0)
// has them, else w4a8_avx2.cpp's (AVX2 + FMA), which give the same bits. set_isa("avx2") forces the AVX2 path
// (tests compare the two; benchmarks time it); specdec/models/w4a8.py applies SPECDEC_NATIVE_ISA through it at
// load, with the one meaning specdec/native/build.py gives it (this file does not read it).
// ISA_AMX: the AVX512-VNNI kernels, and AMX tiles (Intel's int8 matrix unit) for blocks of AMX_MIN_ROWS rows or
// more; the tiles compute the same exact integer dots and the epilogue is the VNNI kernels', so the bits are the same.
enum MatmulIsa : int { ISA_NONE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AMX = 3 };

#if defined(__x86_64__) || defined(_M_X64)
// AMX-TILE and AMX-INT8 (CPUID.(7,0):EDX bits 24, 25), and Linux's leave to use the tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, what torch.cpu._init_amx asks): without it the first tile
// instruction kills the process.
static bool amx_usable() {
#if defined(__linux__)
  static const bool usable = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  }();
  return usable;
#else
  return false;  // another OS's way to grant the tile data is not written here: the VNNI kernels run
#endif
}
#endif

static int cpu_best() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma"))
    return amx_usable() ? ISA_AMX : ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
#endif
  return ISA_NONE;
}

static const char* isa_name(int isa) {
  return isa == ISA_AMX ? "amx" : isa == ISA_AVX512 ? "avx512" : isa == ISA_AVX2 ? "avx2" : "none";
}
static std::atomic<int> g_isa{-1};

static int current_isa() {
  int isa = g_isa.load();
  if (isa < 0) {
    isa = cpu_best();
    g_isa.store(isa);
  }
  return isa;
}

static bool avx2_path() { return current_isa() == ISA_AVX2; }

bool cpu_supported() { return cpu_best() != ISA_NONE; }
std::string cpu_isa() { return isa_name(cpu_best()); }  // the best this CPU runs: "amx", "avx512", "avx2" or "none"
std::string isa() { return isa_name(current_isa()); }   // the one the matmuls run on now

void set_isa(const std::string& name) {
  const int want = name == "amx" ? ISA_AMX : name == "avx512" ? ISA_AVX512 : name == "avx2" ? ISA_AVX2 : ISA_NONE;
  TORCH_CHECK(want != ISA_NONE, "w4a8.set_isa: expected 'avx2', 'avx512' or 'amx', got '", name, "'");
  TORCH_CHECK(want <= cpu_best(), "w4a8.set_isa: this CPU does not support ", name, " (best: ",
              isa_name(cpu_best()), ")");
  g_isa.store(want);
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
// Blocks of 8 rows: off[m * G + g] = -128 * sum(x) (once per call) starts one of the two vpdpbusd chains, so the
// chains end on dot(q, x) itself, the same exact integer as dot(q + 128, x) - 128 * sum(x), without a subtraction
// and a broadcast from a general register per row and group (1.0-1.13x at 8-64 rows, docs/benchmarks.md). Fewer
// rows subtract 128 * qsum[m * G + g] at the end, as before: there the chains' extra load latency was not a gain.
template <int MB>
static void tile_kernel8(const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                         const int32_t* qsum, const int32_t* off, const float* scale, float* out, int64_t ldo) {
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b = w + g * BLK8;
    for (int c = 0; c < BLK8; c += 64) _mm_prefetch((const char*)(b + 4 * BLK8 + c), _MM_HINT_T0);
    __m512i r[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm512_loadu_si512((const void*)(b + 64 * j));
    for (int m = 0; m < MB; ++m) {
      const int32_t* xp = (const int32_t*)(xq + m * K + 32 * g);
      __m512i i0 = MB == 8 ? _mm512_set1_epi32(off[m * G + g]) : _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        i0 = _mm512_dpbusd_epi32(i0, r[j], _mm512_set1_epi32(xp[j]));
        i1 = _mm512_dpbusd_epi32(i1, r[j + 1], _mm512_set1_epi32(xp[j + 1]));
      }
      __m512i dot = _mm512_add_epi32(i0, i1);
      if (MB != 8) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * qsum[m * G + g]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs[m * G + g]), acc[m]);
    }
  }
  __m512 sc = _mm512_loadu_ps(scale);
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(out + m * ldo, _mm512_mul_ps(acc[m], sc));
}

// RMSNorm of one row (d % 16 == 0) with the arithmetic of specdec/native/csrc/kernels_impl.h's rms_norm_row on
// AVX512, bit for bit (tests/native/test_native_fused_norm.py checks it against ops.add_rms_norm): sum of squares
// in 16 lanes, one fma per chunk in order; lanes i + i+8, i + i+4, i + i+2, 0 + 1; mean = sum / d,
// inv = 1 / sqrt(mean + eps), out = weight * (x * inv).
static void rms_norm_row(const float* x, const float* weight, float* out, int64_t d, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    __m512 a = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(a, a, acc);
  }
  __m256 f = _mm256_add_ps(_mm512_castps512_ps256(acc),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  float mean = _mm_cvtss_f32(t) / static_cast<float>(d);
  __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(mean + eps));
  for (int64_t i = 0; i < d; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(weight + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), inv)));
}

static void add_row(const float* x, float* residual, int64_t d) {
  for (int64_t i = 0; i < d; i += 16)
    _mm512_storeu_ps(residual + i, _mm512_add_ps(_mm512_loadu_ps(residual + i), _mm512_loadu_ps(x + i)));
}

#pragma GCC pop_options

// ---- AMX ---------------------------------------------------------------------------------------------------
// One 16-column tile for mb (AMX_MIN_ROWS..16) rows, group by group: C (tmm0, mb x 16 int32) = A (tmm1, the
// rows' 32 int8 activation codes of the group) . B (tmm2, 8 x 64 bytes: row j = 4 unsigned codes of each of the
// 16 columns for k = 4j..4j+3, the packed block's R[j] as it is) by TDPBSUD (signed x unsigned bytes): per row
// and column the exact integer dot of group_dot. The fp32 epilogue is tile_kernel's / tile_kernel8's, operation
// for operation, so every output has their bits.
static constexpr int AMX_MIN_ROWS = 12;  // below, VNNI is as fast or faster (docs/benchmarks.md, *The AMX path*)
static constexpr int AMX_ROWS = 16;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma,amx-tile,amx-int8")

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// The tile shapes for mb rows, loaded on the calling thread (a thread's tiles are its own).
static void amx_config(int mb) {
  TileConfig cfg = {};
  cfg.palette_id = 1;
  for (int set = 0; set < 2; ++set) {  // two sets (tmm0-2, tmm3-5): one group's dots run while the last is summed
    cfg.rows[3 * set] = mb, cfg.colsb[3 * set] = 64;          // C: mb x 16 int32
    cfg.rows[3 * set + 1] = mb, cfg.colsb[3 * set + 1] = 32;  // A: mb x 32 int8
    cfg.rows[3 * set + 2] = 8, cfg.colsb[3 * set + 2] = 64;   // B: 8 x (16 columns x 4 bytes)
  }
  _tile_loadconfig(&cfg);
}

static void amx_release() { _tile_release(); }

// C of one group into dots (mb x 16 int32) on tile set SET: A from the rows' codes (stride K), B from b (stride 64).
template <int SET>
static inline void amx_group_dots(const int8_t* xq, int64_t K, const uint8_t* b, int32_t* dots) {
  if constexpr (SET == 0) {
    _tile_zero(0);
    _tile_loadd(1, xq, K);
    _tile_loadd(2, b, 64);
    _tile_dpbsud(0, 1, 2);
    _tile_stored(0, dots, 64);
  } else {
    _tile_zero(3);
    _tile_loadd(4, xq, K);
    _tile_loadd(5, b, 64);
    _tile_dpbsud(3, 4, 5);
    _tile_stored(3, dots, 64);
  }
}

// Every group's dots in order, group g + 1's issued before group g's epilogue(g, dots) so the tile unit and the
// vector units overlap; b_of(g, set) gives group g's B (unpacked into a buffer of that set, or in place).
template <typename B, typename E>
static inline void amx_groups(int64_t G, const int8_t* xq, int64_t K, B&& b_of, E&& epilogue) {
  alignas(64) int32_t dots[2][AMX_ROWS * 16];
  amx_group_dots<0>(xq, K, b_of(0, 0), dots[0]);
  for (int64_t g = 0; g < G; g += 2) {
    if (g + 1 < G) amx_group_dots<1>(xq + 32 * (g + 1), K, b_of(g + 1, 1), dots[1]);
    epilogue(g, dots[0]);
    if (g + 2 < G) amx_group_dots<0>(xq + 32 * (g + 2), K, b_of(g + 2, 0), dots[0]);
    if (g + 1 < G) epilogue(g + 1, dots[1]);
  }
}

static void amx_tile_kernel(int mb, const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                            const float* xsum, float* out, int64_t ldo) {
  __m512 acc[AMX_ROWS], accm[AMX_ROWS];
  for (int m = 0; m < mb; ++m) { acc[m] = _mm512_setzero_ps(); accm[m] = _mm512_setzero_ps(); }
  alignas(64) uint8_t r[2][8 * 64];
  const __m512i lo = _mm512_set1_epi8(0x0F);
  auto unpack = [&](int64_t g, int set) -> const uint8_t* {  // the block's nibbles as 8 x 64 unsigned bytes
    const uint8_t* b = w + g * BLK;
    for (int c = 0; c < BLK; c += 64) _mm_prefetch((const char*)(b + 8 * BLK + c), _MM_HINT_T0);
    for (int p = 0; p < 4; ++p) {
      __m512i v = _mm512_loadu_si512((const void*)(b + 64 * p));
      _mm512_store_si512((void*)(r[set] + 64 * p), _mm512_and_si512(v, lo));
      _mm512_store_si512((void*)(r[set] + 64 * (p + 4)), _mm512_and_si512(_mm512_srli_epi16(v, 4), lo));
    }
    return r[set];
  };
  amx_groups(G, xq, K, unpack, [&](int64_t g, const int32_t* dots) {
    const uint8_t* b = w + g * BLK;
    __m512 sc = bf16x16_to_ps(b + 256);
    __m512 mn = _mm512_fnmadd_ps(_mm512_set1_ps(8.f), sc, bf16x16_to_ps(b + 288));  // zero - 8 scale
    for (int m = 0; m < mb; ++m) {
      __m512i dot = _mm512_load_si512((const void*)(dots + 16 * m));
      __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs[m * G + g]));
      acc[m] = _mm512_fmadd_ps(d, sc, acc[m]);
      accm[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum[m * G + g]), accm[m]);
    }
  });
  for (int m = 0; m < mb; ++m) _mm512_storeu_ps(out + m * ldo, _mm512_add_ps(acc[m], accm[m]));
}

static void amx_tile_kernel8(int mb, const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                             const int32_t* qsum, const float* scale, float* out, int64_t ldo) {
  __m512 acc[AMX_ROWS];
  for (int m = 0; m < mb; ++m) acc[m] = _mm512_setzero_ps();
  auto block = [&](int64_t g, int) -> const uint8_t* {  // the packed block is B as it is
    const uint8_t* b = w + g * BLK8;
    for (int c = 0; c < BLK8; c += 64) _mm_prefetch((const char*)(b + 4 * BLK8 + c), _MM_HINT_T0);
    return b;
  };
  amx_groups(G, xq, K, block, [&](int64_t g, const int32_t* dots) {
    for (int m = 0; m < mb; ++m) {
      __m512i dot = _mm512_sub_epi32(_mm512_load_si512((const void*)(dots + 16 * m)),
                                     _mm512_set1_epi32(128 * qsum[m * G + g]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(xs[m * G + g]), acc[m]);
    }
  });
  __m512 sc = _mm512_loadu_ps(scale);
  for (int m = 0; m < mb; ++m) _mm512_storeu_ps(out + m * ldo, _mm512_mul_ps(acc[m], sc));
}

#pragma GCC pop_options

// The integer sum of each group's 32 codes (W8A8 takes its weights' +128 offset out with it): q [n * 32] -> [n].
static void code_sums(const int8_t* q, int64_t groups, int32_t* qsum) {
  for (int64_t i = 0; i < groups; ++i) {
    int32_t total = 0;
    for (int k = 0; k < 32; ++k) total += q[32 * i + k];
    qsum[i] = total;
  }
}

static void quantize_rows(const at::Tensor& x, at::Tensor& xq, at::Tensor& xs, at::Tensor& xsum) {
  const int64_t M = x.size(0), K = x.size(1), G = K / 32;
  int8_t* q = xq.data_ptr<int8_t>();
  float *s = xs.data_ptr<float>(), *sm = xsum.data_ptr<float>();
  const bool avx2 = avx2_path();
  for (int64_t m = 0; m < M; ++m) {
    if (x.scalar_type() == at::kFloat && avx2)
      w4a8_avx2::quantize_row(x.data_ptr<float>() + m * K, K, q + m * K, s + m * G, sm + m * G);
    else if (x.scalar_type() == at::kFloat)
      quantize_row(x.data_ptr<float>() + m * K, K, q + m * K, s + m * G, sm + m * G);
    else if (avx2)
      w4a8_avx2::quantize_row((const uint16_t*)x.data_ptr<at::BFloat16>() + m * K, K, q + m * K, s + m * G, sm + m * G);
    else
      quantize_row(x.data_ptr<at::BFloat16>() + m * K, K, q + m * K, s + m * G, sm + m * G);
  }
}

static void check_x(const at::Tensor& x, int64_t N, const char* name) {
  TORCH_CHECK(cpu_supported(), name, " needs AVX512-VNNI or AVX2 + FMA");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 32 == 0 && N % 16 == 0, name, ": bad shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name, ": fp32 or bf16 x");
}

// Every (16-column tile, block of rows) of an M x N output: threads split tiles (columns) only, so each output
// element is computed by one thread in one order whatever M is. The VNNI (and AVX2) kernels take blocks of up to 8
// rows, tile(t, m0, MB) with MB a constant. On the AMX path, from AMX_MIN_ROWS rows on, blocks of up to 16 rows go
// through amx_tile(t, m0, mb) and a last block of fewer than AMX_MIN_ROWS through the VNNI kernels; each thread
// loads its tile shapes before its first tile instruction (again when a block's row count differs) and releases
// the tiles when done.
template <typename F, typename A>
static void over_tiles(int64_t NT, int64_t M, F&& tile, A&& amx_tile) {
  const bool amx = current_isa() == ISA_AMX && M >= AMX_MIN_ROWS;
  auto vnni_rows = [&](int64_t t, int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; m += 8)
      by_rows((int)std::min<int64_t>(8, m1 - m), [&](auto mb) { tile(t, m, mb); });
  };
  at::parallel_for(0, NT, 1, [&](int64_t t0, int64_t t1) {
    int configured = 0;
    for (int64_t t = t0; t < t1; ++t) {
      if (!amx) {
        vnni_rows(t, 0, M);
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
        const int mb = (int)std::min<int64_t>(AMX_ROWS, M - m0);
        if (mb < AMX_MIN_ROWS) {
          vnni_rows(t, m0, m0 + mb);
          continue;
        }
        if (configured != mb) amx_config(mb), configured = mb;
        amx_tile(t, m0, mb);
      }
    }
    if (configured) amx_release();
  });
}

static void check_rows(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& sums, at::ScalarType sums_type,
                       int64_t N, const char* name) {
  TORCH_CHECK(cpu_supported(), name, " needs AVX512-VNNI or AVX2 + FMA");
  TORCH_CHECK(xq.dim() == 2 && xq.scalar_type() == at::kChar && xq.is_contiguous() && xq.size(1) % 32 == 0 &&
              N % 16 == 0, name, ": int8 codes [M, K] with K % 32 == 0, N % 16 == 0");
  const int64_t M = xq.size(0), G = xq.size(1) / 32;
  for (const at::Tensor* t : {&xs, &sums})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == M && t->size(1) == G && t->is_contiguous(), name,
                ": scales and sums [M, K / 32] beside the codes");
  TORCH_CHECK(xs.scalar_type() == at::kFloat && sums.scalar_type() == sums_type, name, ": scale/sum dtypes");
}

// Activations already rounded (quantize_rows or add_rms_norm_q8): xq int8 [M, K], xs/xsum fp32 [M, K / 32];
// packed: uint8 [N / 16 * K / 32 * 320] -> fp32 [M, N].
at::Tensor w4a8_mm_q(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& xsum, const at::Tensor& packed,
                     int64_t N) {
  check_rows(xq, xs, xsum, at::kFloat, N, "w4a8_mm_q");
  const int64_t M = xq.size(0), K = xq.size(1), G = K / 32, NT = N / 16;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == NT * G * BLK,
              "w4a8_mm: packed weight does not match N x K");
  at::Tensor yf = at::empty({M, N}, at::kFloat);
  const int8_t* q = xq.data_ptr<int8_t>();
  const float *s = xs.data_ptr<float>(), *sm = xsum.data_ptr<float>();
  float* o = yf.data_ptr<float>();
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const bool avx2 = avx2_path();
  auto tile = [&](int64_t t, int64_t m0, auto mb) {
    if (avx2)
      w4a8_avx2::w4a8_tile(mb, w + t * G * BLK, G, q + m0 * K, K, s + m0 * G, sm + m0 * G, o + m0 * N + 16 * t, N);
    else
      tile_kernel<decltype(mb)::value>(w + t * G * BLK, G, q + m0 * K, K, s + m0 * G, sm + m0 * G, o + m0 * N + 16 * t, N);
  };
  over_tiles(NT, M, tile, [&](int64_t t, int64_t m0, int mb) {
    amx_tile_kernel(mb, w + t * G * BLK, G, q + m0 * K, K, s + m0 * G, sm + m0 * G, o + m0 * N + 16 * t, N);
  });
  return yf;
}

// x [M, K] fp32 or bf16 (K % 32 == 0); packed: uint8 [N / 16 * K / 32 * 320]; returns [M, N] in x's dtype.
at::Tensor w4a8_mm(const at::Tensor& x_in, const at::Tensor& packed, int64_t N) {
  check_x(x_in, N, "w4a8_mm");
  const int64_t M = x_in.size(0), K = x_in.size(1), G = K / 32;
  at::Tensor xq = at::empty({M, K}, at::kChar), xs = at::empty({M, G}, at::kFloat),
             xsum = at::empty({M, G}, at::kFloat);
  quantize_rows(x_in.contiguous(), xq, xs, xsum);
  at::Tensor yf = w4a8_mm_q(xq, xs, xsum, packed, N);
  return x_in.scalar_type() == at::kFloat ? yf : yf.to(x_in.scalar_type());
}

// Activations already rounded: xq int8 [M, K], xs fp32 [M, K / 32], qsum int32 [M, K / 32] (code_sums);
// packed: uint8 [N / 16 * K / 32 * 512]; scale fp32 [N] per output channel -> fp32 [M, N].
at::Tensor w8a8_mm_q(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& qs, const at::Tensor& packed,
                     const at::Tensor& scale) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.is_contiguous(), "w8a8_mm: fp32 scale [N]");
  const int64_t N = scale.size(0);
  check_rows(xq, xs, qs, at::kInt, N, "w8a8_mm_q");
  const int64_t M = xq.size(0), K = xq.size(1), G = K / 32, NT = N / 16;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == NT * G * BLK8,
              "w8a8_mm: packed weight does not match N x K");
  at::Tensor yf = at::empty({M, N}, at::kFloat);
  const int8_t* q = xq.data_ptr<int8_t>();
  const int32_t* qsum = qs.data_ptr<int32_t>();
  const float *s = xs.data_ptr<float>(), *sc = scale.data_ptr<float>();
  float* o = yf.data_ptr<float>();
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const bool avx2 = avx2_path();
  std::vector<int32_t> offsets;  // tile_kernel8's chain starts: -128 * qsum, exact in int32 (|qsum| <= 32 * 128)
  if (!avx2 && M >= 8) {
    offsets.resize(M * G);
    for (int64_t i = 0; i < M * G; ++i) offsets[i] = -128 * qsum[i];
  }
  const int32_t* off = offsets.data();
  auto tile = [&](int64_t t, int64_t m0, auto mb) {
    if (avx2)
      w4a8_avx2::w8a8_tile(mb, w + t * G * BLK8, G, q + m0 * K, K, s + m0 * G, qsum + m0 * G, sc + 16 * t,
                           o + m0 * N + 16 * t, N);
    else
      tile_kernel8<decltype(mb)::value>(w + t * G * BLK8, G, q + m0 * K, K, s + m0 * G, qsum + m0 * G, off + m0 * G,
                                        sc + 16 * t,
                                        o + m0 * N + 16 * t, N);
  };
  over_tiles(NT, M, tile, [&](int64_t t, int64_t m0, int mb) {
    amx_tile_kernel8(mb, w + t * G * BLK8, G, q + m0 * K, K, s + m0 * G, qsum + m0 * G, sc + 16 * t,
                     o + m0 * N + 16 * t, N);
  });
  return yf;
}

// x [M, K] fp32 or bf16 (K % 32 == 0); packed: uint8 [N / 16 * K / 32 * 512]; scale fp32 [N] per output channel;
// returns [M, N] in x's dtype.
at::Tensor w8a8_mm(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& scale) {
  TORCH_CHECK(scale.dim() == 1, "w8a8_mm: fp32 scale [N]");  // the rest checked by w8a8_mm_q
  check_x(x_in, scale.size(0), "w8a8_mm");
  const int64_t M = x_in.size(0), K = x_in.size(1), G = K / 32;
  at::Tensor xq = at::empty({M, K}, at::kChar), xs = at::empty({M, G}, at::kFloat),
             xsum = at::empty({M, G}, at::kFloat), qs = at::empty({M, G}, at::kInt);
  quantize_rows(x_in.contiguous(), xq, xs, xsum);
  code_sums(xq.data_ptr<int8_t>(), M * G, qs.data_ptr<int32_t>());
  at::Tensor yf = w8a8_mm_q(xq, xs, qs, packed, scale);
  return x_in.scalar_type() == at::kFloat ? yf : yf.to(x_in.scalar_type());
}

// The residual add (when x is given: residual += x, in place), RMSNorm and the activations' rounding in one pass
// per row, the normalized row never leaving a row buffer: residual fp32 [M, K] (K % 32 == 0), weight fp32 [K] ->
// (codes int8 [M, K], scales fp32 [M, K / 32], sums fp32 [M, K / 32], code sums int32 [M, K / 32]), bit for bit
// what quantizing ops.add_rms_norm's output gives, for w4a8_mm_q and w8a8_mm_q alike. The norm runs in IEEE's
// default FP mode as ops.cpp's does; the rounding in the caller's, as w4a8_mm's does. Every path: the AVX2 one
// (w4a8_avx2.cpp's add_row, rms_norm_row and quantize_row) gives the AVX512 one's bits, the AMX path is this one.
std::vector<at::Tensor> add_rms_norm_q8(const c10::optional<at::Tensor>& x_in, at::Tensor residual,
                                        const at::Tensor& weight_in, double eps) {
  TORCH_CHECK(cpu_supported(), "add_rms_norm_q8 needs AVX512-VNNI or AVX2 + FMA");
  TORCH_CHECK(residual.dim() == 2 && residual.scalar_type() == at::kFloat && residual.is_contiguous() &&
              residual.size(1) % 32 == 0, "add_rms_norm_q8: residual fp32 [M, K], contiguous, K % 32 == 0");
  const int64_t M = residual.size(0), K = residual.size(1), G = K / 32;
  TORCH_CHECK(weight_in.dim() == 1 && weight_in.size(0) == K && weight_in.scalar_type() == at::kFloat,
              "add_rms_norm_q8: weight fp32 [K]");
  at::Tensor x;
  if (x_in.has_value()) {
    x = x_in->contiguous();
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.sizes() == residual.sizes(), "add_rms_norm_q8: x as residual");
  }
  at::Tensor weight = weight_in.contiguous();
  at::Tensor xq = at::empty({M, K}, at::kChar), xs = at::empty({M, G}, at::kFloat),
             xsum = at::empty({M, G}, at::kFloat), qs = at::empty({M, G}, at::kInt);
  const float* xp = x.defined() ? x.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  int8_t* q = xq.data_ptr<int8_t>();
  float *s = xs.data_ptr<float>(), *sm = xsum.data_ptr<float>();
  int32_t* qsum = qs.data_ptr<int32_t>();
  const bool avx2 = avx2_path();
  at::parallel_for(0, M, std::max<int64_t>(1, (1 << 15) / K), [&](int64_t m0, int64_t m1) {
    std::vector<float> row(K);
    for (int64_t m = m0; m < m1; ++m) {
      const unsigned int caller = _mm_getcsr();
      _mm_setcsr(0x1F80);
      if (xp) avx2 ? w4a8_avx2::add_row(xp + m * K, rp + m * K, K) : add_row(xp + m * K, rp + m * K, K);
      if (avx2)
        w4a8_avx2::rms_norm_row(rp + m * K, wp, row.data(), K, static_cast<float>(eps));
      else
        rms_norm_row(rp + m * K, wp, row.data(), K, static_cast<float>(eps));
      _mm_setcsr(caller);
      if (avx2)
        w4a8_avx2::quantize_row(row.data(), K, q + m * K, s + m * G, sm + m * G);
      else
        quantize_row(row.data(), K, q + m * K, s + m * G, sm + m * G);
      code_sums(q + m * K, G, qsum + m * G);
    }
  });
  return {xq, xs, xsum, qs};
}
