// The AVX2 + FMA path: two 8-lane registers per 16-lane vector (see kernels_impl.h).
#include <immintrin.h>
#include <cstdint>
#include "kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

#define SPECDEC_NATIVE_NS avx2
#include "kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
