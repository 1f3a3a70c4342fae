// Per-row elementwise ops of a decode or verify step, fp32: RMSNorm and the
// SwiGLU product. With a few rows, PyTorch's versions cost their dispatch
// (F.rms_norm is 8 ops, ~60 us a call on the project's 2-core CPU, 61 calls a
// forward); these are one call each. Every row is computed on its own, in a
// fixed order, so a row's result does not depend on the batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "vec_exp.h"

namespace {

typedef float f8v __attribute__((vector_size(32)));

inline f8v ld8(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void st8(float* p, f8v v) { std::memcpy(p, &v, sizeof(v)); }

typedef int32_t i8v __attribute__((vector_size(32)));

constexpr int64_t kGrain = 16;  // rows per parallel task

// exp(x) for x clamped to [-87, 88], 8 at a time (vec_exp.h), times 2^k built
// in the exponent bits.
inline f8v exp8(f8v x) {
  x = x < -87.f ? f8v{} - 87.f : x;
  x = x > 88.f ? f8v{} + 88.f : x;
  f8v k;
  const f8v p = exp_mantissa(x, k);
  const i8v e = (__builtin_convertvector(k, i8v) + 127) << 23;
  return p * (f8v)e;
}

}  // namespace

// y = x / sqrt(mean(x^2) + eps) * w, per row of x [T, d]; w [d].
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && x.size(1) == w.size(0),
              "rms_norm_rows: x [T, d] and w [d]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "rms_norm_rows: float32 only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "rms_norm_rows: contiguous inputs");
  const int64_t t = x.size(0), d = x.size(1), d8 = d / 8 * 8;
  auto y = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, t, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xp + r * d;
      float* yr = yp + r * d;
      f8v acc = {};
      for (int64_t i = 0; i < d8; i += 8) {
        const f8v v = ld8(xr + i);
        acc += v * v;
      }
      float ss = 0.f;
      for (int l = 0; l < 8; ++l) ss += acc[l];
      for (int64_t i = d8; i < d; ++i) ss += xr[i] * xr[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + e);
      for (int64_t i = 0; i < d8; i += 8) st8(yr + i, ld8(xr + i) * inv * ld8(wp + i));
      for (int64_t i = d8; i < d; ++i) yr[i] = xr[i] * inv * wp[i];
    }
  });
  return y;
}

// gu [T, 2I] = [gate | up] -> silu(gate) * up [T, I].
torch::Tensor silu_mul_rows(torch::Tensor gu) {
  TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0, "silu_mul_rows: gu [T, 2I]");
  TORCH_CHECK(gu.scalar_type() == at::kFloat && gu.is_contiguous(),
              "silu_mul_rows: contiguous float32");
  const int64_t t = gu.size(0), n = gu.size(1) / 2;
  auto y = torch::empty({t, n}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, t, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* g = gp + r * 2 * n;
      const float* u = g + n;
      float* o = yp + r * n;
      const int64_t n8 = n / 8 * 8;
      for (int64_t i = 0; i < n8; i += 8) {
        const f8v gv = ld8(g + i);
        st8(o + i, gv / (1.f + exp8(-gv)) * ld8(u + i));
      }
      for (int64_t i = n8; i < n; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
  return y;
}
