// y = x @ w.T in fp32 from weights kept as the GGUF file's quantized blocks.
//
// The default model ships as a GGUF file whose matrices are Q4_1 (the layers:
// per 32 weights along k, fp16 d and m and 4-bit q, w = d * q + m) and Q8_0
// (the embedding, tied to the LM head: fp16 d and 8-bit q, w = d * q).
// convert.py dequantizes them into float32 once; that float32 copy is what
// every fp32 path computes with. These kernels read the blocks instead (6 and 9
// bits a weight here against 32). Up to 8 rows each k step of 16 outputs is
// dequantized in registers and fed to the multiply-adds of linear_rows'
// microkernel (chunks of up to 4 rows); with more rows each group of units is
// dequantized once into a buffer in L2, in linear_rows.cpp's fp32 layout, that
// the fp32 microkernels pass over with every chunk of rows. The weights are
// the float32 values of the dense copy, bit for bit (d * q is exact in float32,
// 11 + 8 bits at most, so d * q + m rounds once, as numpy's dequantization
// does), and every output is the same plain sum over k in order. A model on
// these weights computes what the dense fp32 model computes, exactly, while a
// decode step reads a fifth of the bytes.
//
// Packed layout (pack_gguf_weight): per unit of 16 outputs and block of 32 k,
// Q4_1: d[16], m[16] as float32, then for each k 8 bytes, byte i holding the q
// of output i (low nibble) and output i + 8 (high nibble); Q8_0: d[16] float32,
// then for each k the 16 outputs' int8 q.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "linear_rows_kernels.h"

namespace {

using namespace dspark_linear;

constexpr int64_t kBlock = 32;  // weights along k per GGUF block
constexpr int kQ4_1 = 0, kQ8_0 = 1;
constexpr int64_t kBlockBytes[2] = {2 * kUnit * 4 + kBlock * kUnit / 2,  // 384
                                    kUnit * 4 + kBlock * kUnit};         // 576

typedef int32_t i32x8 __attribute__((vector_size(32)));

inline void st8(float* p, f8v v) { std::memcpy(p, &v, sizeof(v)); }

// 8 bytes -> 8 int32, zero- or sign-extended (one VPMOVZXBD / VPMOVSXBD with
// AVX2; GCC's generic conversion of byte vectors goes through scalar code)
template <bool kSigned>
inline i32x8 widen8(const uint8_t* p) {
  i32x8 r;
#if defined(__AVX2__)
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i w = kSigned ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  std::memcpy(&r, &w, sizeof(r));
#else
  for (int i = 0; i < 8; ++i)
    r[i] = kSigned ? static_cast<int32_t>(static_cast<int8_t>(p[i])) : p[i];
#endif
  return r;
}

// The weights of k step kk of one packed block: w[0] outputs 0-7, w[1] 8-15.
template <int kKind>
inline void block_weights(const uint8_t* blk, int kk, f8v* w) {
  const float* dm = reinterpret_cast<const float*>(blk);
  if constexpr (kKind == kQ4_1) {
    const i32x8 v = widen8<false>(blk + 2 * kUnit * 4 + 8 * kk);
    w[0] = ld8(dm) * __builtin_convertvector(v & 15, f8v) + ld8(dm + 16);
    w[1] = ld8(dm + 8) * __builtin_convertvector(v >> 4, f8v) + ld8(dm + 24);
  } else {
    const uint8_t* qs = blk + kUnit * 4 + kUnit * kk;
    w[0] = __builtin_convertvector(widen8<true>(qs), f8v) * ld8(dm);
    w[1] = __builtin_convertvector(widen8<true>(qs + 8), f8v) * ld8(dm + 8);
  }
}

// One packed unit (16 outputs x K) -> out [K, 16] float32, linear_rows' unit layout.
template <int kKind>
void dequant_unit(const uint8_t* q, int64_t K, float* out) {
  for (int64_t b = 0; b < K / kBlock; ++b, q += kBlockBytes[kKind])
    for (int kk = 0; kk < kBlock; ++kk, out += kUnit) {
      f8v w[2];
      block_weights<kKind>(q, kk, w);
      st8(out, w[0]);
      st8(out + 8, w[1]);
    }
}

// MR (<= 4) rows of x against U consecutive packed units, dequantizing in
// registers as it goes (no buffer): linear_rows_kernels.h's micro with each
// weight vector made from its block instead of loaded. Same sums, same order.
template <int kKind, int MR, int U>
inline void fused(const float* x, const uint8_t* q, int64_t unit_bytes, int64_t K, float* y,
                  int64_t ldy, int64_t n_valid) {
  f8v acc[MR][2 * U];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 2 * U; ++j) acc[m][j] = f8v{};
  for (int64_t b = 0; b < K / kBlock; ++b) {
    for (int kk = 0; kk < kBlock; ++kk) {
      // the block's scales are read at every k (from L1) rather than held: held,
      // 4U scale vectors leave too few registers and the sums were spilled
      const uint8_t* blk = q + b * kBlockBytes[kKind];
#if defined(__GNUC__)
      asm("" : "+r"(blk));
#endif
      f8v w[2 * U];
      for (int u = 0; u < U; ++u) block_weights<kKind>(blk + u * unit_bytes, kk, w + 2 * u);
      fma_rows(acc, w, x, K, b * kBlock + kk);
    }
  }
  store_sums(acc, y, ldy, n_valid);
}

