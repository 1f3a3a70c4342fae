// The shared core of the kernels' vector exp: x = k ln2 + r with |r| <= ln2 / 2,
// exp(r) by Cephes' expf polynomial (relative error ~1e-7). The caller builds
// 2^k in the exponent bits, clamped to its own range. V is a GCC/Clang vector
// of floats.
#pragma once

#include <cstdint>

template <typename V>
inline V exp_mantissa(V x, V& k) {
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  k = (x * 1.44269504088896341f + magic) - magic;
  const V r = x - k * 0.693359375f + k * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

typedef float dspark_f8v __attribute__((vector_size(32)));
typedef int32_t dspark_i8v __attribute__((vector_size(32)));

// exp(x) for x clamped to [-87, 88], 8 at a time, times 2^k built in the
// exponent bits.
inline dspark_f8v exp8(dspark_f8v x) {
  x = x < -87.f ? dspark_f8v{} - 87.f : x;
  x = x > 88.f ? dspark_f8v{} + 88.f : x;
  dspark_f8v k;
  const dspark_f8v p = exp_mantissa(x, k);
  const dspark_i8v e = (__builtin_convertvector(k, dspark_i8v) + 127) << 23;
  return p * (dspark_f8v)e;
}
