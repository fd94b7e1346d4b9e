// specdec_native: the row-exact building blocks of the native forward, registered as torch ops
// (torch.ops.specdec_native.*). This file checks shapes, picks the instruction set and splits work
// over threads; the arithmetic is in kernels_impl.h. A thread always computes whole rows (or whole
// 16-aligned element spans for elementwise ops), so the split never changes a row's bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels.h"

namespace specdec_native {
namespace {

enum Isa : int { NONE = 0, AVX2 = 1, AVX512 = 2 };

Isa cpu_best() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  // __builtin_cpu_supports checks the OS's saved state (XCR0) as well as CPUID
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
#endif
  return NONE;
}

const char* isa_name(int isa) { return isa == AVX512 ? "avx512" : isa == AVX2 ? "avx2" : "none"; }

std::atomic<int> g_isa{-1};

// The kernels run in IEEE's default floating-point mode (round to nearest, no flush-to-zero, no
// denormals-are-zero), whatever the calling thread set (torch.set_flush_denormal sets it on one thread only):
// a row's bits must not depend on which thread computed it. MXCSR is per thread; restored on the way out.
class DefaultFpMode {
 public:
  DefaultFpMode() : saved_(_mm_getcsr()) { _mm_setcsr(0x1F80); }
  ~DefaultFpMode() { _mm_setcsr(saved_); }
  DefaultFpMode(const DefaultFpMode&) = delete;
  DefaultFpMode& operator=(const DefaultFpMode&) = delete;

 private:
  unsigned int saved_;
};

// The path: the CPU's best until set_isa (specdec/native/ops.py applies SPECDEC_NATIVE_ISA through it when it
// loads this library, with the one meaning specdec/native/build.py gives it; this file does not read it).
int current() {
  int isa = g_isa.load();
  if (isa < 0) {
    isa = cpu_best();
    g_isa.store(isa);
  }
  TORCH_CHECK(isa != NONE, "specdec_native: the CPU has neither AVX2+FMA nor AVX512F");
  return isa;
}

std::string cpu_isa() { return isa_name(cpu_best()); }
std::string isa() { return isa_name(current()); }

void set_isa(const std::string& name) {
  const Isa best = cpu_best();
  Isa want = name == "avx512" ? AVX512 : name == "avx2" ? AVX2 : NONE;
  TORCH_CHECK(want != NONE, "specdec_native.set_isa: expected 'avx2' or 'avx512', got '", name, "'");
  TORCH_CHECK(want <= best, "specdec_native.set_isa: this CPU does not support ", name, " (best: ",
              isa_name(best), ")");
  g_isa.store(want);
}

void check_f32(const at::Tensor& t, const char* op, const char* what, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", what, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", what, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, op, ": ", what, " must have ", dim, " dimensions, got shape ", t.sizes());
}

// one int64 entry per row: positions, slots, prefix lengths
void check_per_row(const at::Tensor& t, const char* op, const char* what, int64_t n) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.size(0) == n, op, ": ", what,
              " must be int64 [n] with n = ", n);
}

// x [n, d] and its norm's weight [d]
void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  check_f32(x, op, "x", 2);
  check_f32(weight, op, "weight", 1);
  TORCH_CHECK(weight.size(0) == x.size(1), op, ": weight has ", weight.size(0), " elements, x rows have ", x.size(1));
}

// RoPE's cos and sin tables for head size D: [P, D/2] (or HF's [P, D], whose halves are equal), of one shape
void check_tables(const at::Tensor& cos, const at::Tensor& sin, const char* op, int64_t D) {
  check_f32(cos, op, "cos", 2);
  check_f32(sin, op, "sin", 2);
  TORCH_CHECK(cos.sizes() == sin.sizes(), op, ": cos ", cos.sizes(), " and sin ", sin.sizes(), " differ in shape");
  TORCH_CHECK(cos.size(1) == D / 2 || cos.size(1) == D, op, ": the tables must be [P, D/2] (or HF's [P, D], ",
              "whose halves are equal), got ", cos.sizes(), " for D = ", D);
}

// every position a row of the tables (P rows)
void check_positions(const int64_t* positions, int64_t n, int64_t P, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(positions[i] >= 0 && positions[i] < P, op, ": positions[", i, "] = ", positions[i],
                " is outside the tables' ", P, " rows");
}

