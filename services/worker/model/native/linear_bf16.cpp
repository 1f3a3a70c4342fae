// y = x @ w.T in bfloat16 for the row counts of decode and verify steps, on CPUs
// with AVX512-BF16, from weights repacked once at load.
//
// oneDNN's bf16 GEMM streams the weights at a fraction of the read bandwidth for
// 1-64 rows and, worse for speculation, picks its kernel by the number of rows:
// a row of an 8-row verify window is not the row computed alone (different
// summation order), so bf16 speculative output drifts from plain decoding.
//
// Here w [N, K] is repacked into units of 16 outputs with k in pairs,
// wp [ceil(N / 16), K / 2, 16, 2]: for one pair (k, k + 1) a unit's 16 outputs
// are one 64-byte line, the operand of one VDPBF16PS, which multiplies 16 pairs
// and adds both products to 16 float sums. x's pair (x[m, k], x[m, k + 1]) is
// broadcast to the 16 lanes. A microkernel keeps up to 8 rows x 3 units (or
// 2 rows x 8 units) of float sums in the 32 registers; threads split the units,
// and a few units stay in L2 while every 8-row chunk of x passes over them.
//
// Every output y[m, n] is its float sum over the pairs in order, rounded to
// bf16 once, whatever the number of rows: a row's result does not depend on the
// batch it runs in.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "linear_units.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define DSPARK_BF16_LINEAR 1
#endif

bool has_linear_bf16() {
#ifdef DSPARK_BF16_LINEAR
  return true;
#else
  return false;
#endif
}

using dspark_linear::kUnit;

