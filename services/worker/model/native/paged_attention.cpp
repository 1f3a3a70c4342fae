// Paged attention for short query windows (decode rows and verify windows of
// up to a few rows per sequence), read straight from the paged KV pool.
//
// The PyTorch path either gathers every sequence's blocks into one padded batch
// (a copy of all their K/V per layer) or calls SDPA once per sequence (a few
// hundred microseconds of dispatch per call); at concurrency 32 either costs
// several times the step's matmuls. Here one call per layer does every
// sequence: each (sequence, KV head) task reads its keys from the blocks in
// place, scores all its G x n query rows at once (the GQA heads of one KV head
// share every key load), and accumulates the values in fp32. Both products are
// broadcast-and-multiply-add over vectors of 16 keys or 16 dimensions, so no
// step needs a horizontal sum (which AVX2 has no fast form of).
//
// Row i of a window at positions [start, start + n) sees keys [0, start + i].
// Every query row is computed the same way whatever else is in the batch (keys
// in order, fixed partial sums), so a row's result does not depend on the
// batch it runs in.
#include <torch/extension.h>

#include "attention_tiles.h"

namespace {

template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k_flat, const torch::Tensor& v_flat,
         const torch::Tensor& seqs, const torch::Tensor& tables, int64_t block_size,
         double scale, torch::Tensor& out) {
  const int64_t n_heads = q.size(1), hd = q.size(2);
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
    std::vector<float> qf;
    std::vector<const T*> krow, vrow;
    TaskScratch scratch;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = tasks[4 * task], j = tasks[4 * task + 1];
      const int64_t i0 = tasks[4 * task + 2], i1 = tasks[4 * task + 3];
      const int64_t row0 = sp[3 * b] + i0, n = i1 - i0, start = sp[3 * b + 2] + i0;
      const int64_t m = g * n;  // query vectors r = (row i, head h) = i * g + h
      const int64_t* blocks = tp + b * max_blocks;
      // key t's row of this KV head, once per task: position t lives in slot
      // blocks[t / block_size] * block_size + t % block_size (a division per
      // key and pass was most of the kernel's time)
      const int64_t n_keys = start + n;
      krow.resize(n_keys);
      vrow.resize(n_keys);
      for (int64_t t = 0, blk = 0; t < n_keys; ++blk) {
        const int64_t end = std::min(n_keys, t + block_size);
        for (int64_t slot = blocks[blk] * block_size; t < end; ++t, ++slot) {
          krow[t] = kp + slot * kv_row + j * hd;
          vrow[t] = vp + slot * kv_row + j * hd;
        }
      }
      auto key_at = [&](int64_t t) { return krow[t]; };
      auto val_at = [&](int64_t t) { return vrow[t]; };
      auto seen = [&](int64_t r) { return start + r / g + 1; };  // row i: keys [0, start + i]
      qf.resize(m * hd);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < g; ++h)
          to_float(qp + (row0 + i) * q_row + (j * g + h) * hd, qf.data() + (i * g + h) * hd, hd);
      attend_task<T>(qf.data(), m, hd, n_keys, key_at, val_at, seen, sc, scratch);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t i = r / g, h = r % g;
        T* o = op + (row0 + i) * q_row + (j * g + h) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<T>(scratch.acc[r * hd + d]);
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
