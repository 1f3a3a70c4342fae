// Per-row ops of a decode or verify step, fp32 or bf16: RMSNorm, the SwiGLU
// product, and the argmax of logits rows. With a few rows, PyTorch's versions
// cost their dispatch (F.rms_norm is 8 ops, ~60 us a call on the project's
// 2-core AVX2 CPU, 14 us in bf16 on the AVX512-BF16 one, 61 calls a forward);
// these are one call each.
// Every row is computed on its own, in a fixed order, so a row's result does not
// depend on the batch. bf16 rows are computed in float and rounded once (to
// nearest even).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "vec_exp.h"

namespace {

typedef float f8v __attribute__((vector_size(32)));

typedef int32_t i8v __attribute__((vector_size(32)));
typedef uint32_t u8v __attribute__((vector_size(32)));
typedef uint16_t h8v __attribute__((vector_size(16)));

inline f8v ld8(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void st8(float* p, f8v v) { std::memcpy(p, &v, sizeof(v)); }

// bf16 <-> float, 8 at a time: a bf16 is the high half of a float; to bf16 rounds
// to nearest even (a NaN stays a NaN).
inline f8v ld8(const at::BFloat16* p) {
  h8v h;
  std::memcpy(&h, p, sizeof(h));
  return (f8v)(__builtin_convertvector(h, u8v) << 16);
}
inline void st8(at::BFloat16* p, f8v v) {
  const u8v u = (u8v)v;
  const u8v r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const u8v nan = (u8v)(v != v);  // all ones where NaN
  const h8v h = __builtin_convertvector((r & ~nan) | ((u >> 16 | 0x40u) & nan), h8v);
  std::memcpy(p, &h, sizeof(h));
}
inline float ld1(const float* p) { return *p; }
inline float ld1(const at::BFloat16* p) { return static_cast<float>(*p); }
inline void st1(float* p, float v) { *p = v; }
inline void st1(at::BFloat16* p, float v) { *p = static_cast<at::BFloat16>(v); }

constexpr int64_t kGrain = 16;  // rows per parallel task

}  // namespace

namespace {

// add (nullptr: none): x += add first, in place, rounded to T (PyTorch's x + add)
template <typename T>
void rms_norm_impl(T* xp, const T* add, const T* wp, T* yp, int64_t t, int64_t d, float e) {
  const int64_t d8 = d / 8 * 8;
  at::parallel_for(0, t, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      T* xr = xp + r * d;
      T* yr = yp + r * d;
      if (add != nullptr) {
        const T* ar = add + r * d;
        for (int64_t i = 0; i < d8; i += 8) st8(xr + i, ld8(xr + i) + ld8(ar + i));
        for (int64_t i = d8; i < d; ++i) st1(xr + i, ld1(xr + i) + ld1(ar + i));
      }
      f8v acc = {};
      for (int64_t i = 0; i < d8; i += 8) {
        const f8v v = ld8(xr + i);
        acc += v * v;
      }
      float ss = 0.f;
      for (int l = 0; l < 8; ++l) ss += acc[l];
      for (int64_t i = d8; i < d; ++i) ss += ld1(xr + i) * ld1(xr + i);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + e);
      for (int64_t i = 0; i < d8; i += 8) st8(yr + i, ld8(xr + i) * inv * ld8(wp + i));
      for (int64_t i = d8; i < d; ++i) st1(yr + i, ld1(xr + i) * inv * ld1(wp + i));
    }
  });
}

template <typename T>
void silu_mul_impl(const T* gp, T* yp, int64_t t, int64_t n) {
  // tasks of kChunk columns of one row, so that the few rows of a verify window
  // (8 x 1536 at batch 1) still spread over the threads; element-wise, so any
  // split gives the same values
  constexpr int64_t kChunk = 256;
  const int64_t per_row = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, t * per_row, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t r = task / per_row, c0 = task % per_row * kChunk;
      const int64_t c1 = std::min(n, c0 + kChunk);
      const T* g = gp + r * 2 * n;
      const T* u = g + n;
      T* o = yp + r * n;
      int64_t i = c0;
      for (; i + 8 <= c1; i += 8) {
        const f8v gv = ld8(g + i);
        st8(o + i, gv / (1.f + exp8(-gv)) * ld8(u + i));
      }
      for (; i < c1; ++i) {
        const float gi = ld1(g + i);
        st1(o + i, gi / (1.f + std::exp(-gi)) * ld1(u + i));
      }
    }
  });
}