// w [N, K] bf16 (K even) -> [ceil(N / 16), K / 2, 16, 2] (padding outputs are zero).
torch::Tensor pack_bf16_weight(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16,
              "pack_bf16_weight: a bfloat16 [N, K] matrix");
  const int64_t N = w.size(0), K = w.size(1), units = (N + kUnit - 1) / kUnit;
  TORCH_CHECK(K % 2 == 0, "pack_bf16_weight: K=", K, " is odd (k is packed in pairs)");
  auto padded = torch::zeros({units * kUnit, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  // [units, 16, K/2, 2] -> [units, K/2, 16, 2]
  return padded.view({units, kUnit, K / 2, 2}).transpose(1, 2).contiguous();
}

#ifdef DSPARK_BF16_LINEAR
namespace {

// Software prefetches of the weight stream, by where it lives. On 4 KiB pages
// the hardware prefetcher stops at every page and alone leaves an 8-row pass
// waiting on memory: into L1, 16 pairs (1 KiB) ahead in each unit's stream (over
// the default model's layers, 8 rows 10.5 -> 9.4 ms, 1 row 8.7 -> 8.3). On 2 MiB
// pages (hugepages.py) it runs on; there prefetches into L2, 32 pairs ahead, keep
// an 8-row pass fed where memory is contended (the machine's bandwidth varies
// 23-58 GB/s): 8 rows 9.1-11.1 -> 8.7-9.1 ms without prefetches against with,
// 1 row about the same.
template <bool HUGE>
struct Prefetch {
  static constexpr int64_t kAhead = HUGE ? 32 : 16;  // pairs
  static constexpr int kHint = HUGE ? _MM_HINT_T1 : _MM_HINT_T0;
};

// MR rows of x (row stride K, in pairs: int32 each) against U consecutive units.
template <int MR, int U, bool HUGE>
inline void micro(const int32_t* x, const uint16_t* wp, int64_t K2, uint16_t* y, int64_t ldy,
                  int64_t n_valid) {
  __m512 acc[MR][U];
  for (int m = 0; m < MR; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  const int64_t stride = K2 * kUnit * 2;  // bf16 elements per unit
  for (int64_t p = 0; p < K2; ++p) {
    __m512bh w[U];
    for (int u = 0; u < U; ++u) {
      w[u] = (__m512bh)_mm512_loadu_si512(wp + u * stride + p * kUnit * 2);
      // the line kAhead pairs ahead (a hint: past the end it does not fault)
      _mm_prefetch(reinterpret_cast<const char*>(wp + u * stride +
                                                 (p + Prefetch<HUGE>::kAhead) * kUnit * 2),
                   static_cast<_mm_hint>(Prefetch<HUGE>::kHint));
    }
    for (int m = 0; m < MR; ++m) {
      const __m512bh xs = (__m512bh)_mm512_set1_epi32(x[m * K2 + p]);
      for (int u = 0; u < U; ++u) acc[m][u] = _mm512_dpbf16_ps(acc[m][u], xs, w[u]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int u = 0; u < U; ++u) {
      const int64_t n0 = u * kUnit;
      if (n0 >= n_valid) break;
      const __m256bh h = _mm512_cvtneps_pbh(acc[m][u]);
      if (n0 + kUnit <= n_valid) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ldy + n0), (__m256i)h);
      } else {
        const __mmask16 mask = (__mmask16)((1u << (n_valid - n0)) - 1);
        _mm256_mask_storeu_epi16(y + m * ldy + n0, mask, (__m256i)h);
      }
    }
}

// MR rows against units [u0, u1) of a matrix with N outputs.
template <int MR, bool HUGE>
void rows(const int32_t* x, const uint16_t* wp, uint16_t* y, int64_t K2, int64_t N, int64_t u0,
          int64_t u1) {
  // registers: MR * U sums + U weights + 1 broadcast within 32
  constexpr int U = MR <= 2 ? 8 : (MR <= 4 ? 6 : (MR <= 6 ? 4 : 3));
  dspark_linear::over_units<U>(u0, u1, N, [&](auto units, int64_t u, int64_t n_valid) {
    micro<MR, decltype(units)::value, HUGE>(x, wp + u * K2 * kUnit * 2, K2, y + u * kUnit, N,
                                      n_valid);
  });
}

using RowsFn = void (*)(const int32_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t,
                        int64_t);
constexpr int kMaxRows = 8;
constexpr RowsFn kRows[2][kMaxRows] = {
    {rows<1, false>, rows<2, false>, rows<3, false>, rows<4, false>, rows<5, false>,
     rows<6, false>, rows<7, false>, rows<8, false>},
    {rows<1, true>, rows<2, true>, rows<3, true>, rows<4, true>, rows<5, true>, rows<6, true>,
     rows<7, true>, rows<8, true>}};

}  // namespace
#endif

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor wp, int64_t N, bool huge_pages) {
#ifndef DSPARK_BF16_LINEAR
  TORCH_CHECK(false, "linear_bf16: this build has no AVX512-BF16 kernel");
#else
  TORCH_CHECK(x.dim() == 2 && wp.dim() == 4 && wp.size(2) == kUnit && wp.size(3) == 2,
              "linear_bf16: x [M, K] and a packed wp [units, K / 2, 16, 2]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && wp.scalar_type() == at::kBFloat16,
              "linear_bf16: bfloat16 only");
  TORCH_CHECK(x.size(1) == 2 * wp.size(1), "linear_bf16: x has ", x.size(1),
              " columns, the weight has ", 2 * wp.size(1));
  TORCH_CHECK(N > (wp.size(0) - 1) * kUnit && N <= wp.size(0) * kUnit,
              "linear_bf16: N=", N, " does not match ", wp.size(0), " units");
  TORCH_CHECK(x.is_contiguous() && wp.is_contiguous(), "linear_bf16: contiguous inputs");
  const int64_t M = x.size(0), K2 = wp.size(1), units = wp.size(0);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const int32_t* xp = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  const uint16_t* wpp = reinterpret_cast<const uint16_t*>(wp.data_ptr<at::BFloat16>());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  // groups of ~256 KiB of weights in L2 (a unit: K2 pairs x 16 outputs x 4 bytes)
  dspark_linear::parallel_units(M, units, K2 * kUnit * 4, 256 * 1024, kMaxRows,
                                [&](int64_t mc, int64_t m0, int64_t g0, int64_t g1) {
    kRows[huge_pages ? 1 : 0][mc - 1](xp + m0 * K2, wpp, yp + m0 * N, K2, N, g0, g1);
  });
  return y;
#endif
}
