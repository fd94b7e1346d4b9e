// The row kernels, once per instruction set (kernels_avx2.cpp, kernels_avx512.cpp) and without torch
// headers: each ISA's translation unit is compiled for its own target, and nothing inline from torch or
// the standard library may be compiled with AVX512 and then picked by the linker for the AVX2 path.
//
// Every kernel works on 16 fp32 lanes whatever the ISA (AVX512: one register, AVX2: two), reduces
// 16 lanes by one fixed tree (lane i + lane i+8, then i+4, i+2, i+1), pads tails into a zeroed
// 16-lane buffer, and uses one polynomial exp written here: a row's bits are the same on both paths.
#pragma once
#include <cstdint>

namespace specdec_native {

// Where a row's visible keys live: cache slots 0 .. prefix-1, then extra[0 .. n_extra-1] (logical order).
struct RowKeys {
  int64_t prefix;
  const int64_t* extra;
  int64_t n_extra;
};

// One kv head's keys and values: `k` and `v` point at slot 0; slot s starts at s * slot_stride elements.
struct HeadCache {
  const void* k;
  const void* v;
  int64_t slot_stride;
  bool bf16;  // else fp32
};

#define SPECDEC_NATIVE_DECLARE(NS)                                                                         \
  namespace NS {                                                                                           \
  void rms_norm_row(const float* x, const float* weight, float* out, int64_t d, float eps);                \
  void add_rms_norm_row(const float* x, float* residual, const float* weight, float* out, int64_t d,       \
                        float eps);                                                                        \
  void silu_mul_span(const float* gate, const float* up, float* out, int64_t count);                       \
  void attention_group(const float* const* q, float* const* out, int64_t heads, int64_t D,                 \
                       const HeadCache& cache, const RowKeys& keys, float scale);                          \
  void exp_span(const float* x, float* out, int64_t count);                                                \
  void rope_row(const float* x, int64_t head_stride, float* out, int64_t heads, int64_t D, const float* cos,  \
                const float* sin);                                                                         \
  void qkv_rope_cache_row(const float* qkv, const float* bias, int64_t Hq, int64_t Hk, int64_t D,            \
                          const float* cos, const float* sin, float* q_out, void* k_slot, void* v_slot,      \
                          int64_t head_stride, bool bf16);                                                 \
  }

SPECDEC_NATIVE_DECLARE(avx2)
SPECDEC_NATIVE_DECLARE(avx512)

}  // namespace specdec_native