// Index of the first maximum of x[0..n), NaN counting as the maximum (the first
// NaN wins), as torch.argmax. One pass: each of 8 lanes keeps its best value and
// the first index where it was seen (a strict > keeps the earliest on ties).
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  float bv = -INFINITY;
  int64_t bi = 0;
  bool nan = false;
  if (n8 > 0) {
    const i8v iota = {0, 1, 2, 3, 4, 5, 6, 7};
    f8v best = ld8(x);
    i8v idx = iota;
    i8v seen_nan = (i8v)(best != best);
    for (int64_t i = 8; i < n8; i += 8) {
      const f8v v = ld8(x + i);
      const i8v gt = (i8v)(v > best);
      best = gt ? v : best;
      idx = gt ? iota + static_cast<int32_t>(i) : idx;
      seen_nan |= (i8v)(v != v);
    }
    for (int l = 0; l < 8; ++l) nan |= seen_nan[l] != 0;
    bv = best[0];
    bi = idx[0];
    for (int l = 1; l < 8; ++l)
      if (best[l] > bv || (best[l] == bv && idx[l] < bi)) bv = best[l], bi = idx[l];
  }
  for (int64_t i = n8; i < n; ++i) {
    const float v = ld1(x + i);
    nan |= v != v;
    if (v > bv || (i == 0)) bv = v, bi = i;
  }
  if (nan)
    for (int64_t i = 0; i < n; ++i) {
      const float v = ld1(x + i);
      if (v != v) return i;
    }
  return bi;
}

template <typename T>
void argmax_impl(const T* xp, int64_t* out, int64_t m, int64_t n, int64_t pitch) {
  const int64_t grain = std::max<int64_t>(1, 32768 / n);
  at::parallel_for(0, m, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) out[r] = argmax_row(xp + r * pitch, n);
  });
}

// RoPE in the rotate-half layout, as llama.py's PyTorch ops compute it:
// a = x * cos (rounded to T), then out = a + roll(x, hd / 2) * sin in one
// fused multiply-add (rounded to T), sin holding -sin in its first half: the
// roundings of PyTorch's mul and addcmul (its fp32 addcmul is fused; tested bit
// for bit). The pragmas keep the compiler from fusing the first product.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#pragma STDC FP_CONTRACT OFF
template <typename T>
void rope_impl(const T* xp, int64_t x_pitch, const T* cp, const T* sp, T* yp, int64_t t,
               int64_t heads, int64_t hd) {
  const int64_t half = hd / 2, n = heads * hd;
  at::parallel_for(0, t, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* c = cp + r * hd;
      const T* sn = sp + r * hd;
      for (int64_t h = 0; h < heads; ++h) {
        const T* x = xp + r * x_pitch + h * hd;
        T* y = yp + r * n + h * hd;
        int64_t i = 0;
        if (half % 8 == 0)
          for (; i < hd; i += 8) {
            const int64_t j = i < half ? i + half : i - half;  // the rotated half
            T a[8];
            st8(a, ld8(x + i) * ld8(c + i));
            const f8v av = ld8(a), xr = ld8(x + j), s = ld8(sn + i);
            f8v out;
            for (int k = 0; k < 8; ++k) out[k] = __builtin_fmaf(xr[k], s[k], av[k]);
            st8(y + i, out);
          }
        for (; i < hd; ++i) {
          const int64_t j = i < half ? i + half : i - half;
          T a;
          st1(&a, ld1(x + i) * ld1(c + i));
          st1(y + i, __builtin_fmaf(ld1(x + j), ld1(sn + i), ld1(&a)));
        }
      }
    }
  });
}
#pragma GCC pop_options

}  // namespace

// The argmax of each row of x [M, N] (float32 or bfloat16; rows contiguous, any
// row stride) -> int64 [M], equal to x.argmax(-1) (first maximum; a NaN is the
// maximum). PyTorch's CPU argmax is not vectorized: ~300 us for 8 rows of a 49k
// vocabulary in float32, 760 us in bf16; this is one pass at vector width.
torch::Tensor argmax_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0, "argmax_rows: x [M, N] with N > 0");
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.stride(1) == 1 && x.stride(0) >= x.size(1),
              "argmax_rows: float32 or bfloat16 with contiguous rows");
  TORCH_CHECK(x.size(1) < (int64_t{1} << 31), "argmax_rows: N must be < 2^31");
  auto out = torch::empty({x.size(0)}, x.options().dtype(at::kLong));
  if (x.scalar_type() == at::kFloat)
    argmax_impl(x.data_ptr<float>(), out.data_ptr<int64_t>(), x.size(0), x.size(1),
                x.stride(0));
  else
    argmax_impl(x.data_ptr<at::BFloat16>(), out.data_ptr<int64_t>(), x.size(0), x.size(1),
                x.stride(0));
  return out;
}

