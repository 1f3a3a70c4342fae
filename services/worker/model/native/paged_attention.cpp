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
// The pool (kv_cache.py) keeps each block's keys of one KV head transposed,
// [head_dim / P][block_size][P] with P dimensions side by side, so 16 keys of
// a block are the kernel's tile as they lie: in bf16 (P = 2) each 64-byte row
// holds dimensions (2i, 2i + 1) of 16 keys, the operand of AVX-512 BF16's pair
// dot product (VDPBF16PS: one instruction per dimension pair scores 16 keys
// against one query, in fp32, no conversion or transpose); in fp32 (P = 1) one
// broadcast-and-multiply-add per dimension, as before. Values are rows
// [block_size][head_dim] per block and KV head. No step needs a horizontal sum.
//
// Row i of a window at positions [start, start + n) sees keys [0, start + i].
// Every query row is computed the same way whatever else is in the batch (keys
// in order, fixed partial sums), so a row's result does not depend on the
// batch it runs in.
#include <torch/extension.h>

#include "attention_tiles.h"

namespace {

// Scores of R bf16 query vectors against one tile of kW keys stored in
// dimension pairs: kt[i * kstride + 2 * u + e] = key u's dimension 2i + e (u <
// kW); qw[r * hp + i] = query r's dimensions (2i, 2i + 1) as one 32-bit word.
// Lane u of s[r] is query r's dot product with key u, accumulated pair by
// pair in fp32 (each pair: the odd dimension's exact product added, then the
// even one's, VDPBF16PS's order; the portable form does the same).
template <int R>
inline void score_pairs(const uint32_t* qw, int64_t hp, const uint16_t* kt, int64_t kstride,
                        float sc, float* out, int64_t out_stride) {
#if defined(__AVX512BF16__)
  static_assert(kW == 16, "one 512-bit register holds a pair row of 16 keys");
  __m512 s[R];
  for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < hp; ++i) {
    const __m512bh k = (__m512bh)_mm512_loadu_si512(kt + i * kstride);
    for (int r = 0; r < R; ++r)
      s[r] = _mm512_dpbf16_ps(s[r], k, (__m512bh)_mm512_set1_epi32(qw[r * hp + i]));
  }
  const __m512 scv = _mm512_set1_ps(sc);
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * out_stride, _mm512_mul_ps(s[r], scv));
#else
  fv s[R][kP];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kP; ++c) s[r][c] = fv{};
  typedef uint32_t uv __attribute__((vector_size(kV * 4)));
  for (int64_t i = 0; i < hp; ++i) {
    fv ko[kP], ke[kP];
    for (int c = 0; c < kP; ++c) {
      uv w;
      std::memcpy(&w, kt + i * kstride + 2 * c * kV, sizeof(w));
      ko[c] = (fv)(w & 0xFFFF0000u);  // dimension 2i + 1 (the word's upper half)
      ke[c] = (fv)(w << 16);      // dimension 2i
    }
    for (int r = 0; r < R; ++r) {
      const uint32_t q = qw[r * hp + i];
      float qo, qe;
      const uint32_t qo_bits = q & 0xFFFF0000u, qe_bits = q << 16;
      std::memcpy(&qo, &qo_bits, 4);
      std::memcpy(&qe, &qe_bits, 4);
      for (int c = 0; c < kP; ++c) {
        s[r][c] += qo * ko[c];
        s[r][c] += qe * ke[c];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kP; ++c) storev(out + r * out_stride + c * kV, s[r][c] * sc);
#endif
}

// score_pairs for m query vectors, eight at a time.
inline void score_pairs_any(const uint32_t* qw, int64_t m, int64_t hp, const uint16_t* kt,
                            int64_t kstride, float sc, float* out, int64_t out_stride) {
  int64_t r = 0;
  for (; r + 8 <= m; r += 8)
    score_pairs<8>(qw + r * hp, hp, kt, kstride, sc, out + r * out_stride, out_stride);
  const uint32_t* q = qw + r * hp;
  float* o = out + r * out_stride;
  switch (m - r) {
    case 7: return score_pairs<7>(q, hp, kt, kstride, sc, o, out_stride);
    case 6: return score_pairs<6>(q, hp, kt, kstride, sc, o, out_stride);
    case 5: return score_pairs<5>(q, hp, kt, kstride, sc, o, out_stride);
    case 4: return score_pairs<4>(q, hp, kt, kstride, sc, o, out_stride);
    case 3: return score_pairs<3>(q, hp, kt, kstride, sc, o, out_stride);
    case 2: return score_pairs<2>(q, hp, kt, kstride, sc, o, out_stride);
    case 1: return score_pairs<1>(q, hp, kt, kstride, sc, o, out_stride);
    default: return;
  }
}

// Scores of m fp32 query vectors qf [m, hd] against a transposed tile, kT[d *
// kstride + u] = key u's dimension d (as before the pool held tiles).
inline void score_floats_any(const float* qf, int64_t m, int64_t hd, const float* kT,
                             int64_t kstride, float sc, float* out, int64_t out_stride) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4)
    score_tile<4>(qf + r * hd, hd, kT, sc, out + r * out_stride, out_stride, kstride);
  for (; r < m; ++r) score_tile<1>(qf + r * hd, hd, kT, sc, out + r * out_stride, out_stride, kstride);
}

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