// MR rows against units [u0, u1) of a packed matrix with n outputs.
template <int kKind, int MR>
void fused_rows(const float* x, const uint8_t* q, int64_t unit_bytes, float* y, int64_t K,
                int64_t n, int64_t u0, int64_t u1) {
  // 4-8 independent sums, and for one row 4 units: 4 streams from memory at once
  // (2 units ran the default model's matrices ~25% slower, though faster on one
  // matrix in cache)
  constexpr int U = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  over_units<U>(u0, u1, n, [&](auto units, int64_t u, int64_t n_valid) {
    fused<kKind, MR, decltype(units)::value>(x, q + u * unit_bytes, unit_bytes, K,
                                             y + u * kUnit, n, n_valid);
  });
}

constexpr int kMaxFusedRows = 4;
using FusedFn = void (*)(const float*, const uint8_t*, int64_t, float*, int64_t, int64_t,
                         int64_t, int64_t);
constexpr FusedFn kFused[2][kMaxFusedRows] = {
    {fused_rows<kQ4_1, 1>, fused_rows<kQ4_1, 2>, fused_rows<kQ4_1, 3>, fused_rows<kQ4_1, 4>},
    {fused_rows<kQ8_0, 1>, fused_rows<kQ8_0, 2>, fused_rows<kQ8_0, 3>, fused_rows<kQ8_0, 4>}};

// Up to this many rows the weights are dequantized in registers for each chunk
// of up to 4 rows (fused); more rows dequantize a group once into a buffer that
// the fp32 microkernels then read for every chunk of 6. On the project's 2-core
// AVX2 CPU over the default model's matrices the two are within ~10% of each
// other at 5-8 rows (fused ahead at 5, 7 and 8).
int64_t g_fused_max_rows = 8;

void check_packed(torch::Tensor qp, int64_t kind, int64_t K, int64_t N, const char* fn) {
  TORCH_CHECK(kind == kQ4_1 || kind == kQ8_0, fn, ": kind=", kind,
              " must be 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(K > 0 && K % kBlock == 0, fn, ": K=", K, " must be a positive multiple of ",
              kBlock);
  TORCH_CHECK(qp.dim() == 2 && qp.scalar_type() == at::kByte && qp.is_contiguous(), fn,
              ": a contiguous uint8 packed weight [units, bytes]");
  TORCH_CHECK(qp.size(1) == K / kBlock * kBlockBytes[kind], fn, ": ", qp.size(1),
              " bytes a unit, K=", K, " needs ", K / kBlock * kBlockBytes[kind]);
  TORCH_CHECK(N > (qp.size(0) - 1) * kUnit && N <= qp.size(0) * kUnit, fn, ": N=", N,
              " does not match ", qp.size(0), " units");
}

using DequantFn = void (*)(const uint8_t*, int64_t, float*);
constexpr DequantFn kDequant[2] = {dequant_unit<kQ4_1>, dequant_unit<kQ8_0>};

}  // namespace

torch::Tensor linear_gguf(torch::Tensor x, torch::Tensor qp, int64_t N, int64_t kind) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "linear_gguf: x a contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), units = qp.size(0);
  check_packed(qp, kind, K, N, "linear_gguf");
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const uint8_t* q = qp.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t unit_bytes = qp.size(1), unit_floats = K * kUnit;
  const DequantFn dequant = kDequant[kind];
  if (M <= g_fused_max_rows) {
    parallel_units(M, units, unit_bytes, 48 * 1024, kMaxFusedRows,
                   [&](int64_t mc, int64_t m0, int64_t g0, int64_t g1) {
      kFused[kind][mc - 1](xp + m0 * K, q, unit_bytes, yp + m0 * N, K, N, g0, g1);
    });
    return y;
  }
  // groups of ~192 KiB of dequantized weights in L2, as linear_rows
  const int64_t group = std::max<int64_t>(1, 192 * 1024 / (unit_floats * 4));
  at::parallel_for(0, units, 1, [&](int64_t a, int64_t b) {
    thread_local std::vector<float> buf;
    if (static_cast<int64_t>(buf.size()) < group * unit_floats) buf.resize(group * unit_floats);
    for (int64_t g0 = a; g0 < b; g0 += group) {
      const int64_t g1 = std::min(b, g0 + group);
      for (int64_t u = g0; u < g1; ++u)
        dequant(q + u * unit_bytes, K, buf.data() + (u - g0) * unit_floats);
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        const int64_t mc = std::min<int64_t>(kMaxRows, M - m0);
        kRows[0][mc - 1](xp + m0 * K, buf.data(), yp + m0 * N + g0 * kUnit, K, N,
                         N - g0 * kUnit, 0, g1 - g0);
      }
    }
  });
  return y;
}

// Tuning hook (benchmarks): the most rows the fused path takes; returns the old value.
int64_t set_gguf_fused_rows(int64_t n) {
  const int64_t old = g_fused_max_rows;
  g_fused_max_rows = std::max<int64_t>(0, n);
  return old;
}

// The float32 values a packed weight holds: [N, K] (tests, and the load-time check).
torch::Tensor unpack_gguf_weight(torch::Tensor qp, int64_t N, int64_t K, int64_t kind) {
  check_packed(qp, kind, K, N, "unpack_gguf_weight");
  const int64_t units = qp.size(0);
  auto w = torch::empty({units, K, kUnit}, torch::kFloat);
  const uint8_t* q = qp.data_ptr<uint8_t>();
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, units, 1, [&](int64_t a, int64_t b) {
    for (int64_t u = a; u < b; ++u) kDequant[kind](q + u * qp.size(1), K, wp + u * K * kUnit);
  });
  return w.transpose(1, 2).reshape({units * kUnit, K}).narrow(0, 0, N).contiguous();
}
