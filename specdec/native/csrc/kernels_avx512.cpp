// The AVX512F path: one 16-lane register per vector (see kernels_impl.h).
#include <immintrin.h>
#include <cstdint>
#include "kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif

#define SPECDEC_NATIVE_NS avx512
#define SPECDEC_NATIVE_AVX512 1
#include "kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