// q rows are q_pitch elements apart (the query heads first); out is [T, H, hd].
template <typename T>
void run(const T* qp, int64_t q_pitch, int64_t n_heads, const torch::Tensor& k_pool,
         const torch::Tensor& v_pool, const torch::Tensor& seqs, const torch::Tensor& tables,
         double scale, torch::Tensor& out) {
  const int64_t hd = out.size(2);
  const int64_t n_kv = k_pool.size(1), hp = k_pool.size(2), bs = k_pool.size(3);
  const int64_t P = k_pool.size(4), g = n_heads / n_kv;
  const int64_t n_seqs = seqs.size(0), max_blocks = tables.size(1);
  const T* kp = k_pool.data_ptr<T>();
  const T* vp = v_pool.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* sp = seqs.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t q_row = n_heads * hd, head_elems = hd * bs;  // one block of one KV head
  const float sc = static_cast<float>(scale);
  // bf16 keys are stored in dimension pairs (P = 2, checked by the caller)
  constexpr bool pairs = std::is_same_v<T, c10::BFloat16>;
  // a 16-key tile lies within one block: read in place, else assembled
  const bool in_place = bs % kW == 0;
  const int64_t tile_stride = in_place ? bs * P : kW * P;  // elements between dimension groups

  // tasks (sequence, KV head, rows [i0, i1)): a window's rows split in groups
  // when there are too few tasks to keep every thread busy (batch 1: 3 KV heads
  // on 2 threads); a row's result is the same in any group (keys past the ones
  // it sees weigh exactly 0)
  const int64_t base_tasks = n_seqs * n_kv, threads = at::get_num_threads();
  const int64_t splits = base_tasks >= 2 * threads ? 1 : (2 * threads + base_tasks - 1) / base_tasks;
  std::vector<int64_t> tasks;  // (b, j, i0, i1) flattened
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t n = sp[3 * b + 1], per = (n + splits - 1) / std::max<int64_t>(1, splits);
    for (int64_t j = 0; j < n_kv; ++j)
      for (int64_t i0 = 0; i0 < n; i0 += std::max<int64_t>(1, per))
        tasks.insert(tasks.end(), {b, j, i0, std::min(n, i0 + std::max<int64_t>(1, per))});
  }
  at::parallel_for(0, static_cast<int64_t>(tasks.size() / 4), 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf, scores, acc, denom, ftile, vtile;
    std::vector<uint32_t> qw;
    std::vector<T> atile;  // a tile assembled from two blocks (block_size not a multiple of kW)
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = tasks[4 * task], j = tasks[4 * task + 1];
      const int64_t i0 = tasks[4 * task + 2], i1 = tasks[4 * task + 3];
      const int64_t row0 = sp[3 * b] + i0, n = i1 - i0, start = sp[3 * b + 2] + i0;
      const int64_t m = g * n;  // query vectors r = (row i, head h) = i * g + h
      const int64_t* blocks = tp + b * max_blocks;
      const int64_t n_keys = start + n, padded = (n_keys + kW - 1) / kW * kW;
      auto khead = [&](int64_t t) { return kp + (blocks[t / bs] * n_kv + j) * head_elems; };
      auto vrow = [&](int64_t t) {
        return vp + (blocks[t / bs] * n_kv + j) * head_elems + (t % bs) * hd;
      };
      // keys [t0, t0 + kW) as a tile of tile_stride (lanes past n_keys: stale
      // pool values, their scores are replaced below)
      auto key_tile = [&](int64_t t0) -> const T* {
        if (in_place) return khead(t0) + (t0 % bs) * P;
        atile.assign(hp * kW * P, T(0));
        for (int64_t u = 0; u < kW && t0 + u < n_keys; ++u) {
          const T* src = khead(t0 + u) + ((t0 + u) % bs) * P;
          for (int64_t i = 0; i < hp; ++i)
            for (int64_t e = 0; e < P; ++e) atile[(i * kW + u) * P + e] = src[i * bs * P + e];
        }
        return atile.data();
      };
      auto prefetch_keys = [&](int64_t t0) {
        if (t0 >= n_keys || !in_place) return;
        const T* k = khead(t0) + (t0 % bs) * P;
        for (int64_t i = 0; i < hp; ++i) prefetch_bytes(k + i * tile_stride, kW * P * sizeof(T));
      };
      if constexpr (pairs) {  // the query rows as dimension-pair words (bf16: as they are)
        qw.resize(m * hp);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t h = 0; h < g; ++h)
            std::memcpy(qw.data() + (i * g + h) * hp, qp + (row0 + i) * q_pitch + (j * g + h) * hd,
                        hd * sizeof(T));
      } else {
        qf.resize(m * hd);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t h = 0; h < g; ++h)
            to_float(qp + (row0 + i) * q_pitch + (j * g + h) * hd, qf.data() + (i * g + h) * hd,
                   hd);
      }
      scores.assign(m * padded, 0.f);
      for (int64_t t0 = 0; t0 < n_keys; t0 += kW) {
        prefetch_keys(t0 + kW);
        const T* kt = key_tile(t0);
        float* s = scores.data() + t0;
        if constexpr (pairs) {
          score_pairs_any(qw.data(), m, hp, reinterpret_cast<const uint16_t*>(kt), tile_stride, sc,
                          s, padded);
        } else if constexpr (std::is_same_v<T, float>) {
          score_floats_any(qf.data(), m, hd, kt, tile_stride, sc, s, padded);
        } else {  // fp16: the tile in fp32 first
          ftile.resize(hd * kW);
          for (int64_t d = 0; d < hd; ++d) to_float(kt + d * tile_stride, ftile.data() + d * kW, kW);
          score_floats_any(qf.data(), m, hd, ftile.data(), kW, sc, s, padded);
        }
      }
      // row i sees keys [0, start + i]
      softmax_rows(scores.data(), m, padded, [&](int64_t r) { return start + r / g + 1; },
                   denom);
      acc.assign(m * hd, 0.f);
      vtile.resize(kW * hd);
      for (int64_t t0 = 0; t0 < n_keys; t0 += kW) {
        const int64_t nt = std::min<int64_t>(kW, n_keys - t0);
        if (t0 + kW < n_keys && in_place)
          prefetch_bytes(vrow(t0 + kW), std::min<int64_t>(kW, n_keys - t0 - kW) * hd * sizeof(T));
        const float* vt = vtile.data();
        if constexpr (std::is_same_v<T, float>) {
          if (in_place) vt = vrow(t0);  // the tile's rows, contiguous in their block
        }
        if (vt == vtile.data())  // in fp32 (the other types: converted)
          for (int64_t u = 0; u < nt; ++u) to_float(vrow(t0 + u), vtile.data() + u * hd, hd);
        for (int64_t r = 0; r < m; ++r)
          value_tile_any(scores.data() + r * padded + t0, vt, nt, acc.data() + r * hd, hd);
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

// q, out: [T, H, hd]; k_pool: [blocks, KV, hd / P, block_size, P] and v_pool:
// [blocks, KV, block_size, hd], one layer of the pool (kv_cache.pool_shapes;
// P = 2 for bf16, else 1); seqs: int64 [B, 3] = (first row in q, rows n,
// position of the first row); tables: int64 [B, max_blocks] block ids
// (position p lives in block tables[b][p / block_size] at offset p %
// block_size). Rows of q that no sequence names are left untouched in out.
void paged_short_attention(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                           torch::Tensor seqs, torch::Tensor tables, double scale,
                           torch::Tensor out) {
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3, "paged_short_attention: q and out must be 3-D");
  TORCH_CHECK(k_pool.dim() == 5 && v_pool.dim() == 4,
              "paged_short_attention: k_pool must be 5-D and v_pool 4-D (kv_cache.pool_shapes)");
  TORCH_CHECK(q.is_contiguous() && k_pool.is_contiguous() && v_pool.is_contiguous() &&
              out.is_contiguous() && seqs.is_contiguous() && tables.is_contiguous(),
              "paged_short_attention: inputs must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_pool.scalar_type() && q.scalar_type() == v_pool.scalar_type()
              && q.scalar_type() == out.scalar_type(), "paged_short_attention: dtypes differ");
  TORCH_CHECK(seqs.scalar_type() == torch::kInt64 && tables.scalar_type() == torch::kInt64,
              "paged_short_attention: seqs and tables must be int64");
  const int64_t hd = q.size(2), P = k_pool.size(4);
  TORCH_CHECK(hd % kW == 0, "paged_short_attention: head_dim must be a multiple of ", kW);
  TORCH_CHECK(q.size(1) % k_pool.size(1) == 0, "paged_short_attention: heads % kv heads != 0");
  TORCH_CHECK(P == (q.scalar_type() == at::kBFloat16 ? 2 : 1),
              "paged_short_attention: the key pool's pair width must be 2 for bf16, else 1");
  TORCH_CHECK(k_pool.size(2) * P == hd && v_pool.size(3) == hd &&
              v_pool.size(0) == k_pool.size(0) && v_pool.size(1) == k_pool.size(1) &&
              v_pool.size(2) == k_pool.size(3),
              "paged_short_attention: the key and value pools' shapes do not match q");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(),
                                  "paged_short_attention", [&] {
    run<scalar_t>(q.data_ptr<scalar_t>(), q.size(1) * q.size(2), q.size(1), k_pool, v_pool,
                  seqs, tables, scale, out);
  });
}

