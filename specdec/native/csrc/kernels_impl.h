// The kernels' one implementation, included by kernels_avx2.cpp and kernels_avx512.cpp after each has
// chosen its target and namespace (SPECDEC_NATIVE_NS) and, for AVX512, defined SPECDEC_NATIVE_AVX512.
// Only the V16 type below differs between the two: every operation on it is lane-wise and IEEE
// correctly rounded (add, mul, fma, div, max, min, round-to-nearest, integer shifts), and every
// reduction goes through one fixed tree (fold8 + hsum8, or reduce16 doing the same for 16 vectors at
// once, with the same lanes meeting in the same order), so both paths produce the same bits.
// Compiled with -ffp-contract=off: no fused multiply-add that the source does not write.

namespace specdec_native {
namespace SPECDEC_NATIVE_NS {

#ifdef SPECDEC_NATIVE_AVX512
struct V16 {
  __m512 v;
};
static inline V16 zero() { return {_mm512_setzero_ps()}; }
static inline V16 set1(float a) { return {_mm512_set1_ps(a)}; }
static inline V16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline V16 load_bf16(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
static inline void store(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
static inline V16 add(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline V16 sub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline V16 mul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline V16 div(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
static inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
static inline V16 max(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
static inline V16 min(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
static inline V16 round_nearest(V16 a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
// every lane = lane i of a (0 <= i < 16)
static inline V16 lane(V16 a, int i) { return {_mm512_permutexvar_ps(_mm512_set1_epi32(i), a.v)}; }
// 2^n for integral n in [-126, 127] given as floats.
static inline V16 pow2(V16 n) {
  __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
// lanes i + i+8: the first step of the fixed 16-lane tree
static inline __m256 fold8(V16 a) {
  __m256 lo = _mm512_castps512_ps256(a.v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  return _mm256_add_ps(lo, hi);
}
static inline __m256 fold8_max(V16 a) {
  __m256 lo = _mm512_castps512_ps256(a.v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  return _mm256_max_ps(lo, hi);
}
// The fixed tree's four steps on two vectors a, b at once (see reduce16). With A0..A3, B0..B3 their 4-lane
// blocks and Aj0..Aj3 the lanes of block j, each step is Op(lower lanes, higher lanes), as in fold8 and hsum8:
//   pairs8: Op([A0 A1 B0 B1], [A2 A3 B2 B3])
//   pairs4: Op([A0 A2 B0 B2], [A1 A3 B1 B3])
//   pairs2: in each block j, Op([Aj0 Aj1 Bj0 Bj1], [Aj2 Aj3 Bj2 Bj3])
//   pairs1: in each block j, Op([Aj0 Aj2 Bj0 Bj2], [Aj1 Aj3 Bj1 Bj3])
template <class Op>
static inline V16 pairs8(V16 a, V16 b) {
  return Op::f({_mm512_shuffle_f32x4(a.v, b.v, 0x44)}, {_mm512_shuffle_f32x4(a.v, b.v, 0xEE)});
}
template <class Op>
static inline V16 pairs4(V16 a, V16 b) {
  return Op::f({_mm512_shuffle_f32x4(a.v, b.v, 0x88)}, {_mm512_shuffle_f32x4(a.v, b.v, 0xDD)});
}
template <class Op>
static inline V16 pairs2(V16 a, V16 b) {
  const __m512d x = _mm512_castps_pd(a.v), y = _mm512_castps_pd(b.v);
  return Op::f({_mm512_castpd_ps(_mm512_unpacklo_pd(x, y))}, {_mm512_castpd_ps(_mm512_unpackhi_pd(x, y))});
}
template <class Op>
static inline V16 pairs1(V16 a, V16 b) {
  return Op::f({_mm512_shuffle_ps(a.v, b.v, _MM_SHUFFLE(2, 0, 2, 0))},
               {_mm512_shuffle_ps(a.v, b.v, _MM_SHUFFLE(3, 1, 3, 1))});
}
#else
struct V16 {
  __m256 lo, hi;
};
static inline V16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline V16 set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline V16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline __m256 bf16x8(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline V16 load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
static inline void store(float* p, V16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
static inline V16 add(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline V16 sub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline V16 mul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline V16 div(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
static inline V16 fma(V16 a, V16 b, V16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline V16 max(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
static inline V16 min(V16 a, V16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
static inline V16 round_nearest(V16 a) {
  const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
static inline __m256 pow2x8(__m256 n) {
  __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
static inline V16 pow2(V16 n) { return {pow2x8(n.lo), pow2x8(n.hi)}; }
static inline V16 lane(V16 a, int i) {
  const __m256 x = _mm256_permutevar8x32_ps(i < 8 ? a.lo : a.hi, _mm256_set1_epi32(i & 7));
  return {x, x};
}
static inline __m256 fold8(V16 a) { return _mm256_add_ps(a.lo, a.hi); }
static inline __m256 fold8_max(V16 a) { return _mm256_max_ps(a.lo, a.hi); }
// pairs8 .. pairs1: the same lanes as the AVX512 ones above (lo holds blocks 0, 1; hi blocks 2, 3)
template <class Op>
static inline V16 pairs8(V16 a, V16 b) {
  return Op::f({a.lo, b.lo}, {a.hi, b.hi});
}
template <class Op>
static inline V16 pairs4(V16 a, V16 b) {
  return Op::f({_mm256_permute2f128_ps(a.lo, a.hi, 0x20), _mm256_permute2f128_ps(b.lo, b.hi, 0x20)},
               {_mm256_permute2f128_ps(a.lo, a.hi, 0x31), _mm256_permute2f128_ps(b.lo, b.hi, 0x31)});
}
static inline __m256 unpack_lo64(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)));
}
static inline __m256 unpack_hi64(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)));
}
template <class Op>
static inline V16 pairs2(V16 a, V16 b) {
  return Op::f({unpack_lo64(a.lo, b.lo), unpack_lo64(a.hi, b.hi)}, {unpack_hi64(a.lo, b.lo), unpack_hi64(a.hi, b.hi)});
}
template <class Op>
static inline V16 pairs1(V16 a, V16 b) {
  constexpr int even = _MM_SHUFFLE(2, 0, 2, 0), odd = _MM_SHUFFLE(3, 1, 3, 1);
  return Op::f({_mm256_shuffle_ps(a.lo, b.lo, even), _mm256_shuffle_ps(a.hi, b.hi, even)},
               {_mm256_shuffle_ps(a.lo, b.lo, odd), _mm256_shuffle_ps(a.hi, b.hi, odd)});
}
#endif

// The rest of the fixed tree, shared by both paths: (i + i+4), then (i + i+2), then (0 + 1).
static inline float hsum8(__m256 x) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(t);
}
static inline float hmax8(__m256 x) {
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  t = _mm_max_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(t);
}
static inline float hsum(V16 a) { return hsum8(fold8(a)); }
static inline float hmax(V16 a) { return hmax8(fold8_max(a)); }

// Sixteen reductions at once: lane k of reduce16<Add>(d) is hsum(d[k]), of reduce16<Max>(d) hmax(d[k]), bit for
// bit. Each step pairs two vectors so that one Op does that step of the tree for both (the same two lanes meet,
// in the same order, as in hsum); vector k starts in slot 4 (k % 4) + k / 4 (a 4x4 transpose), which the four
// steps undo, so the results come out in order.
struct Add {
  static V16 f(V16 a, V16 b) { return add(a, b); }
};
struct Max {
  static V16 f(V16 a, V16 b) { return max(a, b); }
};
template <class Op>
static inline V16 reduce16(const V16* d) {
  const V16 s8[8] = {pairs8<Op>(d[0], d[4]), pairs8<Op>(d[8], d[12]), pairs8<Op>(d[1], d[5]),
                     pairs8<Op>(d[9], d[13]), pairs8<Op>(d[2], d[6]), pairs8<Op>(d[10], d[14]),
                     pairs8<Op>(d[3], d[7]), pairs8<Op>(d[11], d[15])};
  const V16 s4[4] = {pairs4<Op>(s8[0], s8[1]), pairs4<Op>(s8[2], s8[3]), pairs4<Op>(s8[4], s8[5]),
                     pairs4<Op>(s8[6], s8[7])};
  return pairs1<Op>(pairs2<Op>(s4[0], s4[1]), pairs2<Op>(s4[2], s4[3]));
}

// exp(x): Cephes' expf polynomial with a Cody-Waite split of ln 2, every step an explicit lane-wise
// IEEE operation. x is clamped to [-87, 88] (so 2^n stays a normal number; exp(-87) ~ 1.6e-38 stands
// for anything smaller); NaN is not expected. About 2 ulp from the true value.
static inline V16 exp16(V16 x) {
  x = min(max(x, set1(-87.0f)), set1(88.0f));
  V16 n = round_nearest(mul(x, set1(1.44269504088896341f)));
  V16 r = fma(n, set1(-0.693359375f), x);
  r = fma(n, set1(2.12194440e-4f), r);
  V16 p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  V16 y = fma(p, mul(r, r), r);
  y = add(y, set1(1.0f));
  return mul(y, pow2(n));
}

constexpr int64_t MAX_HEAD = 256;  // the largest head size (ops.cpp checks)

// Tails: a partial chunk of 16 goes through a zeroed buffer, so its lanes do the same math as a full one.
static inline V16 load_part(const float* p, int64_t count) {
  alignas(64) float buf[16] = {0};
  for (int64_t i = 0; i < count; ++i) buf[i] = p[i];
  return load(buf);
}
static inline V16 load_bf16_part(const uint16_t* p, int64_t count) {
  alignas(64) uint16_t buf[16] = {0};
  for (int64_t i = 0; i < count; ++i) buf[i] = p[i];
  return load_bf16(buf);
}
static inline void store_part(float* p, V16 a, int64_t count) {
  alignas(64) float buf[16];
  store(buf, a);
  for (int64_t i = 0; i < count; ++i) p[i] = buf[i];
}
static inline V16 load_any(const float* p, int64_t count) { return count == 16 ? load(p) : load_part(p, count); }
static inline void store_any(float* p, V16 a, int64_t count) {
  if (count == 16)
    store(p, a);
  else
    store_part(p, a, count);
}

void exp_span(const float* x, float* out, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) {
    int64_t c = count - i < 16 ? count - i : 16;
    store_any(out + i, exp16(load_any(x + i, c)), c);
  }
}

// RMSNorm of one row: sum of squares in 16 lanes (one fma per chunk, in order), the fixed tree,
// mean = sum / d, inv = 1 / sqrt(mean + eps), out = weight * (x * inv) (Qwen2's and Llama's order).
void rms_norm_row(const float* x, const float* weight, float* out, int64_t d, float eps) {
  V16 acc = zero();
  for (int64_t i = 0; i < d; i += 16) {
    int64_t c = d - i < 16 ? d - i : 16;
    V16 a = load_any(x + i, c);
    acc = fma(a, a, acc);
  }
  float mean = hsum(acc) / static_cast<float>(d);
  float inv = 1.0f / __builtin_sqrtf(mean + eps);
  V16 vinv = set1(inv);
  for (int64_t i = 0; i < d; i += 16) {
    int64_t c = d - i < 16 ? d - i : 16;
    store_any(out + i, mul(load_any(weight + i, c), mul(load_any(x + i, c), vinv)), c);
  }
}

void add_rms_norm_row(const float* x, float* residual, const float* weight, float* out, int64_t d, float eps) {
  for (int64_t i = 0; i < d; i += 16) {
    int64_t c = d - i < 16 ? d - i : 16;
    store_any(residual + i, add(load_any(residual + i, c), load_any(x + i, c)), c);
  }
  rms_norm_row(residual, weight, out, d, eps);
}

// silu(g) * u = g / (1 + exp(-g)) * u, element by element.
void silu_mul_span(const float* gate, const float* up, float* out, int64_t count) {
  const V16 one = set1(1.0f);
  for (int64_t i = 0; i < count; i += 16) {
    int64_t c = count - i < 16 ? count - i : 16;
    V16 g = load_any(gate + i, c);
    V16 e = exp16(sub(zero(), g));
    store_any(out + i, mul(div(g, add(one, e)), load_any(up + i, c)), c);
  }
}

// RoPE, NeoX's rotate-half (Qwen2, Llama in HF): with half = D / 2, c = cos[i], s = sin[i] for i < half,
//   out[i]        = x[i] * c - x[i + half] * s
//   out[i + half] = x[i + half] * c + x[i] * s
// two products and a sum or difference, each rounded once: the bits of HF's x * cos + rotate_half(x) * sin in fp32.
static inline void rope_head(const float* x, const float* bias, float* out, int64_t D, const float* cos,
                             const float* sin) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; i += 16) {
    const int64_t c = half - i < 16 ? half - i : 16;
    V16 x1 = load_any(x + i, c), x2 = load_any(x + half + i, c);
    if (bias) {
      x1 = add(x1, load_any(bias + i, c));
      x2 = add(x2, load_any(bias + half + i, c));
    }
    const V16 vc = load_any(cos + i, c), vs = load_any(sin + i, c);
    store_any(out + i, sub(mul(x1, vc), mul(x2, vs)), c);
    store_any(out + half + i, add(mul(x2, vc), mul(x1, vs)), c);
  }
}

void rope_row(const float* x, int64_t head_stride, float* out, int64_t heads, int64_t D, const float* cos,
              const float* sin) {
  for (int64_t h = 0; h < heads; ++h) rope_head(x + h * head_stride, nullptr, out + h * D, D, cos, sin);
}

// fp32 -> bf16, round to nearest even (c10::BFloat16's rule, so the cache holds what .to(torch.bfloat16) gives).
static inline uint16_t to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline void store_cache(void* base, int64_t offset, const float* x, int64_t D, bool bf16) {
  if (bf16) {
    uint16_t* p = static_cast<uint16_t*>(base) + offset;
    for (int64_t i = 0; i < D; ++i) p[i] = to_bf16(x[i]);
  } else {
    float* p = static_cast<float*>(base) + offset;
    for (int64_t i = 0; i < D; ++i) p[i] = x[i];
  }
}

// One row of a fused QKV projection [q heads | k heads | v heads] (+ bias): q roped into q_out, k roped and
// v written into the caches' slot (k_slot, v_slot: the slot's element 0 of kv head 0).
void qkv_rope_cache_row(const float* qkv, const float* bias, int64_t Hq, int64_t Hk, int64_t D, const float* cos,
                        const float* sin, float* q_out, void* k_slot, void* v_slot, int64_t head_stride, bool bf16) {
  for (int64_t h = 0; h < Hq; ++h) rope_head(qkv + h * D, bias ? bias + h * D : nullptr, q_out + h * D, D, cos, sin);
  alignas(64) float tmp[MAX_HEAD];
  for (int64_t h = 0; h < Hk; ++h) {
    const int64_t k0 = (Hq + h) * D, v0 = (Hq + Hk + h) * D;
    rope_head(qkv + k0, bias ? bias + k0 : nullptr, tmp, D, cos, sin);
    store_cache(k_slot, h * head_stride, tmp, D, bf16);
    for (int64_t i = 0; i < D; ++i) tmp[i] = bias ? qkv[v0 + i] + bias[v0 + i] : qkv[v0 + i];
    store_cache(v_slot, h * head_stride, tmp, D, bf16);
  }
}

// ---- attention ----------------------------------------------------------------------------------
// One row's query heads that share a kv head. For each head on its own: the visible keys in logical
// order in blocks of BLOCK aligned to logical index 0; per key a 16-lane dot product over D (chunks in
// order, a zero-padded last chunk) and the fixed tree, times scale; per block the max, exp of the
// differences (padding keys get p = 0 and no value), the block's sum by the fixed tree over its two
// 16-lane halves, acc = acc * exp(m_old - m_new) then acc += p_j * v_j in key order; out = acc / l.
// Heads share only the loads of a key: their arithmetic never mixes. How the work is arranged (16 keys'
// trees at once, the heads' bookkeeping in the lanes of one vector, several value chunks per pass) changes
// no operation and no operand: tests/native/test_native_attention.py checks the bits against an emulation.
constexpr int64_t BLOCK = 32;
constexpr int64_t MAX_CHUNKS = MAX_HEAD / 16;
constexpr int64_t MAX_GROUP = 8;    // heads per call (ops.cpp slices larger groups)

template <typename T>
static inline V16 load_kv(const T* p, int64_t count);
template <>
inline V16 load_kv<float>(const float* p, int64_t count) {
  return load_any(p, count);
}
template <>
inline V16 load_kv<uint16_t>(const uint16_t* p, int64_t count) {
  return count == 16 ? load_bf16(p) : load_bf16_part(p, count);
}

// Chunks of values accumulated per pass over a block's keys: enough independent fma chains (G x H accumulators;
// one V16 is two chains on AVX2) to hide the fma latency, few enough to stay in registers. Any G gives the same
// bits: each (chunk, head) accumulator still takes its keys in order.
#ifdef SPECDEC_NATIVE_AVX512
template <int H>
constexpr int value_chunks() { return H >= 5 ? 2 : H >= 3 ? 4 : 8; }
#else
template <int H>
constexpr int value_chunks() { return H >= 4 ? 1 : H >= 2 ? 2 : 4; }
#endif

// For G chunks from c0: acc[c0 + g][h] *= corr[h] (unless corr is null), then += p[h][t] * v_t[chunk c0 + g] for
// the block's keys t in order.
template <typename T, int H, int G>
static inline void accumulate_values(V16 (*acc)[H], const float (*p)[BLOCK], const T* const* vp, int64_t count,
                                     int64_t c0, int64_t chunks, int64_t last, const float* corr) {
  V16 a[G][H];
  for (int g = 0; g < G; ++g)
    for (int h = 0; h < H; ++h) a[g][h] = corr ? mul(acc[c0 + g][h], set1(corr[h])) : acc[c0 + g][h];
  for (int64_t t = 0; t < count; ++t) {
    for (int g = 0; g < G; ++g) {
      const V16 v = load_kv<T>(vp[t] + (c0 + g) * 16, c0 + g == chunks - 1 ? last : 16);
      for (int h = 0; h < H; ++h) a[g][h] = fma(set1(p[h][t]), v, a[g][h]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int h = 0; h < H; ++h) acc[c0 + g][h] = a[g][h];
}

// H: the number of heads, fixed at compile time so their loops unroll and their accumulators stay in registers.
// CH: the number of 16-lane chunks in a head when fixed at compile time (D = 16 CH), or 0 for any D.
template <typename T, int H, int CH>
static void attention_group_t(const float* const* q, float* const* out, int64_t D, const T* kbase, const T* vbase,
                              int64_t stride, const RowKeys& keys, float scale) {
  const int64_t chunks = CH > 0 ? CH : (D + 15) / 16;
  const int64_t last = CH > 0 ? 16 : D - (chunks - 1) * 16;  // lanes in the last chunk
  const int64_t L = keys.prefix + keys.n_extra;
  V16 qv[CH > 0 ? CH : MAX_CHUNKS][H];
  V16 acc[CH > 0 ? CH : MAX_CHUNKS][H];
  for (int h = 0; h < H; ++h) {
    for (int64_t c = 0; c < chunks; ++c) {
      qv[c][h] = load_any(q[h] + c * 16, c == chunks - 1 ? last : 16);
      acc[c][h] = zero();
    }
  }
  // the running max and sum, lane h for head h (lanes past H are never read)
  V16 m = set1(-__builtin_inff()), l = zero();
  if (L == 0) {  // a row that sees nothing: zeros (no softmax over an empty set)
    for (int h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) out[h][i] = 0.0f;
    return;
  }
  const V16 vscale = set1(scale);
  alignas(64) float s[H][BLOCK];
  alignas(64) float p[H][BLOCK];
  const T* kp[BLOCK];
  const T* vp[BLOCK];
  for (int64_t b0 = 0; b0 < L; b0 += BLOCK) {
    const int64_t count = L - b0 < BLOCK ? L - b0 : BLOCK;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t j = b0 + t;
      const int64_t slot = j < keys.prefix ? j : keys.extra[j - keys.prefix];
      kp[t] = kbase + slot * stride;
      vp[t] = vbase + slot * stride;
    }
    // scores: per key and head, 16 lanes over D chunk by chunk, then the fixed tree for 16 keys at once
    // (reduce16; padding keys get a zero dot, and their scores are replaced by -inf below)
    for (int64_t g0 = 0; g0 < count; g0 += 16) {
      const int64_t in_group = count - g0 < 16 ? count - g0 : 16;
      alignas(64) V16 dots[H][16];
      for (int64_t t = 0; t < in_group; ++t) {
        const T* k_row = kp[g0 + t];
        V16 dot[H];
        for (int h = 0; h < H; ++h) dot[h] = zero();
        for (int64_t c = 0; c < chunks; ++c) {
          const V16 k = load_kv<T>(k_row + c * 16, c == chunks - 1 ? last : 16);
          for (int h = 0; h < H; ++h) dot[h] = fma(qv[c][h], k, dot[h]);
        }
        for (int h = 0; h < H; ++h) dots[h][t] = dot[h];
      }
      for (int64_t t = in_group; t < 16; ++t)
        for (int h = 0; h < H; ++h) dots[h][t] = zero();
      for (int h = 0; h < H; ++h) store(s[h] + g0, mul(reduce16<Add>(dots[h]), vscale));
    }
    // softmax bookkeeping, each head on its own but with the heads in the lanes of one vector for m, l, their
    // reductions and corr = exp(m_old - m_new) (lane h of reduce16, max, sub, exp16 is exactly what the one-head
    // hmax, comparison, difference and exp give)
    V16 red[16];
    for (int h = 0; h < 16; ++h) red[h] = zero();
    for (int h = 0; h < H; ++h) {
      for (int64_t t = count; t < BLOCK; ++t) s[h][t] = -__builtin_inff();
      red[h] = max(load(s[h]), load(s[h] + 16));
    }
    const V16 m_new = max(m, reduce16<Max>(red));  // lane h: m[h] > m_block[h] ? m[h] : m_block[h]
    const bool rescale = b0 > 0;  // the first block sets l and acc; later ones scale them by corr
    alignas(64) float corr[16];
    if (rescale) store(corr, exp16(sub(m, m_new)));
    m = m_new;
    for (int h = 0; h < H; ++h) {
      const V16 vm = lane(m_new, h);
      store(p[h], exp16(sub(load(s[h]), vm)));
      store(p[h] + 16, exp16(sub(load(s[h] + 16), vm)));
      for (int64_t t = count; t < BLOCK; ++t) p[h][t] = 0.0f;
      red[h] = add(load(p[h]), load(p[h] + 16));
    }
    const V16 l_block = reduce16<Add>(red);
    l = rescale ? add(mul(l, load(corr)), l_block) : l_block;
    // values: acc[c][h] = acc[c][h] * corr[h] (after the first block), then += p[h][t] * v[t][c] with the keys in
    // order, value_chunks() chunks per pass
    constexpr int G = value_chunks<H>();
    int64_t c0 = 0;
    for (; c0 + G <= chunks; c0 += G)
      accumulate_values<T, H, G>(acc, p, vp, count, c0, chunks, last, rescale ? corr : nullptr);
    for (; c0 < chunks; ++c0) accumulate_values<T, H, 1>(acc, p, vp, count, c0, chunks, last, rescale ? corr : nullptr);
  }
  for (int h = 0; h < H; ++h) {
    const V16 vl = lane(l, h);
    for (int64_t c = 0; c < chunks; ++c)
      store_any(out[h] + c * 16, div(acc[c][h], vl), c == chunks - 1 ? last : 16);
  }
}

template <typename T, int H>
static void attention_sized(const float* const* q, float* const* out, int64_t D, const T* k, const T* v,
                            int64_t stride, const RowKeys& keys, float scale) {
  switch (D) {  // the head sizes of the models we run get their chunk loops unrolled
    case 64: return attention_group_t<T, H, 4>(q, out, D, k, v, stride, keys, scale);
    case 128: return attention_group_t<T, H, 8>(q, out, D, k, v, stride, keys, scale);
    default: return attention_group_t<T, H, 0>(q, out, D, k, v, stride, keys, scale);
  }
}

template <typename T>
static void attention_dispatch(const float* const* q, float* const* out, int64_t heads, int64_t D, const T* k,
                               const T* v, int64_t stride, const RowKeys& keys, float scale) {
  switch (heads) {
    case 1: return attention_sized<T, 1>(q, out, D, k, v, stride, keys, scale);
    case 2: return attention_sized<T, 2>(q, out, D, k, v, stride, keys, scale);
    case 3: return attention_sized<T, 3>(q, out, D, k, v, stride, keys, scale);
    case 4: return attention_sized<T, 4>(q, out, D, k, v, stride, keys, scale);
    case 5: return attention_sized<T, 5>(q, out, D, k, v, stride, keys, scale);
    case 6: return attention_sized<T, 6>(q, out, D, k, v, stride, keys, scale);
    case 7: return attention_sized<T, 7>(q, out, D, k, v, stride, keys, scale);
    default: return attention_sized<T, 8>(q, out, D, k, v, stride, keys, scale);
  }
}

void attention_group(const float* const* q, float* const* out, int64_t heads, int64_t D, const HeadCache& cache,
                     const RowKeys& keys, float scale) {
  if (cache.bf16)
    attention_dispatch<uint16_t>(q, out, heads, D, static_cast<const uint16_t*>(cache.k),
                                 static_cast<const uint16_t*>(cache.v), cache.slot_stride, keys, scale);
  else
    attention_dispatch<float>(q, out, heads, D, static_cast<const float*>(cache.k),
                              static_cast<const float*>(cache.v), cache.slot_stride, keys, scale);
}

}  // namespace SPECDEC_NATIVE_NS
}  // namespace specdec_native
