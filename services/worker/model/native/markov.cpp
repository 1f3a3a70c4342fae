// The drafter's greedy Markov loop (DSPARK.md 1.3) in one call.
//
// For each request b and draft position k = 0..D-1:
//   e_0     = W1[anchor]               (given: the anchor is a target id)
//   logit_k = base[b, k] + W2 @ e_k    (W2 @ e_k rounded to the weight's dtype)
//   slot_k  = argmax(logit_k)          (first maximum; a NaN is the maximum)
//   e_{k+1} = W1_slot[slot_k]          (W1's rows by draft slot)
//
// In Python this is ~5 ops per position (a gather, the packed product, an add, an
// argmax, a slice), ~170 us a position at batch 1 on the project's 2-core CPU,
// most of it dispatch; here the whole loop is one call. W2 is read from the packed
// layout the native linear kernels use, and each product is computed exactly as
// they compute it for one row (linear_bf16.cpp: VDPBF16PS over k pairs in order,
// rounded to bf16 once; linear_rows.cpp: the plain fp32 sum over k in order), so
// the drafts are the ones the Python loop picks, bit for bit.
//
// Requests run in parallel; with fewer requests than threads (batch 1) each
// position's vocabulary is split between the threads instead (bf16), so each
// core keeps its part of W2 in its own L2: ~0.53 -> ~0.2 ms for the default
// drafter's 7 positions on the project's 2-core CPU.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "linear_units.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define DSPARK_BF16_MARKOV 1
#endif