torch::Tensor rope_rows(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t heads);

namespace {

// The step's roped keys (qk's heads [heads, heads + KV)) and values (qkv's
// columns from (heads + KV) * hd) into the pools at each row's position.
template <typename T>
void write_rows(const T* qk, const T* qkv, int64_t heads, int64_t n_kv, int64_t hd,
                const torch::Tensor& k_pool, const torch::Tensor& v_pool,
                const torch::Tensor& seqs, const torch::Tensor& tables) {
  const int64_t n_blocks = k_pool.size(0), hp = k_pool.size(2), bs = k_pool.size(3);
  const int64_t P = k_pool.size(4), max_blocks = tables.size(1);
  const int64_t qk_pitch = (heads + n_kv) * hd, qkv_pitch = (heads + 2 * n_kv) * hd;
  T* kp = k_pool.data_ptr<T>();
  T* vp = v_pool.data_ptr<T>();
  const int64_t* sp = seqs.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  for (int64_t b = 0; b < seqs.size(0); ++b)
    for (int64_t i = 0; i < sp[3 * b + 1]; ++i) {
      const int64_t row = sp[3 * b] + i, pos = sp[3 * b + 2] + i;
      TORCH_CHECK(pos / bs < max_blocks, "rope_write_attention: position ", pos,
                  " is past sequence ", b, "'s block table");
      const int64_t blk = tp[b * max_blocks + pos / bs], off = pos % bs;
      TORCH_CHECK(blk >= 0 && blk < n_blocks, "rope_write_attention: block ", blk,
                  " out of range [0, ", n_blocks, ")");
      for (int64_t j = 0; j < n_kv; ++j) {
        const T* k = qk + row * qk_pitch + (heads + j) * hd;
        T* kd = kp + (blk * n_kv + j) * hp * bs * P + off * P;
        for (int64_t d = 0; d < hd; ++d) kd[(d / P) * bs * P + d % P] = k[d];
        std::memcpy(vp + ((blk * n_kv + j) * bs + off) * hd,
                    qkv + row * qkv_pitch + (heads + n_kv + j) * hd, hd * sizeof(T));
      }
    }
}

}  // namespace

