// y = x @ w.T in fp32 for the row counts of decode and verify steps, on weights
// repacked once at load.
//
// oneDNN and MKL run a linear layer of 1-64 rows at 30-40% of this machine's
// read bandwidth or FMA rate (on the project's 2-core AVX2 CPU a 2-row product
// even takes longer than an 8-row one). Here w [N, K] is repacked into units of
// 16 output rows interleaved along k, wp [ceil(N / 16), K, 16], so the 16
// outputs' weights for one k are one 64-byte line and each unit is one
// sequential stream. A microkernel keeps up to 6 rows x 16 outputs (or 1 row x
// 64 outputs) of sums in registers and, for every k, broadcasts x[m, k] and
// multiply-adds it into them. Threads split the units; a few units stay in L2
// while every 6-row chunk of x passes over them.
//
// Every output y[m, n] is the plain sum over k in order, x[m, 0] * w[n, 0] +
// x[m, 1] * w[n, 1] + ..., whatever the number of rows: a row's result does
// not depend on the batch it runs in (a verify window row equals the same row
// decoded alone, bit for bit).
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "linear_units.h"

namespace {

using dspark_linear::kUnit;
typedef float f8v __attribute__((vector_size(32)));  // one AVX2 register

inline f8v ld8(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// MR rows of x (row stride K) against U consecutive units: y[m * ldy + n] for
// n < n_valid (the last unit of a matrix may be partly padding).
template <int MR, int U>
inline void micro(const float* x, const float* wp, int64_t K, float* y, int64_t ldy,
                  int64_t n_valid) {
  f8v acc[MR][2 * U];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 2 * U; ++j) acc[m][j] = f8v{};
  const int64_t stride = K * kUnit;
  for (int64_t k = 0; k < K; ++k) {
    f8v w[2 * U];
    for (int u = 0; u < U; ++u) {
      w[2 * u] = ld8(wp + u * stride + k * kUnit);
      w[2 * u + 1] = ld8(wp + u * stride + k * kUnit + 8);
    }
    for (int m = 0; m < MR; ++m) {
      const float xs = x[m * K + k];
      for (int j = 0; j < 2 * U; ++j) acc[m][j] += w[j] * xs;
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 2 * U; ++j) {
      const int64_t n0 = j * 8;
      if (n0 + 8 <= n_valid) {
        std::memcpy(y + m * ldy + n0, &acc[m][j], sizeof(f8v));
      } else {
        for (int i = 0; i < 8 && n0 + i < n_valid; ++i) y[m * ldy + n0 + i] = acc[m][j][i];
      }
    }
}

// MR rows against units [u0, u1) of a matrix with N outputs.
template <int MR>
void rows(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t u0,
          int64_t u1) {
  // registers: MR * 2U sums + 2U weight vectors + 1 broadcast within 16
  constexpr int U = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  dspark_linear::over_units<U>(u0, u1, N, [&](auto units, int64_t u, int64_t n_valid) {
    micro<MR, decltype(units)::value>(x, wp + u * K * kUnit, K, y + u * kUnit, N, n_valid);
  });
}

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t,
                        int64_t);
constexpr int kMaxRows = 6;
constexpr RowsFn kRows[kMaxRows] = {rows<1>, rows<2>, rows<3>, rows<4>, rows<5>, rows<6>};

}  // namespace

// w [N, K] -> wp [ceil(N / 16), K, 16] (padding outputs are zero).
torch::Tensor pack_rows_weight(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat,
              "pack_rows_weight: a float32 [N, K] matrix");
  const int64_t N = w.size(0), K = w.size(1), units = (N + kUnit - 1) / kUnit;
  auto padded = torch::zeros({units * kUnit, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({units, kUnit, K}).transpose(1, 2).contiguous();
}

torch::Tensor linear_rows(torch::Tensor x, torch::Tensor wp, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && wp.dim() == 3 && wp.size(2) == kUnit,
              "linear_rows: x [M, K] and a packed wp [units, K, 16]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && wp.scalar_type() == at::kFloat,
              "linear_rows: float32 only");
  TORCH_CHECK(x.size(1) == wp.size(1), "linear_rows: x has ", x.size(1),
              " columns, the weight has ", wp.size(1));
  TORCH_CHECK(N > (wp.size(0) - 1) * kUnit && N <= wp.size(0) * kUnit,
              "linear_rows: N=", N, " does not match ", wp.size(0), " units");
  TORCH_CHECK(x.is_contiguous() && wp.is_contiguous(), "linear_rows: contiguous inputs");
  const int64_t M = x.size(0), K = x.size(1), units = wp.size(0);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* wpp = wp.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // groups of ~192 KiB of weights in L2
  dspark_linear::parallel_units(M, units, K * kUnit * 4, 192 * 1024, kMaxRows,
                                [&](int64_t mc, int64_t m0, int64_t g0, int64_t g1) {
    kRows[mc - 1](xp + m0 * K, wpp, yp + m0 * N, K, N, g0, g1);
  });
  return y;
}
