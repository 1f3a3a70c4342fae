// Paged attention for short query windows (decode rows and verify windows of
// up to a few rows per sequence), read straight from the paged KV pool.
//
// The PyTorch path either gathers every sequence's blocks into one padded batch
// (a copy of all their K/V per layer) or calls SDPA once per sequence (a few
// hundred microseconds of dispatch per call); at concurrency 32 either costs
// several times the step's matmuls. Here one call per layer does every
// sequence: each (sequence, KV head) task reads its keys from the blocks in
// place, scores all its G x n query rows at once (the GQA heads of one KV head
// share every key load), and accumulates the values in fp32.
//
// Row i of a window at positions [start, start + n) sees keys [0, start + i].
// Every query row is computed the same way whatever else is in the batch (keys
// in order, fixed partial sums), so a row's result does not depend on the
// batch it runs in.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// GCC/Clang vector extensions: 16 fp32 lanes (one AVX-512 register, two AVX2
// ones, four NEON ones: the compiler lowers them to what the target has).
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
constexpr int kW = 16;  // lanes; head_dim must be a multiple of it

inline f16v loadv(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void storev(float* p, f16v v) { std::memcpy(p, &v, sizeof(v)); }

// Lane u of the result is the sum of the lanes of p[u]: 16 horizontal sums at
// once by a transpose-and-add network (15 two-vector shuffles and adds per
// level pair, no scalar reduction), always in the same order.
inline f16v sum16(const f16v* p) {
  const i16v a1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const i16v b1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const i16v a2 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
  const i16v b2 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
  const i16v a3 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const i16v b3 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  const i16v a4 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
  const i16v b4 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
  f16v x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)  // x[i]: keys i (lanes 0-7) and i + 8 (lanes 8-15)
    x[i] = __builtin_shuffle(p[i], p[i + 8], a1) + __builtin_shuffle(p[i], p[i + 8], b1);
  for (int i = 0; i < 4; ++i)  // y[i]: keys i, i + 4, i + 8, i + 12 (4 lanes each)
    y[i] = __builtin_shuffle(x[i], x[i + 4], a2) + __builtin_shuffle(x[i], x[i + 4], b2);
  for (int i = 0; i < 2; ++i)  // z[i]: keys i, i + 2, ..., i + 14 (2 lanes each)
    z[i] = __builtin_shuffle(y[i], y[i + 2], a3) + __builtin_shuffle(y[i], y[i + 2], b3);
  return __builtin_shuffle(z[0], z[1], a4) + __builtin_shuffle(z[0], z[1], b4);
}

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