// One layer's attention for a step whose rows are all short windows, in one
// call: llama.py's RoPE of the query and key heads of qkv [T, (H + 2 KV) hd]
// (rope_rows: the same values), the roped keys and the values written into the
// pools at each row's position, then paged_short_attention. seqs must name
// every row of qkv once (windows [row0, row0 + n) covering [0, T)). Returns
// [T, H * hd].
torch::Tensor rope_write_attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin,
                                   torch::Tensor k_pool, torch::Tensor v_pool,
                                   torch::Tensor seqs, torch::Tensor tables, double scale,
                                   int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous(), "rope_write_attention: qkv [T, W] contiguous");
  TORCH_CHECK(k_pool.dim() == 5 && v_pool.dim() == 4 && k_pool.is_contiguous() &&
                  v_pool.is_contiguous(),
              "rope_write_attention: k_pool 5-D and v_pool 4-D contiguous (kv_cache.pool_shapes)");
  TORCH_CHECK(seqs.dim() == 2 && seqs.size(1) == 3 && tables.dim() == 2 &&
                  tables.size(0) == seqs.size(0) && seqs.is_contiguous() &&
                  tables.is_contiguous() && seqs.scalar_type() == torch::kInt64 &&
                  tables.scalar_type() == torch::kInt64,
              "rope_write_attention: seqs int64 [B, 3] and tables int64 [B, max_blocks]");
  const int64_t t = qkv.size(0), hd = cos.size(1);
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
                  qkv.size(1) == (heads + 2 * kv_heads) * hd,
              "rope_write_attention: qkv width ", qkv.size(1), " != (heads ", heads,
              " + 2 * kv_heads ", kv_heads, ") * head_dim ", hd);
  TORCH_CHECK(k_pool.size(1) == kv_heads && k_pool.size(2) * k_pool.size(4) == hd &&
                  v_pool.size(3) == hd && v_pool.size(1) == kv_heads &&
                  v_pool.size(0) == k_pool.size(0) && v_pool.size(2) == k_pool.size(3),
              "rope_write_attention: the pools' shapes do not match qkv");
  TORCH_CHECK(hd % kW == 0, "rope_write_attention: head_dim must be a multiple of ", kW);
  TORCH_CHECK(k_pool.scalar_type() == qkv.scalar_type() &&
                  v_pool.scalar_type() == qkv.scalar_type(),
              "rope_write_attention: dtypes differ");
  TORCH_CHECK(k_pool.size(4) == (qkv.scalar_type() == at::kBFloat16 ? 2 : 1),
              "rope_write_attention: the key pool's pair width must be 2 for bf16, else 1");
  {  // the windows cover the rows exactly
    std::vector<int64_t> seen(t, 0);
    const int64_t* sp = seqs.data_ptr<int64_t>();
    for (int64_t b = 0; b < seqs.size(0); ++b) {
      const int64_t r0 = sp[3 * b], n = sp[3 * b + 1];
      TORCH_CHECK(r0 >= 0 && n >= 1 && r0 + n <= t && sp[3 * b + 2] >= 0,
                  "rope_write_attention: window ", b, " (row ", r0, ", ", n,
                  " rows) is not within the ", t, " rows");
      for (int64_t r = r0; r < r0 + n; ++r) seen[r] += 1;
    }
    for (int64_t r = 0; r < t; ++r)
      TORCH_CHECK(seen[r] == 1, "rope_write_attention: row ", r, " is named by ", seen[r],
                  " windows (must be 1)");
  }
  auto qk = rope_rows(qkv, cos, sin, heads + kv_heads);  // [T, H + KV, hd]
  auto out = torch::empty({t, heads, hd}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(),
                                  "rope_write_attention", [&] {
    write_rows<scalar_t>(qk.data_ptr<scalar_t>(), qkv.data_ptr<scalar_t>(), heads, kv_heads, hd,
                         k_pool, v_pool, seqs, tables);
    run<scalar_t>(qk.data_ptr<scalar_t>(), (heads + kv_heads) * hd, heads, k_pool, v_pool, seqs,
                  tables, scale, out);
  });
  return out.view({t, heads * hd});
}
