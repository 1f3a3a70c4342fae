// The building blocks of the native attention kernels (paged_attention.cpp:
// the target's decode rows and verify windows; drafter_attention.cpp: the
// drafter's block rows over their cached context): vector tiles of keys and
// values, and one (query group, KV head) task that scores, normalises and
// accumulates over keys read through accessors. Every query vector is computed
// the same way whatever else is in its task (keys in order, fixed partial
// sums), so a row's result does not depend on the batch it runs in.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vec_exp.h"

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

namespace {

// GCC/Clang vector extensions of the machine's native width: 16 fp32 lanes with
// AVX-512, else 8 (AVX2; NEON's 4-lane registers take pairs). A generic vector
// wider than the machine's registers compiles to slow code (GCC keeps it in
// memory), so every loop below works in native vectors.
#if defined(__AVX512F__)
constexpr int kV = 16;
#else
constexpr int kV = 8;
#endif
typedef float fv __attribute__((vector_size(kV * 4)));
typedef int32_t iv __attribute__((vector_size(kV * 4)));
constexpr int kW = 16;        // keys per tile; head_dim must be a multiple of it
constexpr int kP = kW / kV;   // native vectors per tile row

inline fv loadv(const float* p) {
  fv v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void storev(float* p, fv v) { std::memcpy(p, &v, sizeof(v)); }

// Scores of R query vectors (stride hd) against one tile of kW keys stored
// transposed, kT[d * kstride + u] = key u's dimension d: for each d, one broadcast of
// q[d] times the kW keys' values, so lane u of s[i] is query i's dot product
// with key u, summed over d in order (no horizontal sums; every query the same
// way whatever R is).
template <int R>
inline void score_tile(const float* q, int64_t hd, const float* kT, float sc, float* out,
                       int64_t out_stride, int64_t kstride = kW) {
  fv s[R][kP];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < kP; ++c) s[i][c] = fv{};
  for (int64_t d = 0; d < hd; ++d) {
    fv k[kP];
    for (int c = 0; c < kP; ++c) k[c] = loadv(kT + d * kstride + c * kV);
    for (int i = 0; i < R; ++i) {
      const float qd = q[i * hd + d];
      for (int c = 0; c < kP; ++c) s[i][c] += qd * k[c];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < kP; ++c) storev(out + i * out_stride + c * kV, s[i][c] * sc);
}

// acc[hd] += sum over the tile's nt rows u of w[u] * v[u] (rows of stride hd),
// the NV = hd / kV vectors of acc held in registers across the rows.
template <int NV>
inline void value_tile(const float* w, const float* vt, int64_t nt, float* acc) {
  fv a[NV];
  for (int c = 0; c < NV; ++c) a[c] = loadv(acc + c * kV);
  for (int64_t u = 0; u < nt; ++u) {
    const float wu = w[u];
    for (int c = 0; c < NV; ++c) a[c] += wu * loadv(vt + u * NV * kV + c * kV);
  }
  for (int c = 0; c < NV; ++c) storev(acc + c * kV, a[c]);
}

inline void value_tile_any(const float* w, const float* vt, int64_t nt, float* acc,
                           int64_t hd) {
  switch (hd / kV) {
    case 1: return value_tile<1>(w, vt, nt, acc);
    case 2: return value_tile<2>(w, vt, nt, acc);
    case 4: return value_tile<4>(w, vt, nt, acc);
    case 6: return value_tile<6>(w, vt, nt, acc);
    case 8: return value_tile<8>(w, vt, nt, acc);
    case 10: return value_tile<10>(w, vt, nt, acc);
    case 12: return value_tile<12>(w, vt, nt, acc);
    default:  // other widths: one vector of acc at a time (the same order)
      for (int64_t c = 0; c < hd / kV; ++c) {
        fv a = loadv(acc + c * kV);
        for (int64_t u = 0; u < nt; ++u) a += w[u] * loadv(vt + u * hd + c * kV);
        storev(acc + c * kV, a);
      }
  }
}

// ktile[d * kW + u] = rows[u * hd + d] for u < kW, d < hd: a tile of kW = 16
// key rows (in float, row-major) transposed, in registers where the machine
// has the shuffles (16x16 blocks with AVX-512, 8x8 with AVX): ~1 shuffle per
// element instead of a scalar load and store.
#if defined(__AVX512F__)
inline void transpose_tile(const float* rows, int64_t hd, float* ktile) {
  static_assert(kW == 16, "one 16x16 block per 16 dimensions");
  for (int64_t c0 = 0; c0 < hd; c0 += 16) {
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows + i * hd + c0);
    for (int i = 0; i < 8; ++i) {  // per 128-bit lane L: rows 2i, 2i+1 at 4L..4L+3
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + e], lane L: rows 4i..4i+3 at column 4L + e
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
      u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
      u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int e = 0; e < 4; ++e) {  // column 4L + e: lane L of u[e], u[4+e], u[8+e], u[12+e]
      const __m512 a0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88);  // L0, L2 of each
      const __m512 a1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xDD);  // L1, L3
      const __m512 b0 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88);
      const __m512 b1 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xDD);
      _mm512_storeu_ps(ktile + (c0 + e) * kW, _mm512_shuffle_f32x4(a0, b0, 0x88));
      _mm512_storeu_ps(ktile + (c0 + 8 + e) * kW, _mm512_shuffle_f32x4(a0, b0, 0xDD));
      _mm512_storeu_ps(ktile + (c0 + 4 + e) * kW, _mm512_shuffle_f32x4(a1, b1, 0x88));
      _mm512_storeu_ps(ktile + (c0 + 12 + e) * kW, _mm512_shuffle_f32x4(a1, b1, 0xDD));
    }
  }
}
#elif defined(__AVX__)
inline void transpose_tile(const float* rows, int64_t hd, float* ktile) {
  static_assert(kW == 16, "two 8x8 blocks (keys 0-7, 8-15) per 8 dimensions");
  for (int64_t c0 = 0; c0 < hd; c0 += 8)
    for (int k0 = 0; k0 < 16; k0 += 8) {
      __m256 r[8], t[8], s[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + (k0 + i) * hd + c0);
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
      for (int i = 0; i < 2; ++i) {
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
      }
      for (int e = 0; e < 4; ++e) {
        _mm256_storeu_ps(ktile + (c0 + e) * kW + k0, _mm256_permute2f128_ps(s[e], s[4 + e], 0x20));
        _mm256_storeu_ps(ktile + (c0 + 4 + e) * kW + k0,
                         _mm256_permute2f128_ps(s[e], s[4 + e], 0x31));
      }
    }
}
#else
inline void transpose_tile(const float* rows, int64_t hd, float* ktile) {
  for (int u = 0; u < kW; ++u)
    for (int64_t d = 0; d < hd; ++d) ktile[d * kW + u] = rows[u * hd + d];
}
#endif

