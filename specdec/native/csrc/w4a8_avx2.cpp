// W4A8 and W8A8 on AVX2 + FMA (no VNNI, no AVX512): the same packed weights as w4a8.cpp's AVX512-VNNI kernels
// and the same bits for every output, so a row's result does not depend on which CPU computed it; and the fused
// norm's row (add_rms_norm_q8: add_row, rms_norm_row, then quantize_row), the same bits as its AVX512 path.
//
// specdec/models/w4a8.py puts this text before w4a8.cpp's in one translation unit (load_inline); w4a8.cpp
// picks these functions at run time where the CPU lacks AVX512-VNNI or SPECDEC_NATIVE_ISA=avx2.
// No torch header here: bf16 arrives as uint16_t.
//
// Why the bits are the same:
// - quantize_row: the AVX512 kernel's 16 lanes are two 8-lane halves here; the group's sum and amax follow
//   GCC's _mm512_reduce_add_ps / _mm512_reduce_max_ps tree step by step (256-bit halves hi op lo, 128-bit
//   halves hi op lo, lanes {0,1} op {2,3}, then [0] op [1]); the multiply and the round-half-to-even
//   conversion are lane-wise and the int8 narrowing saturates the same way.
// - the integer dots are exact on both paths, so equal: vpmaddubsw multiplies unsigned 4-bit codes by
//   int8 activations in [-128, 127] into int16 pairs (|pair| <= 2 * 15 * 128 = 3840, no saturation), eight
//   of them summed in int16 (<= 30720, no wrap), then vpmaddwd by ones into int32. W8A8's codes are stored
//   as q + 128 in 0..255, where one vpmaddubsw could saturate: each byte is split into its two nibbles,
//   u = 16 hi + lo, the dots of both taken as above and joined in int32 (16 dot(hi, x) + dot(lo, x)), and
//   w4a8.cpp's own term - 128 * sum(x) gives dot(q, x) exactly.
// - the fp32 epilogue is the AVX512 kernel's, lane by lane and in its order (cvt, mul, fmadd into acc; fnmadd
//   for zero - 8 scale; fmadd into accm; acc + accm at the end; W8A8: fmadd per group, times the channel
//   scale at the end). A 16-column tile is two 8-lane halves; how many rows share a pass changes no
//   element's arithmetic.
#include <immintrin.h>
#include <cstdint>
#include <type_traits>

namespace w4a8_avx2 {

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

static constexpr int BLK = 320;   // one W4A8 (tile, group) block: 4 x 64 nibble-pair bytes, 16 bf16 scales, 16 zeros
static constexpr int BLK8 = 512;  // one W8A8 (tile, group) block: 8 x 64 bytes code + 128
static constexpr int ROWS = 3;    // rows per pass over a tile half: their accumulators stay in the 16 registers

static inline __m256 bf16x8_to_ps(const void* p) {
  __m128i h = _mm_loadu_si128((const __m128i*)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline void load16(const float* p, __m256& lo, __m256& hi) {
  lo = _mm256_loadu_ps(p);
  hi = _mm256_loadu_ps(p + 8);
}
static inline void load16(const uint16_t* p, __m256& lo, __m256& hi) {
  lo = bf16x8_to_ps(p);
  hi = bf16x8_to_ps(p + 8);
}

// GCC's _mm512_reduce_add_ps of the 16 lanes (lo = lanes 0..7, hi = 8..15), operation by operation.
static inline float reduce_add16(__m256 lo, __m256 hi) {
  __m256 t3 = _mm256_add_ps(hi, lo);
  __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));  // {2, 3, 0, 1}
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1)));
}

// GCC's _mm512_reduce_max_ps, operation by operation (operand order kept: max is not symmetric for NaN).
static inline float reduce_max16(__m256 lo, __m256 hi) {
  __m256 t3 = _mm256_max_ps(hi, lo);
  __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));  // {2, 3, 0, 1}
  __m128 t10 = _mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1)));  // {1, 0, 1, 0}
  return _mm_cvtss_f32(t10);
}

// a + b in int16 lanes, in this order: the empty asm keeps the compiler from reassociating a row's chain of adds
// into a tree over all its products, which would need a register for each (and spill them to the stack).
static inline __m256i add16(__m256i a, __m256i b) {
  __m256i sum = _mm256_add_epi16(a, b);
  __asm__("" : "+x"(sum));
  return sum;
}

// 32 int32 (a0: 0..7, a1: 8..15, b0: 16..23, b1: 24..31) -> 32 int8 in order, saturating as vpmovsdb does.
static inline void store_q32(int8_t* q, __m256i a0, __m256i a1, __m256i b0, __m256i b1) {
  // packs work within 128-bit lanes: the bytes come out as dwords of elements 0-3, 8-11, 16-19, 24-27 | 4-7, ...
  __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(b0, b1));
  bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i*)q, bytes);
}