// the KV caches: [Hk, S, D] of one shape, both bfloat16 or both float32, on the CPU, the same strides and
// contiguous rows. Returns whether they hold bfloat16.
bool check_caches(const at::Tensor& k_cache, const at::Tensor& v_cache, const char* op) {
  TORCH_CHECK(k_cache.device().is_cpu() && v_cache.device().is_cpu(), op, ": the caches must be on the CPU");
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.dim() == 3, op, ": k_cache and v_cache must be [Hk, S, D], got ",
              k_cache.sizes(), " and ", v_cache.sizes());
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), op, ": k_cache ", k_cache.sizes(), " and v_cache ",
              v_cache.sizes(), " differ in shape");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), op, ": k_cache and v_cache differ in dtype");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || k_cache.scalar_type() == at::kFloat, op, ": the caches must be bfloat16 or float32, got ",
              k_cache.scalar_type());
  TORCH_CHECK(k_cache.stride(2) == 1 && v_cache.stride(2) == 1 && k_cache.strides() == v_cache.strides(), op,
              ": k_cache and v_cache need the same strides and contiguous rows");
  return bf16;
}

// rows per task so that a task holds about `work` elements: small batches stay on one thread
int64_t grain_rows(int64_t row_elems, int64_t work = 1 << 15) {
  return std::max<int64_t>(1, work / std::max<int64_t>(1, row_elems));
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_norm(x_in, weight_in, "rms_norm");
  const int64_t n = x_in.size(0), d = x_in.size(1);
  const int isa = current();
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty({n, d}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, grain_rows(d), [&](int64_t begin, int64_t end) {
    DefaultFpMode fp_mode;
    for (int64_t i = begin; i < end; ++i) {
      if (isa == AVX512)
        avx512::rms_norm_row(xp + i * d, wp, op + i * d, d, static_cast<float>(eps));
      else
        avx2::rms_norm_row(xp + i * d, wp, op + i * d, d, static_cast<float>(eps));
    }
  });
  return out;
}

