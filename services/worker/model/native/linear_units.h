// What the native linear kernels (linear_rows.cpp fp32, linear_bf16.cpp bf16)
// share: how a packed matrix's units of 16 outputs and a step's rows are split
// between threads and microkernel calls. Only the microkernels differ by type.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace dspark_linear {

constexpr int64_t kUnit = 16;  // outputs per packed unit

// Units [u0, u1) of a matrix with n outputs, U at a time, then one at a time:
// micro(std::integral_constant<int, units_in_call>, first unit, valid outputs)
// (the last unit of a matrix may be partly padding).
template <int U, typename Micro>
inline void over_units(int64_t u0, int64_t u1, int64_t n, Micro&& micro) {
  int64_t u = u0;
  for (; u + U <= u1; u += U)
    micro(std::integral_constant<int, U>{}, u, std::min<int64_t>(U * kUnit, n - u * kUnit));
  for (; u < u1; ++u)
    micro(std::integral_constant<int, 1>{}, u, std::min<int64_t>(kUnit, n - u * kUnit));
}

// Threads split the units; each walks its share in groups of ~group_bytes of
// packed weights (one unit is unit_bytes), and every chunk of up to max_rows
// rows passes over a group while it is in L2: chunk(rows, first row, g0, g1).
template <typename Chunk>
inline void parallel_units(int64_t rows, int64_t units, int64_t unit_bytes,
                           int64_t group_bytes, int64_t max_rows, Chunk&& chunk) {
  const int64_t group = std::max<int64_t>(1, group_bytes / unit_bytes);
  at::parallel_for(0, units, 1, [&](int64_t a, int64_t b) {
    for (int64_t g0 = a; g0 < b; g0 += group) {
      const int64_t g1 = std::min(b, g0 + group);
      for (int64_t m0 = 0; m0 < rows; m0 += max_rows)
        chunk(std::min(max_rows, rows - m0), m0, g0, g1);
    }
  });
}

}  // namespace dspark_linear