template <typename T>
inline void to_float(const T* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<float>(src[d]);
}

// bf16 -> fp32 is exact: the bf16 bits are the fp32 value's upper half.
template <>
inline void to_float<c10::BFloat16>(const c10::BFloat16* __restrict src, float* __restrict dst,
                                    int64_t n) {
  const uint16_t* __restrict s = reinterpret_cast<const uint16_t*>(src);
  uint32_t* __restrict d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
}

// exp(x) for x <= 0 (scores minus their maximum), kV at a time (vec_exp.h),
// times 2^k built in the exponent bits. Below -87 the result is 0.
inline fv exp_nonpositive(fv x) {
  fv k;
  const fv p = exp_mantissa(x, k);
  iv e = __builtin_convertvector(k, iv) + 127;
  e = (e > 0) & e;                    // clamp the exponent at 0 (-> 0.0f)
  const fv scale = (fv)(e << 23);
  const iv keep = x >= -87.0f;      // all ones where kept
  return (fv)((iv)(p * scale) & keep);
}

// Scores [m, padded] (padded a multiple of kV) -> exp(score - the row's max)
// over the keys row r sees, [0, seen(r)), and exactly 0 past them; denom[r]
// the row's sum (normalised later, on the accumulated values).
template <typename Seen>
inline void softmax_rows(float* scores, int64_t m, int64_t padded, const Seen& seen,
                         std::vector<float>& denom) {
  denom.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t n_seen = seen(r);
    float* sr = scores + r * padded;
    const float mx = *std::max_element(sr, sr + n_seen);
    for (int64_t t = n_seen; t < padded; ++t) sr[t] = -1e30f;  // -> exp = 0
    fv sum = {};
    for (int64_t t = 0; t < padded; t += kV) {
      const fv e = exp_nonpositive(loadv(sr + t) - mx);
      storev(sr + t, e);
      sum += e;
    }
    float total = 0.f;
    for (int l = 0; l < kV; ++l) total += sum[l];
    denom[r] = total;
  }
}

