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
// With 3 or more rows the microkernel's FMAs, not the memory, set the pace once
// the weights are cached, and the first chunk of a step's rows reads each group
// from memory while it computes. Two things keep both fed on the project's
// 2-core AVX2 CPU (Zen 3): the weight vectors are held in registers (GCC
// otherwise folds each load into every FMA that uses it as a memory operand,
// and the 3- to 5-row kernels then ran at ~40% of the FMA rate against 70-95%),
// and the first chunk prefetches its stream 1 KiB ahead into L2 (the hardware
// prefetcher alone left the pass ~10-20% slower at 3-16 rows). One and two rows
// are memory-bound and run as they were (both changes measured slower there).
//
// Every output y[m, n] is the plain sum over k in order, x[m, 0] * w[n, 0] +
// x[m, 1] * w[n, 1] + ..., whatever the number of rows: a row's result does
// not depend on the batch it runs in (a verify window row equals the same row
// decoded alone, bit for bit).
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "linear_rows_kernels.h"

using namespace dspark_linear;

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
  parallel_units(M, units, K * kUnit * 4, 192 * 1024, kMaxRows,
                 [&](int64_t mc, int64_t m0, int64_t g0, int64_t g1) {
    kRows[m0 == 0][mc - 1](xp + m0 * K, wpp, yp + m0 * N, K, N, N, g0, g1);
  });
  return y;
}