// One row: int8 codes q[K], per-group scale xs[G] (amax / 127) and exact fp32 sums xsum[G], as w4a8.cpp's.
template <typename T>
static void quantize_row_impl(const T* x, int64_t K, int8_t* q, float* xs, float* xsum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t g = 0; g < K / 32; ++g) {
    __m256 a0, a1, b0, b1;  // a = lanes 0..15 of the group, b = lanes 16..31, as the AVX512 kernel's a and b
    load16(x + 32 * g, a0, a1);
    load16(x + 32 * g + 16, b0, b1);
    xsum[g] = reduce_add16(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1));
    float amax = reduce_max16(_mm256_max_ps(_mm256_and_ps(a0, abs_mask), _mm256_and_ps(b0, abs_mask)),
                              _mm256_max_ps(_mm256_and_ps(a1, abs_mask), _mm256_and_ps(b1, abs_mask)));
    __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    xs[g] = amax / 127.f;
    store_q32(q + 32 * g, _mm256_cvtps_epi32(_mm256_mul_ps(a0, inv)), _mm256_cvtps_epi32(_mm256_mul_ps(a1, inv)),
              _mm256_cvtps_epi32(_mm256_mul_ps(b0, inv)), _mm256_cvtps_epi32(_mm256_mul_ps(b1, inv)));
  }
}

void quantize_row(const float* x, int64_t K, int8_t* q, float* xs, float* xsum) {
  quantize_row_impl(x, K, q, xs, xsum);
}
void quantize_row(const uint16_t* x, int64_t K, int8_t* q, float* xs, float* xsum) {
  quantize_row_impl(x, K, q, xs, xsum);
}

// MB rows x H halves of one W4A8 tile over all G groups, from half h0 on (half 0: columns 0..7, half 1: 8..15):
// w4a8.cpp's tile_kernel. Several rows take one half at a time (H = 1, twice), so that their accumulators stay in
// registers (the second pass reads the tile from the cache); a single row takes both halves in one pass (H = 2).
// Within a block, P[p] (64 bytes) holds R[p] in its low nibbles and R[p + 4] in its high ones; R[j]'s dword c is
// column c's codes for k = 4 j .. 4 j + 3, so half h is bytes 32 h .. 32 h + 31 of each P[p], and its scales and
// zeros the 8 bf16 from byte 16 h on.
template <int MB, int H>
static void tile_kernel(const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                        const float* xsum, float* out, int64_t ldo, int h0) {
  __m256 acc[H][MB], accm[H][MB];
  for (int h = 0; h < H; ++h)
    for (int m = 0; m < MB; ++m) acc[h][m] = accm[h][m] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b = w + g * BLK;
    for (int c = 0; c < BLK; c += 64) _mm_prefetch((const char*)(b + 8 * BLK + c), _MM_HINT_T0);
    for (int h = 0; h < H; ++h) {
      const int half = h0 + h;
      __m256i s[MB];  // int16 pairs: at most 8 x 3840 in magnitude
      for (int m = 0; m < MB; ++m) s[m] = _mm256_setzero_si256();
      for (int p = 0; p < 4; ++p) {
        __m256i v = _mm256_loadu_si256((const __m256i*)(b + 64 * p + 32 * half));
        __m256i r0 = _mm256_and_si256(v, low), r1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int m = 0; m < MB; ++m) {
          const int32_t* xp = (const int32_t*)(xq + m * K + 32 * g);
          s[m] = add16(s[m], _mm256_maddubs_epi16(r0, _mm256_set1_epi32(xp[p])));
          s[m] = add16(s[m], _mm256_maddubs_epi16(r1, _mm256_set1_epi32(xp[p + 4])));
        }
      }
      __m256 sc = bf16x8_to_ps(b + 256 + 16 * half);
      __m256 mn = _mm256_fnmadd_ps(_mm256_set1_ps(8.f), sc, bf16x8_to_ps(b + 288 + 16 * half));  // zero - 8 scale
      for (int m = 0; m < MB; ++m) {
        __m256i dot = _mm256_madd_epi16(s[m], ones);
        __m256 d = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(xs[m * G + g]));
        acc[h][m] = _mm256_fmadd_ps(d, sc, acc[h][m]);
        accm[h][m] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xsum[m * G + g]), accm[h][m]);
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int m = 0; m < MB; ++m)
      _mm256_storeu_ps(out + m * ldo + 8 * (h0 + h), _mm256_add_ps(acc[h][m], accm[h][m]));
}

