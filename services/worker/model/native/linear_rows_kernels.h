// The fp32 microkernels of linear_rows.cpp, shared with linear_gguf.cpp (which
// runs them over weights it has just dequantized into a buffer). See
// linear_rows.cpp for the layout and why the kernels are written as they are.
#pragma once

#include <cstdint>
#include <cstring>

#include "linear_units.h"

namespace dspark_linear {

typedef float f8v __attribute__((vector_size(32)));  // one AVX2 register

inline f8v ld8(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Keeps w in registers: an empty asm that "modifies" each vector, so the
// compiler cannot fold its load into the FMAs that use it (x86 GCC/Clang).
template <int N>
inline void keep_in_registers(f8v (&w)[N]) {
#if defined(__x86_64__) && defined(__GNUC__)
  for (int j = 0; j < N; ++j) asm("" : "+x"(w[j]));
#else
  (void)w;
#endif
}

inline constexpr int64_t kPrefetchAhead = 16;  // k steps of one unit: 16 x 64 bytes

// One k step of a microkernel: acc[m][j] += w[j] * x[m * K + k] for every row.
template <int MR, int N>
inline void fma_rows(f8v (&acc)[MR][N], const f8v (&w)[N], const float* x, int64_t K,
                     int64_t k) {
  for (int m = 0; m < MR; ++m) {
    const float xs = x[m * K + k];
    for (int j = 0; j < N; ++j) acc[m][j] += w[j] * xs;
  }
}

// A microkernel's sums, MR rows x 8N outputs, into y[m * ldy + n] for n < n_valid.
template <int MR, int N>
inline void store_sums(const f8v (&acc)[MR][N], float* y, int64_t ldy, int64_t n_valid) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < N; ++j) {
      const int64_t n0 = j * 8;
      if (n0 + 8 <= n_valid) {
        std::memcpy(y + m * ldy + n0, &acc[m][j], sizeof(f8v));
      } else {
        for (int i = 0; i < 8 && n0 + i < n_valid; ++i) y[m * ldy + n0 + i] = acc[m][j][i];
      }
    }
}

// MR rows of x (row stride K) against U consecutive units: y[m * ldy + n] for
// n < n_valid (the last unit of a matrix may be partly padding). kPrefetch: the
// pass that brings the units in from memory (see the top of the file).
template <int MR, int U, bool kPrefetch>
inline void micro(const float* x, const float* wp, int64_t K, float* y, int64_t ldy,
                  int64_t n_valid) {
  constexpr bool kFmaBound = MR >= 3;
  f8v acc[MR][2 * U];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 2 * U; ++j) acc[m][j] = f8v{};
  const int64_t stride = K * kUnit;
  for (int64_t k = 0; k < K; ++k) {
    f8v w[2 * U];
    for (int u = 0; u < U; ++u) {
      // past a unit's end this touches the next one (read next anyway); a
      // prefetch never faults
      if constexpr (kPrefetch && kFmaBound)
        __builtin_prefetch(wp + u * stride + (k + kPrefetchAhead) * kUnit, 0, 2);
      w[2 * u] = ld8(wp + u * stride + k * kUnit);
      w[2 * u + 1] = ld8(wp + u * stride + k * kUnit + 8);
    }
    if constexpr (kFmaBound) keep_in_registers(w);
    fma_rows(acc, w, x, K, k);
  }
  store_sums(acc, y, ldy, n_valid);
}

// MR rows against units [u0, u1) of wp: y[m * ldy + u * 16 + j] for the n
// outputs that units 0.. of wp hold (the last unit may be partly padding).
template <int MR, bool kPrefetch>
void rows(const float* x, const float* wp, float* y, int64_t K, int64_t ldy, int64_t n,
          int64_t u0, int64_t u1) {
  // registers: MR * 2U sums + 2U weight vectors + 1 broadcast within 16
  constexpr int U = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  over_units<U>(u0, u1, n, [&](auto units, int64_t u, int64_t n_valid) {
    micro<MR, decltype(units)::value, kPrefetch>(x, wp + u * K * kUnit, K, y + u * kUnit,
                                                 ldy, n_valid);
  });
}

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t,
                        int64_t, int64_t);
inline constexpr int kMaxRows = 6;
// [first chunk of rows over a group (from memory)][rows - 1]
inline constexpr RowsFn kRows[2][kMaxRows] = {
    {rows<1, false>, rows<2, false>, rows<3, false>, rows<4, false>, rows<5, false>,
     rows<6, false>},
    {rows<1, true>, rows<2, true>, rows<3, true>, rows<4, true>, rows<5, true>, rows<6, true>}};

}  // namespace dspark_linear