// A task's scratch, reused across the tasks of one thread.
struct TaskScratch {
  std::vector<float> scores, acc, denom, ktile, krows, vtile;
};

// m query vectors qf [m, hd] (fp32) against n_keys keys and values read through
// key_at(t) / val_at(t) (hd elements of T each); query vector r sees keys
// [0, seen(r)) (seen(r) >= 1), the others weigh 0. Leaves the normalised
// outputs in s.acc [m, hd] (fp32). Scores kW keys at a time against the tile
// transposed, four query vectors per pass; softmax per query vector; values kW
// rows at a time.
template <typename T, typename KeyAt, typename ValAt, typename Seen>
void attend_task(const float* qf, int64_t m, int64_t hd, int64_t n_keys, const KeyAt& key_at,
                 const ValAt& val_at, const Seen& seen, float sc, TaskScratch& s) {
  const int64_t padded = (n_keys + kW - 1) / kW * kW;
  s.ktile.resize(kW * hd);
  s.krows.resize(kW * hd);
  s.vtile.resize(kW * hd);
  // the next tile's rows, while this one is computed (a pool far larger than
  // the caches, rows scattered over it)
  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(T));
  auto prefetch = [&](const auto& at, int64_t from, int64_t to) {
    for (int64_t t = from; t < to; ++t) {
      const char* p = reinterpret_cast<const char*>(at(t));
      for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
    }
  };
  s.scores.assign(m * padded, 0.f);
  for (int64_t t0 = 0; t0 < n_keys; t0 += kW) {
    const int64_t nt = std::min<int64_t>(kW, n_keys - t0);
    prefetch(key_at, t0 + kW, std::min<int64_t>(n_keys, t0 + 2 * kW));
    if (nt < kW) std::fill(s.krows.begin() + nt * hd, s.krows.end(), 0.f);
    for (int64_t u = 0; u < nt; ++u) to_float(key_at(t0 + u), s.krows.data() + u * hd, hd);
    transpose_tile(s.krows.data(), hd, s.ktile.data());
    int64_t r = 0;
    for (; r + 4 <= m; r += 4)
      score_tile<4>(qf + r * hd, hd, s.ktile.data(), sc, s.scores.data() + r * padded + t0,
                    padded);
    for (; r < m; ++r)
      score_tile<1>(qf + r * hd, hd, s.ktile.data(), sc, s.scores.data() + r * padded + t0,
                    padded);
  }
  softmax_rows(s.scores.data(), m, padded, seen, s.denom);
  s.acc.assign(m * hd, 0.f);
  for (int64_t t0 = 0; t0 < n_keys; t0 += kW) {
    const int64_t nt = std::min<int64_t>(kW, n_keys - t0);
    prefetch(val_at, t0 + kW, std::min<int64_t>(n_keys, t0 + 2 * kW));
    for (int64_t u = 0; u < nt; ++u) to_float(val_at(t0 + u), s.vtile.data() + u * hd, hd);
    for (int64_t r = 0; r < m; ++r)
      value_tile_any(s.scores.data() + r * padded + t0, s.vtile.data(), nt, s.acc.data() + r * hd,
                     hd);
  }
  for (int64_t r = 0; r < m; ++r) {
    const float inv = 1.f / s.denom[r];
    for (int64_t d = 0; d < hd; ++d) s.acc[r * hd + d] *= inv;
  }
}

}  // namespace