// MB rows x H halves of one W8A8 tile from half h0 on (w4a8.cpp's tile_kernel8; halves as tile_kernel's):
// R[j] byte i = code[col i / 4][k = 4 j + i % 4] + 128, and dot(q + 128, x) - 128 * qsum = dot(q, x) per group, as
// the AVX512 kernel has it, exactly.
template <int MB, int H>
static void tile_kernel8(const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
                         const int32_t* qsum, const float* scale, float* out, int64_t ldo, int h0) {
  __m256 acc[H][MB];
  for (int h = 0; h < H; ++h)
    for (int m = 0; m < MB; ++m) acc[h][m] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* b = w + g * BLK8;
    for (int c = 0; c < BLK8; c += 64) _mm_prefetch((const char*)(b + 4 * BLK8 + c), _MM_HINT_T0);
    for (int h = 0; h < H; ++h) {
      __m256i slo[MB], shi[MB];  // int16 pairs of the low and the high nibbles' dots
      for (int m = 0; m < MB; ++m) slo[m] = shi[m] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        __m256i v = _mm256_loadu_si256((const __m256i*)(b + 64 * j + 32 * (h0 + h)));
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int m = 0; m < MB; ++m) {
          __m256i x = _mm256_set1_epi32(((const int32_t*)(xq + m * K + 32 * g))[j]);
          slo[m] = add16(slo[m], _mm256_maddubs_epi16(lo, x));
          shi[m] = add16(shi[m], _mm256_maddubs_epi16(hi, x));
        }
      }
      for (int m = 0; m < MB; ++m) {
        __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(shi[m], sixteen), _mm256_madd_epi16(slo[m], ones));
        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(128 * qsum[m * G + g]));
        acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(xs[m * G + g]), acc[h][m]);
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    __m256 sc = _mm256_loadu_ps(scale + 8 * (h0 + h));
    for (int m = 0; m < MB; ++m) _mm256_storeu_ps(out + m * ldo + 8 * (h0 + h), _mm256_mul_ps(acc[h][m], sc));
  }
}

// The fused norm's row (w4a8.cpp's add_rms_norm_q8): w4a8.cpp's rms_norm_row on 16 lanes as two 8-lane halves,
// bit for bit, and so kernels_impl.h's on either path: the sum of squares one fma per 16-lane chunk in order (each
// half its own lanes), lanes i + i+8 (lo + hi), then i + i+4, i + i+2, 0 + 1; mean = sum / d,
// inv = 1 / sqrt(mean + eps), out = weight * (x * inv). d % 16 == 0.
void rms_norm_row(const float* x, const float* weight, float* out, int64_t d, float eps) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  __m256 f = _mm256_add_ps(lo, hi);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  float mean = _mm_cvtss_f32(t) / static_cast<float>(d);
  __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(mean + eps));
  for (int64_t i = 0; i < d; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), inv)));
}

// residual += x, lane by lane (d % 16 == 0): w4a8.cpp's add_row.
void add_row(const float* x, float* residual, int64_t d) {
  for (int64_t i = 0; i < d; i += 8)
    _mm256_storeu_ps(residual + i, _mm256_add_ps(_mm256_loadu_ps(residual + i), _mm256_loadu_ps(x + i)));
}

// Calls f(m0, std::integral_constant<int, MB>) for mb rows in passes of ROWS from row m0 (the last one shorter).
template <typename F>
static void by_rows(int mb, F&& f) {
  static_assert(ROWS == 3, "the cases below");
  for (int m0 = 0; m0 < mb; m0 += ROWS) {
    switch (mb - m0 < ROWS ? mb - m0 : ROWS) {
      case 1: f(m0, std::integral_constant<int, 1>{}); break;
      case 2: f(m0, std::integral_constant<int, 2>{}); break;
      default: f(m0, std::integral_constant<int, 3>{}); break;
    }
  }
}

// One W4A8 tile for mb rows (any count): w4a8.cpp's tile_kernel<mb>'s arguments and bits.
void w4a8_tile(int mb, const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
               const float* xsum, float* out, int64_t ldo) {
  by_rows(mb, [&](int m0, auto rows) {
    constexpr int MB = decltype(rows)::value;
    if (MB == 1)
      tile_kernel<1, 2>(w, G, xq + m0 * K, K, xs + m0 * G, xsum + m0 * G, out + m0 * ldo, ldo, 0);
    else
      for (int h = 0; h < 2; ++h)
        tile_kernel<MB, 1>(w, G, xq + m0 * K, K, xs + m0 * G, xsum + m0 * G, out + m0 * ldo, ldo, h);
  });
}

// One W8A8 tile for mb rows: w4a8.cpp's tile_kernel8<mb>'s arguments and bits.
void w8a8_tile(int mb, const uint8_t* w, int64_t G, const int8_t* xq, int64_t K, const float* xs,
               const int32_t* qsum, const float* scale, float* out, int64_t ldo) {
  by_rows(mb, [&](int m0, auto rows) {
    constexpr int MB = decltype(rows)::value;
    if (MB == 1)
      tile_kernel8<1, 2>(w, G, xq + m0 * K, K, xs + m0 * G, qsum + m0 * G, scale, out + m0 * ldo, ldo, 0);
    else
      for (int h = 0; h < 2; ++h)
        tile_kernel8<MB, 1>(w, G, xq + m0 * K, K, xs + m0 * G, qsum + m0 * G, scale, out + m0 * ldo, ldo, h);
  });
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

}  // namespace w4a8_avx2