// exp(x) for x <= 0 (scores minus their maximum), 16 at a time: x = k ln2 + r,
// |r| <= ln2 / 2, exp(r) by Cephes' expf polynomial (relative error ~1e-7),
// times 2^k built in the exponent bits. Below -87 the result is 0.
inline f16v exp_nonpositive(f16v x) {
  const f16v magic = f16v{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const f16v k = (x * 1.44269504088896341f + magic) - magic;
  const f16v r = x - k * 0.693359375f + k * 2.12194440e-4f;
  f16v p = f16v{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  i16v e = __builtin_convertvector(k, i16v) + 127;
  e = (e > 0) & e;                    // clamp the exponent at 0 (-> 0.0f)
  const f16v scale = (f16v)(e << 23);
  const i16v keep = x >= -87.0f;      // all ones where kept
  return (f16v)((i16v)(p * scale) & keep);
}

template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k_flat, const torch::Tensor& v_flat,
         const torch::Tensor& seqs, const torch::Tensor& tables, int64_t block_size,
         double scale, torch::Tensor& out) {
  const int64_t n_heads = q.size(1), hd = q.size(2), nc = hd / kW;
  const int64_t n_kv = k_flat.size(1), g = n_heads / n_kv;
  const int64_t n_seqs = seqs.size(0), max_blocks = tables.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_flat.data_ptr<T>();
  const T* vp = v_flat.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* sp = seqs.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t q_row = n_heads * hd, kv_row = n_kv * hd;
  const float sc = static_cast<float>(scale);

  at::parallel_for(0, n_seqs * n_kv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf, scores, acc;
    std::vector<float> ktile(kW * hd);     // a tile of kW key rows
    std::vector<float> vtile(kW * hd);     // a tile of kW value rows
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / n_kv, j = task % n_kv;
      const int64_t row0 = sp[3 * b], n = sp[3 * b + 1], start = sp[3 * b + 2];
      const int64_t n_keys = start + n, m = g * n;  // query vectors r = (row i, head h)
      const int64_t padded = (n_keys + kW - 1) / kW * kW;
      const int64_t* blocks = tp + b * max_blocks;
      auto at = [&](const T* base, int64_t t) {
        return base + (blocks[t / block_size] * block_size + t % block_size) * kv_row + j * hd;
      };
      // the next tile's rows, while this one is computed (the pool is far larger
      // than the caches, and the blocks are scattered)
      const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(T));
      auto prefetch = [&](const T* base, int64_t from, int64_t to) {
        for (int64_t t = from; t < to; ++t) {
          const char* p = reinterpret_cast<const char*>(at(base, t));
          for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
        }
      };
      qf.resize(m * hd);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < g; ++h)
          to_float(qp + (row0 + i) * q_row + (j * g + h) * hd, qf.data() + (i * g + h) * hd, hd);
      // scores [m, padded]: kW keys at a time; per query, kW vectors of partial
      // products, summed across lanes by sum16 into one vector of kW scores
      scores.assign(m * padded, 0.f);
      for (int64_t t0 = 0; t0 < n_keys; t0 += kW) {
        const int64_t nt = std::min<int64_t>(kW, n_keys - t0);
        prefetch(kp, t0 + kW, std::min<int64_t>(n_keys, t0 + 2 * kW));
        if (nt < kW) std::fill(ktile.begin(), ktile.end(), 0.f);
        for (int64_t u = 0; u < nt; ++u) to_float(at(kp, t0 + u), ktile.data() + u * hd, hd);
        for (int64_t r = 0; r < m; ++r) {
          const float* qr = qf.data() + r * hd;
          f16v part[kW];
          for (int u = 0; u < kW; ++u) {
            const float* ku = ktile.data() + u * hd;
            f16v a = loadv(qr) * loadv(ku);
            for (int64_t c = 1; c < nc; ++c) a += loadv(qr + c * kW) * loadv(ku + c * kW);
            part[u] = a;
          }
          storev(scores.data() + r * padded + t0, sum16(part) * sc);
        }
      }
      // softmax per query row over the keys it sees (row i: [0, start + i]);
      // the others weigh 0
      std::vector<float> denom(m);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t seen = start + i + 1;
        for (int64_t h = 0; h < g; ++h) {
          float* s = scores.data() + (i * g + h) * padded;
          const float mx = *std::max_element(s, s + seen);
          for (int64_t t = seen; t < padded; ++t) s[t] = -1e30f;  // -> exp = 0
          f16v sum = {};
          for (int64_t t = 0; t < padded; t += kW) {
            const f16v e = exp_nonpositive(loadv(s + t) - mx);
            storev(s + t, e);
            sum += e;
          }
          float total = 0.f;
          for (int l = 0; l < kW; ++l) total += sum[l];
          denom[i * g + h] = total;
        }
      }
      // values: kW rows at a time; each query's accumulator is nc vectors
      acc.assign(m * hd, 0.f);
      for (int64_t t0 = 0; t0 < n_keys; t0 += kW) {
        const int64_t nt = std::min<int64_t>(kW, n_keys - t0);
        prefetch(vp, t0 + kW, std::min<int64_t>(n_keys, t0 + 2 * kW));
        for (int64_t u = 0; u < nt; ++u) to_float(at(vp, t0 + u), vtile.data() + u * hd, hd);
        for (int64_t r = 0; r < m; ++r) {
          const float* w = scores.data() + r * padded + t0;
          float* a = acc.data() + r * hd;
          for (int64_t c = 0; c < nc; ++c) {
            f16v av = loadv(a + c * kW);
            for (int64_t u = 0; u < nt; ++u) av += w[u] * loadv(vtile.data() + u * hd + c * kW);
            storev(a + c * kW, av);
          }
        }
      }
      for (int64_t r = 0; r < m; ++r) {
        const int64_t i = r / g, h = r % g;
        const float inv = 1.f / denom[r];
        T* o = op + (row0 + i) * q_row + (j * g + h) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<T>(acc[r * hd + d] * inv);
      }
    }
  });
}

}  // namespace

// q, out: [T, H, hd]; k_flat, v_flat: [slots, KV, hd] (one layer of the pool);
// seqs: int64 [B, 3] = (first row in q, rows n, position of the first row);
// tables: int64 [B, max_blocks] block ids (position p lives in slot
// tables[b][p / block_size] * block_size + p % block_size). Rows of q that no
// sequence names are left untouched in out.
void paged_short_attention(torch::Tensor q, torch::Tensor k_flat, torch::Tensor v_flat,
                           torch::Tensor seqs, torch::Tensor tables, int64_t block_size,
                           double scale, torch::Tensor out) {
  TORCH_CHECK(q.dim() == 3 && k_flat.dim() == 3 && v_flat.dim() == 3 && out.dim() == 3,
              "paged_short_attention: q, k, v, out must be 3-D");
  TORCH_CHECK(q.is_contiguous() && k_flat.is_contiguous() && v_flat.is_contiguous() &&
              out.is_contiguous() && seqs.is_contiguous() && tables.is_contiguous(),
              "paged_short_attention: inputs must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_flat.scalar_type() && q.scalar_type() == v_flat.scalar_type()
              && q.scalar_type() == out.scalar_type(), "paged_short_attention: dtypes differ");
  TORCH_CHECK(seqs.scalar_type() == torch::kInt64 && tables.scalar_type() == torch::kInt64,
              "paged_short_attention: seqs and tables must be int64");
  TORCH_CHECK(q.size(2) % kW == 0, "paged_short_attention: head_dim must be a multiple of ", kW);
  TORCH_CHECK(q.size(1) % k_flat.size(1) == 0, "paged_short_attention: heads % kv heads != 0");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(),
                                  "paged_short_attention", [&] {
    run<scalar_t>(q, k_flat, v_flat, seqs, tables, block_size, scale, out);
  });
}