// y = x / sqrt(mean(x^2) + eps) * w, per row of x [T, d]; w [d] (same dtype).
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && x.size(1) == w.size(0),
              "rms_norm_rows: x [T, d] and w [d]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "rms_norm_rows: float32 or bfloat16 only (x and w alike)");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "rms_norm_rows: contiguous inputs");
  auto y = torch::empty_like(x);
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat)
    rms_norm_impl(x.data_ptr<float>(), static_cast<const float*>(nullptr), w.data_ptr<float>(),
                  y.data_ptr<float>(), x.size(0), x.size(1), e);
  else
    rms_norm_impl(x.data_ptr<at::BFloat16>(), static_cast<const at::BFloat16*>(nullptr),
                  w.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>(), x.size(0), x.size(1),
                  e);
  return y;
}

// The residual stream's update and the next RMSNorm in one call: x += add (in
// place, as PyTorch's x + add rounds), then rms_norm_rows(x, w, eps).
torch::Tensor add_rms_norm_rows(torch::Tensor x, torch::Tensor add, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && add.sizes() == x.sizes() && w.dim() == 1 && w.size(0) == x.size(1),
              "add_rms_norm_rows: x and add [T, d], w [d]");
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  add.scalar_type() == x.scalar_type() && w.scalar_type() == x.scalar_type(),
              "add_rms_norm_rows: float32 or bfloat16 only (x, add and w alike)");
  TORCH_CHECK(x.is_contiguous() && add.is_contiguous() && w.is_contiguous(),
              "add_rms_norm_rows: contiguous inputs");
  auto y = torch::empty_like(x);
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat)
    rms_norm_impl(x.data_ptr<float>(), add.data_ptr<float>(), w.data_ptr<float>(),
                  y.data_ptr<float>(), x.size(0), x.size(1), e);
  else
    rms_norm_impl(x.data_ptr<at::BFloat16>(), add.data_ptr<at::BFloat16>(),
                  w.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>(), x.size(0), x.size(1),
                  e);
  return y;
}

// qkv [T, W] (rows contiguous, any row stride): its first `heads` heads of hd
// columns roped at cos / sin_signed [T, hd] -> [T, heads, hd] (llama.py's
// rotate-half RoPE of the query and key heads in one call instead of three
// ops). fp32 or bf16.
torch::Tensor rope_rows(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t heads) {
  TORCH_CHECK(qkv.dim() == 2 && cos.dim() == 2 && sin.sizes() == cos.sizes(),
              "rope_rows: qkv [T, W], cos and sin [T, hd]");
  const int64_t t = qkv.size(0), hd = cos.size(1);
  TORCH_CHECK(cos.size(0) == t && hd % 2 == 0 && heads >= 0 && heads * hd <= qkv.size(1),
              "rope_rows: cos / sin rows, an even hd and heads * hd <= W");
  TORCH_CHECK((qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16) &&
                  cos.scalar_type() == qkv.scalar_type() && sin.scalar_type() == qkv.scalar_type(),
              "rope_rows: float32 or bfloat16, one dtype");
  TORCH_CHECK(qkv.stride(1) == 1 && cos.is_contiguous() && sin.is_contiguous(),
              "rope_rows: rows contiguous");
  auto y = torch::empty({t, heads, hd}, qkv.options());
  if (qkv.scalar_type() == at::kFloat)
    rope_impl(qkv.data_ptr<float>(), qkv.stride(0), cos.data_ptr<float>(), sin.data_ptr<float>(),
              y.data_ptr<float>(), t, heads, hd);
  else
    rope_impl(qkv.data_ptr<at::BFloat16>(), qkv.stride(0), cos.data_ptr<at::BFloat16>(),
              sin.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>(), t, heads, hd);
  return y;
}

// gu [T, 2I] = [gate | up] -> silu(gate) * up [T, I].
torch::Tensor silu_mul_rows(torch::Tensor gu) {
  TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0, "silu_mul_rows: gu [T, 2I]");
  TORCH_CHECK((gu.scalar_type() == at::kFloat || gu.scalar_type() == at::kBFloat16) &&
                  gu.is_contiguous(),
              "silu_mul_rows: contiguous float32 or bfloat16");
  const int64_t t = gu.size(0), n = gu.size(1) / 2;
  auto y = torch::empty({t, n}, gu.options());
  if (gu.scalar_type() == at::kFloat)
    silu_mul_impl(gu.data_ptr<float>(), y.data_ptr<float>(), t, n);
  else
    silu_mul_impl(gu.data_ptr<at::BFloat16>(), y.data_ptr<at::BFloat16>(), t, n);
  return y;
}