at::Tensor add_rms_norm(const at::Tensor& x_in, at::Tensor& residual, const at::Tensor& weight_in, double eps) {
  check_norm(x_in, weight_in, "add_rms_norm");
  check_f32(residual, "add_rms_norm", "residual", 2);
  TORCH_CHECK(x_in.sizes() == residual.sizes(), "add_rms_norm: x ", x_in.sizes(), " and residual ",
              residual.sizes(), " differ in shape");
  TORCH_CHECK(residual.is_contiguous(), "add_rms_norm: residual must be contiguous (it is updated in place)");
  const int64_t n = x_in.size(0), d = x_in.size(1);
  const int isa = current();
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty({n, d}, x.options());
  const float* xp = x.data_ptr<float>();
  float* rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, grain_rows(d), [&](int64_t begin, int64_t end) {
    DefaultFpMode fp_mode;
    for (int64_t i = begin; i < end; ++i) {
      if (isa == AVX512)
        avx512::add_rms_norm_row(xp + i * d, rp + i * d, wp, op + i * d, d, static_cast<float>(eps));
      else
        avx2::add_rms_norm_row(xp + i * d, rp + i * d, wp, op + i * d, d, static_cast<float>(eps));
    }
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up_in) {
  check_f32(gate_up_in, "silu_mul", "gate_up", 2);
  const int64_t n = gate_up_in.size(0), two_i = gate_up_in.size(1);
  TORCH_CHECK(two_i % 2 == 0, "silu_mul: gate_up needs an even number of columns (gate | up), got ", two_i);
  const int64_t I = two_i / 2;
  const int isa = current();
  at::Tensor gate_up = gate_up_in.contiguous();
  at::Tensor out = at::empty({n, I}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // tasks: (row, span of SPAN columns); spans start at multiples of 16, and the math is per element anyway
  constexpr int64_t SPAN = 2048;
  const int64_t spans = (I + SPAN - 1) / SPAN;
  at::parallel_for(0, n * spans, std::max<int64_t>(1, (1 << 15) / SPAN), [&](int64_t begin, int64_t end) {
    DefaultFpMode fp_mode;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / spans, c0 = (task % spans) * SPAN;
      const int64_t count = std::min(SPAN, I - c0);
      const float* row = gp + i * two_i;
      if (isa == AVX512)
        avx512::silu_mul_span(row + c0, row + I + c0, op + i * I + c0, count);
      else
        avx2::silu_mul_span(row + c0, row + I + c0, op + i * I + c0, count);
    }
  });
  return out;
}

at::Tensor exp_op(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(), "exp: x must be a float32 CPU tensor");
  const int isa = current();
  at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x);
  DefaultFpMode fp_mode;
  if (isa == AVX512)
    avx512::exp_span(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  else
    avx2::exp_span(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  return out;
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& positions_in, const at::Tensor& cos_in,
                const at::Tensor& sin_in) {
  check_f32(x, "rope", "x", 3);
  const int64_t n = x.size(0), H = x.size(1), D = x.size(2);
  TORCH_CHECK(D % 2 == 0, "rope: the head size must be even, got ", D);
  TORCH_CHECK(x.stride(2) == 1, "rope: x's last dimension must be contiguous");
  check_tables(cos_in, sin_in, "rope", D);
  check_per_row(positions_in, "rope", "positions", n);
  const int isa = current();
  at::Tensor positions = positions_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t* pp = positions.data_ptr<int64_t>();
  check_positions(pp, n, cos.size(0), "rope");
  at::Tensor out = at::empty({n, H, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t row_stride = x.stride(0), head_stride = x.stride(1), width = cos.size(1);
  at::parallel_for(0, n, grain_rows(H * D), [&](int64_t begin, int64_t end) {
    DefaultFpMode fp_mode;
    for (int64_t i = begin; i < end; ++i) {
      const float* c = cp + pp[i] * width;
      const float* s = sp + pp[i] * width;
      if (isa == AVX512)
        avx512::rope_row(xp + i * row_stride, head_stride, op + i * H * D, H, D, c, s);
      else
        avx2::rope_row(xp + i * row_stride, head_stride, op + i * H * D, H, D, c, s);
    }
  });
  return out;
}

at::Tensor qkv_rope_cache(const at::Tensor& qkv_in, const std::optional<at::Tensor>& bias_in,
                          const at::Tensor& positions_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                          at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots_in, int64_t num_heads) {
  const char* op = "qkv_rope_cache";
  check_f32(qkv_in, op, "qkv", 2);
  const bool bf16 = check_caches(k_cache, v_cache, op);
  const int64_t n = qkv_in.size(0), Hq = num_heads, Hk = k_cache.size(0), S = k_cache.size(1), D = k_cache.size(2);
  TORCH_CHECK(Hq >= 1 && D % 2 == 0 && D <= 256, op, ": need num_heads >= 1 and an even head size <= 256");
  TORCH_CHECK(qkv_in.size(1) == (Hq + 2 * Hk) * D, op, ": qkv rows have ", qkv_in.size(1), " columns, expected (",
              Hq, " + 2 * ", Hk, ") * ", D);
  check_tables(cos_in, sin_in, op, D);
  at::Tensor bias;
  if (bias_in.has_value()) {
    bias = bias_in->contiguous();
    check_f32(bias, op, "bias", 1);
    TORCH_CHECK(bias.size(0) == qkv_in.size(1), op, ": bias has ", bias.size(0), " elements, qkv rows ", qkv_in.size(1));
  }
  check_per_row(positions_in, op, "positions", n);
  check_per_row(slots_in, op, "slots", n);
  const int isa = current();
  at::Tensor qkv = qkv_in.contiguous(), positions = positions_in.contiguous(), slots = slots_in.contiguous();
  at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t* pp = positions.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  std::vector<int64_t> seen(sp, sp + n);
  std::sort(seen.begin(), seen.end());
  check_positions(pp, n, cos.size(0), op);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(seen[i] >= 0 && seen[i] < S, op, ": slot ", seen[i], " is outside the cache's ", S, " slots");
    TORCH_CHECK(i == 0 || seen[i] != seen[i - 1], op, ": slot ", seen[i], " is written by two rows");
  }
  at::Tensor q = at::empty({n, Hq, D}, qkv.options());
  const float* xp = qkv.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  const size_t elem = bf16 ? 2 : 4;
  char* kb = static_cast<char*>(k_cache.data_ptr());
  char* vb = static_cast<char*>(v_cache.data_ptr());
  const int64_t head_stride = k_cache.stride(0), slot_stride = k_cache.stride(1), width = cos.size(1);
  const int64_t row = (Hq + 2 * Hk) * D;
  at::parallel_for(0, n, grain_rows(row), [&](int64_t begin, int64_t end) {
    DefaultFpMode fp_mode;
    for (int64_t i = begin; i < end; ++i) {
      void* ks = kb + sp[i] * slot_stride * elem;
      void* vs = vb + sp[i] * slot_stride * elem;
      const float* c = cp + pp[i] * width;
      const float* s = snp + pp[i] * width;
      if (isa == AVX512)
        avx512::qkv_rope_cache_row(xp + i * row, bp, Hq, Hk, D, c, s, qp + i * Hq * D, ks, vs, head_stride, bf16);
      else
        avx2::qkv_rope_cache_row(xp + i * row, bp, Hq, Hk, D, c, s, qp + i * Hq * D, ks, vs, head_stride, bf16);
    }
  });
  return q;
}

constexpr int64_t MAX_GROUP = 8;

at::Tensor attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& prefix_in, const at::Tensor& extra_in, double scale) {
  check_f32(q_in, "attention", "q", 3);
  const bool bf16 = check_caches(k_cache, v_cache, "attention");
  const int64_t n = q_in.size(0), Hq = q_in.size(1), D = q_in.size(2);
  const int64_t Hk = k_cache.size(0), S = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D, "attention: q has head size ", D, ", the cache ", k_cache.size(2));
  TORCH_CHECK(D >= 1 && D <= 256, "attention: head size must be 1..256, got ", D);
  TORCH_CHECK(Hk >= 1 && Hq % Hk == 0, "attention: ", Hq, " query heads do not divide into ", Hk, " kv heads");
  check_per_row(prefix_in, "attention", "prefix", n);
  TORCH_CHECK(extra_in.scalar_type() == at::kLong && extra_in.dim() == 2 && extra_in.size(0) == n,
              "attention: extra must be int64 [n, E] with n = ", n);
  const int isa = current();
  at::Tensor q = q_in.contiguous(), prefix = prefix_in.contiguous(), extra = extra_in.contiguous();
  const int64_t E = extra.size(1);
  const int64_t* pp = prefix.data_ptr<int64_t>();
  const int64_t* ep = extra.data_ptr<int64_t>();
  std::vector<RowKeys> rows(n);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(pp[i] >= 0 && pp[i] <= S, "attention: prefix[", i, "] = ", pp[i], " is outside 0..", S);
    int64_t count = 0;
    while (count < E && ep[i * E + count] >= 0) {
      TORCH_CHECK(ep[i * E + count] < S, "attention: extra[", i, ", ", count, "] = ", ep[i * E + count],
                  " is outside the cache's ", S, " slots");
      ++count;
    }
    rows[i] = RowKeys{pp[i], ep + i * E, count};
  }
  at::Tensor out = at::empty({n, Hq, D}, q.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = Hq / Hk;
  // tasks: (row, kv head, slice of its query heads); slices of at most MAX_GROUP heads, fewer heads per
  // slice when there are few rows so both cores have work (each head's arithmetic is its own either way)
  const int64_t threads = at::get_num_threads();
  int64_t per = std::min<int64_t>(group, MAX_GROUP);
  while (per > 1 && n * Hk * ((group + per - 1) / per) < 2 * threads) per = (per + 1) / 2;
  const int64_t slices = (group + per - 1) / per;
  const size_t elem = bf16 ? 2 : 4;
  const char* kb = static_cast<const char*>(k_cache.data_ptr());
  const char* vb = static_cast<const char*>(v_cache.data_ptr());
  const int64_t head_stride = k_cache.stride(0), slot_stride = k_cache.stride(1);
  at::parallel_for(0, n * Hk * slices, 1, [&](int64_t begin, int64_t end) {
    DefaultFpMode fp_mode;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / (Hk * slices), kh = (task / slices) % Hk, sl = task % slices;
      const int64_t h0 = kh * group + sl * per, h1 = std::min(kh * group + group, h0 + per);
      const float* qs[MAX_GROUP];
      float* os[MAX_GROUP];
      for (int64_t h = h0; h < h1; ++h) {
        qs[h - h0] = qp + (i * Hq + h) * D;
        os[h - h0] = op + (i * Hq + h) * D;
      }
      HeadCache cache{kb + kh * head_stride * elem, vb + kh * head_stride * elem, slot_stride, bf16};
      if (isa == AVX512)
        avx512::attention_group(qs, os, h1 - h0, D, cache, rows[i], static_cast<float>(scale));
      else
        avx2::attention_group(qs, os, h1 - h0, D, cache, rows[i], static_cast<float>(scale));
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(specdec_native, m) {
  m.def("cpu_isa() -> str", &cpu_isa);
  m.def("isa() -> str", &isa);
  m.def("set_isa(str isa) -> ()", &set_isa);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor", &add_rms_norm);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  m.def("exp(Tensor x) -> Tensor", &exp_op);
  m.def("rope(Tensor x, Tensor positions, Tensor cos, Tensor sin) -> Tensor", &rope);
  m.def("qkv_rope_cache(Tensor qkv, Tensor? bias, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor slots, int num_heads) -> Tensor",
        &qkv_rope_cache);
  m.def("attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor prefix, Tensor extra, float scale) -> Tensor",
        &attention);
}

}  // namespace specdec_native