namespace {

using dspark_linear::kUnit;

typedef float f8v __attribute__((vector_size(32)));

inline f8v ld8(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The running first maximum of a row scanned in order (NaN: the first NaN wins).
struct Best {
  float v = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  bool nan = false;

  // base[0..cnt) + bias[0..cnt) at indices n0.. ; returns false once a NaN is seen
  inline bool scan(const float* base, const float* bias, int64_t n0, int64_t cnt) {
    for (int64_t j = 0; j < cnt; ++j) {
      const float v_ = base[j] + bias[j];
      if (v_ != v_) {
        nan = true;
        i = n0 + j;
        return false;
      }
      if (v_ > v) {
        v = v_;
        i = n0 + j;
      }
    }
    return true;
  }
};

// W2 @ e for U consecutive units of 16 outputs each, fp32: per output as
// linear_rows.cpp's micro computes it for one row (independent sums, so the U
// units' chains overlap).
template <int U>
inline void units_f32(const float* x, const float* wu, int64_t K, float* out) {
  f8v acc[2 * U];
  for (int j = 0; j < 2 * U; ++j) acc[j] = f8v{};
  const int64_t stride = K * kUnit;
  for (int64_t k = 0; k < K; ++k) {
    const float xs = x[k];
    for (int u = 0; u < U; ++u) {
      const f8v w0 = ld8(wu + u * stride + k * kUnit), w1 = ld8(wu + u * stride + k * kUnit + 8);
      acc[2 * u] += w0 * xs;
      acc[2 * u + 1] += w1 * xs;
    }
  }
  std::memcpy(out, acc, sizeof(acc));
}

// One request's loop, fp32.
void one_request_f32(const float* base, const float* e0, const float* w1, const float* wp,
                     int64_t units, int64_t n, int64_t r, int64_t depth, int64_t* slots,
                     float* rows) {
  constexpr int U = 4;
  float bias[U * kUnit];
  std::memcpy(rows, e0, r * sizeof(float));
  for (int64_t k = 0; k < depth; ++k) {
    const float* e = rows + k * r;
    const float* bk = base + k * n;
    Best best;
    for (int64_t u = 0; u < units; u += U) {
      const int64_t m = std::min<int64_t>(U, units - u);
      if (m == U)
        units_f32<U>(e, wp + u * r * kUnit, r, bias);
      else
        for (int64_t j = 0; j < m; ++j) units_f32<1>(e, wp + (u + j) * r * kUnit, r, bias + j * kUnit);
      const int64_t n0 = u * kUnit;
      if (!best.scan(bk + n0, bias, n0, std::min<int64_t>(m * kUnit, n - n0))) break;
    }
    slots[k] = best.i;
    if (k + 1 < depth) std::memcpy(rows + (k + 1) * r, w1 + best.i * r, r * sizeof(float));
  }
}

#ifdef DSPARK_BF16_MARKOV
// W2 @ e for U consecutive units, bf16: per output as linear_bf16.cpp's micro
// computes it for one row (float sums over k pairs in order, rounded to bf16
// once), returned as float.
template <int U>
inline void units_bf16(const int32_t* x, const uint16_t* wu, int64_t K2, __m512* out) {
  __m512 acc[U];
  for (int u = 0; u < U; ++u) acc[u] = _mm512_setzero_ps();
  const int64_t stride = K2 * kUnit * 2;
  for (int64_t p = 0; p < K2; ++p) {
    const __m512bh xs = (__m512bh)_mm512_set1_epi32(x[p]);
    for (int u = 0; u < U; ++u)
      acc[u] = _mm512_dpbf16_ps(
          acc[u], xs, (__m512bh)_mm512_loadu_si512(wu + u * stride + p * kUnit * 2));
  }
  for (int u = 0; u < U; ++u) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(acc[u]);
    out[u] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The running first maximum of a scan in vector lanes: each lane keeps its first
// maximum (lanes start at -inf with indices 0..15, so a row of -inf gives 0, as
// torch.argmax does); nan_at is the first NaN's index (-1: none).
struct LaneBest {
  __m512 maxv;
  __m512i maxi;
  int64_t nan_at;
};

// W2 @ e + base over units [ua, ub) of one position: the lanes' running maxima.
inline LaneBest scan_bf16(const int32_t* e, const float* bk, const uint16_t* wp, int64_t r,
                          int64_t n, int64_t ua, int64_t ub) {
  constexpr int U = 8;
  const int64_t K2 = r / 2;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  LaneBest best{_mm512_set1_ps(-std::numeric_limits<float>::infinity()), lane, -1};
  __m512 bias[U];
  for (int64_t u = ua; u < ub && best.nan_at < 0; u += U) {
    const int64_t m = std::min<int64_t>(U, ub - u);
    if (m == U)
      units_bf16<U>(e, wp + u * r * kUnit, K2, bias);
    else
      for (int64_t j = 0; j < m; ++j) units_bf16<1>(e, wp + (u + j) * r * kUnit, K2, bias + j);
    for (int64_t j = 0; j < m; ++j) {
      const int64_t n0 = (u + j) * kUnit;
      const __mmask16 valid = n - n0 >= kUnit ? (__mmask16)0xFFFF
                                              : (__mmask16)((1u << (n - n0)) - 1);
      const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(valid, bk + n0), bias[j]);
      const __mmask16 nan = _mm512_mask_cmp_ps_mask(valid, v, v, _CMP_UNORD_Q);
      if (nan) {
        best.nan_at = n0 + __builtin_ctz(nan);
        break;
      }
      const __mmask16 gt = _mm512_mask_cmp_ps_mask(valid, v, best.maxv, _CMP_GT_OQ);
      best.maxv = _mm512_mask_mov_ps(best.maxv, gt, v);
      best.maxi = _mm512_mask_mov_epi32(best.maxi, gt, _mm512_add_epi32(lane, _mm512_set1_epi32(n0)));
    }
  }
  return best;
}

// The row's first maximum from the scans of consecutive unit ranges: the first
// NaN if any (the smallest index: each range stops at its first), else the
// largest value over every lane, ties to the lowest index.
inline int64_t first_max(const LaneBest* parts, int count) {
  int64_t nan_at = -1;
  for (int t = 0; t < count; ++t)
    if (parts[t].nan_at >= 0 && (nan_at < 0 || parts[t].nan_at < nan_at)) nan_at = parts[t].nan_at;
  if (nan_at >= 0) return nan_at;
  int64_t best = -1;
  float bv = 0.f;
  for (int t = 0; t < count; ++t) {
    alignas(64) float vs[16];
    alignas(64) int32_t is[16];
    _mm512_store_ps(vs, parts[t].maxv);
    _mm512_store_si512(is, parts[t].maxi);
    for (int j = 0; j < 16; ++j)
      if (best < 0 || vs[j] > bv || (vs[j] == bv && is[j] < best)) {
        bv = vs[j];
        best = is[j];
      }
  }
  return best;
}

// One request's loop, bf16, on the calling thread.
void one_request_bf16(const float* base, const uint16_t* e0, const uint16_t* w1,
                      const uint16_t* wp, int64_t units, int64_t n, int64_t r, int64_t depth,
                      int64_t* slots, uint16_t* rows) {
  std::memcpy(rows, e0, r * sizeof(uint16_t));
  for (int64_t k = 0; k < depth; ++k) {
    const LaneBest part = scan_bf16(reinterpret_cast<const int32_t*>(rows + k * r), base + k * n,
                                    wp, r, n, 0, units);
    const int64_t best = first_max(&part, 1);
    slots[k] = best;
    if (k + 1 < depth) std::memcpy(rows + (k + 1) * r, w1 + best * r, r * sizeof(uint16_t));
  }
}

// Requests one after another, each position's vocabulary split between the
// threads (fewer requests than threads: batch 1). W2 (2 MiB for the default
// drafter) does not fit one core's L2, so one thread streams it from L3 every
// position; split, each core's half stays in its L2. The same drafts: every
// unit's sum is computed as above, and the merge keeps the first maximum.
void requests_split_bf16(const float* base, const uint16_t* e0, const uint16_t* w1,
                         const uint16_t* wp, int64_t b, int64_t units, int64_t n, int64_t r,
                         int64_t depth, int64_t* slots, uint16_t* rows, int threads) {
  std::vector<LaneBest> parts(threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t ua = units * t / nt, ub = units * (t + 1) / nt;
    for (int64_t i = 0; i < b; ++i) {
      uint16_t* ri = rows + i * depth * r;
      const float* bi = base + i * depth * n;
#pragma omp single
      std::memcpy(ri, e0 + i * r, r * sizeof(uint16_t));
      for (int64_t k = 0; k < depth; ++k) {
        parts[t] = scan_bf16(reinterpret_cast<const int32_t*>(ri + k * r), bi + k * n, wp, r, n,
                             ua, ub);
#pragma omp barrier
#pragma omp single
        {
          const int64_t best = first_max(parts.data(), nt);
          slots[i * depth + k] = best;
          if (k + 1 < depth) std::memcpy(ri + (k + 1) * r, w1 + best * r, r * sizeof(uint16_t));
        }  // (single ends in a barrier: every thread sees the next row)
      }
    }
  }
}
#endif

}  // namespace

bool has_markov_bf16() {
#ifdef DSPARK_BF16_MARKOV
  return true;
#else
  return false;
#endif
}

// base [B, D, N] float32 (the draft head's logits), e0 [B, R] (W1 rows of the
// anchors), w1 [N, R] (W1 rows by draft slot), wp: W2 [N, R] packed as the native
// linear kernels pack it (fp32 [units, R, 16] or bf16 [units, R / 2, 16, 2]), all
// in the weight dtype -> (slots [B, D] int64, rows [B, D, R]: e_k, the W1 row each
// position's bias was computed from, for the confidence head).
std::vector<torch::Tensor> markov_greedy(torch::Tensor base, torch::Tensor e0, torch::Tensor w1,
                                         torch::Tensor wp, int64_t n) {
  TORCH_CHECK(base.dim() == 3 && base.scalar_type() == at::kFloat && base.is_contiguous(),
              "markov_greedy: base [B, D, N] contiguous float32");
  TORCH_CHECK(base.size(2) == n && n > 0, "markov_greedy: base has ", base.size(2),
              " columns, W2 has ", n, " rows");
  const auto dt = w1.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "markov_greedy: float32 or bfloat16");
  TORCH_CHECK(e0.scalar_type() == dt && wp.scalar_type() == dt,
              "markov_greedy: e0, w1 and wp of one dtype");
  TORCH_CHECK(e0.dim() == 2 && w1.dim() == 2 && e0.size(0) == base.size(0) &&
                  e0.size(1) == w1.size(1) && w1.size(0) == n,
              "markov_greedy: e0 [B, R] and w1 [N, R]");
  TORCH_CHECK(e0.is_contiguous() && w1.is_contiguous() && wp.is_contiguous(),
              "markov_greedy: contiguous inputs");
  const int64_t b = base.size(0), depth = base.size(1), r = e0.size(1);
  const int64_t units = (n + kUnit - 1) / kUnit;
  if (dt == at::kFloat) {
    TORCH_CHECK(wp.dim() == 3 && wp.size(0) == units && wp.size(1) == r && wp.size(2) == kUnit,
                "markov_greedy: fp32 wp [units, R, 16]");
  } else {
#ifndef DSPARK_BF16_MARKOV
    TORCH_CHECK(false, "markov_greedy: this build has no AVX512-BF16 kernel");
#endif
    TORCH_CHECK(r % 2 == 0 && wp.dim() == 4 && wp.size(0) == units && wp.size(1) == r / 2 &&
                    wp.size(2) == kUnit && wp.size(3) == 2,
                "markov_greedy: bf16 wp [units, R / 2, 16, 2] with R even");
  }
  auto slots = torch::empty({b, depth}, base.options().dtype(at::kLong));
  auto rows = torch::empty({b, depth, r}, e0.options());
  if (b == 0 || depth == 0) return {slots, rows};
#ifdef DSPARK_BF16_MARKOV
  const int threads = at::get_num_threads();
  if (dt == at::kBFloat16 && b < threads && units >= 64 * threads && !omp_in_parallel()) {
    auto u16 = [](const torch::Tensor& t) {
      return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
    };
    requests_split_bf16(base.data_ptr<float>(), u16(e0), u16(w1), u16(wp), b, units, n, r, depth,
                        slots.data_ptr<int64_t>(), u16(rows), threads);
    return {slots, rows};
  }
#endif
  at::parallel_for(0, b, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (dt == at::kFloat) {
        one_request_f32(base.data_ptr<float>() + i * depth * n, e0.data_ptr<float>() + i * r,
                        w1.data_ptr<float>(), wp.data_ptr<float>(), units, n, r, depth,
                        slots.data_ptr<int64_t>() + i * depth,
                        rows.data_ptr<float>() + i * depth * r);
      } else {
#ifdef DSPARK_BF16_MARKOV
        auto u16 = [](const torch::Tensor& t) {
          return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
        };
        one_request_bf16(base.data_ptr<float>() + i * depth * n, u16(e0) + i * r, u16(w1),
                         u16(wp), units, n, r, depth, slots.data_ptr<int64_t>() + i * depth,
                         u16(rows) + i * depth * r);
#endif
      }
    }
  });
  return {slots, rows};
}
