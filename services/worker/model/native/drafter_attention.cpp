// The drafter's attention at serving time: each request's K block rows attend
// over its cached context rows that are visible (inside the window, before the
// anchor: a mask) and over its own K block rows (bidirectional inside the
// block), every request and KV head in one call.
//
// SDPA with a boolean mask does the same in ~85 us for one request and ~410 us
// for eight on the 2-core CPU (more inside the serving loop), for a few hundred
// thousand multiply-adds; here each (request, KV head) task gathers the visible
// keys by index and runs attention_tiles.h's task over them.
#include <torch/extension.h>

#include "attention_tiles.h"

namespace {

template <typename T>
void run_drafter(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc,
                 const torch::Tensor& kb, const torch::Tensor& vb, const torch::Tensor& valid,
                 double scale, torch::Tensor& out) {
  const int64_t B = q.size(0), K = q.size(1), n_heads = q.size(2), hd = q.size(3);
  const int64_t C = kc.size(1), n_kv = kc.size(2), g = n_heads / n_kv;
  const T* qp = q.data_ptr<T>();
  const T* kcp = kc.data_ptr<T>();
  const T* vcp = vc.data_ptr<T>();
  const T* kbp = kb.data_ptr<T>();
  const T* vbp = vb.data_ptr<T>();
  const bool* mp = valid.data_ptr<bool>();
  T* op = out.data_ptr<T>();
  const int64_t q_row = n_heads * hd, kv_row = n_kv * hd;
  const float sc = static_cast<float>(scale);

  at::parallel_for(0, B * n_kv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf;
    std::vector<int64_t> idx;  // visible context rows, in order
    TaskScratch scratch;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / n_kv, j = task % n_kv;
      idx.clear();
      for (int64_t c = 0; c < C; ++c)
        if (mp[b * C + c]) idx.push_back(c);
      const int64_t nv = static_cast<int64_t>(idx.size()), m = g * K;
      // keys [0, nv): the visible context rows; [nv, nv + K): the block rows
      auto key_at = [&](int64_t t) {
        return t < nv ? kcp + (b * C + idx[t]) * kv_row + j * hd
                      : kbp + (b * K + t - nv) * kv_row + j * hd;
      };
      auto val_at = [&](int64_t t) {
        return t < nv ? vcp + (b * C + idx[t]) * kv_row + j * hd
                      : vbp + (b * K + t - nv) * kv_row + j * hd;
      };
      auto seen = [&](int64_t) { return nv + K; };
      qf.resize(m * hd);
      for (int64_t i = 0; i < K; ++i)
        for (int64_t h = 0; h < g; ++h)
          to_float(qp + (b * K + i) * q_row + (j * g + h) * hd, qf.data() + (i * g + h) * hd, hd);
      attend_task<T>(qf.data(), m, hd, nv + K, key_at, val_at, seen, sc, scratch);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t i = r / g, h = r % g;
        T* o = op + (b * K + i) * q_row + (j * g + h) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<T>(scratch.acc[r * hd + d]);
      }
    }
  });
}

}  // namespace

// q: [B, K, H, hd] block rows' queries; kc, vc: [B, C, KV, hd] context K/V;
// kb, vb: [B, K, KV, hd] block rows' K/V; valid: bool [B, C] (the context rows
// each request sees). Returns [B, K, H, hd]: softmax(q k^T * scale) v over the
// visible context rows and all K block rows, query head h reading KV head
// h / (H / KV).
torch::Tensor drafter_attention(torch::Tensor q, torch::Tensor kc, torch::Tensor vc,
                                torch::Tensor kb, torch::Tensor vb, torch::Tensor valid,
                                double scale) {
  TORCH_CHECK(q.dim() == 4 && kc.dim() == 4 && vc.dim() == 4 && kb.dim() == 4 && vb.dim() == 4
              && valid.dim() == 2, "drafter_attention: q, kc, vc, kb, vb must be 4-D, valid 2-D");
  TORCH_CHECK(q.is_contiguous() && kc.is_contiguous() && vc.is_contiguous() && kb.is_contiguous()
              && vb.is_contiguous() && valid.is_contiguous(),
              "drafter_attention: inputs must be contiguous");
  const auto dt = q.scalar_type();
  TORCH_CHECK(kc.scalar_type() == dt && vc.scalar_type() == dt && kb.scalar_type() == dt &&
              vb.scalar_type() == dt, "drafter_attention: dtypes differ");
  TORCH_CHECK(valid.scalar_type() == torch::kBool, "drafter_attention: valid must be bool");
  const int64_t B = q.size(0), K = q.size(1), hd = q.size(3);
  TORCH_CHECK(hd % kW == 0, "drafter_attention: head_dim must be a multiple of ", kW);
  TORCH_CHECK(kc.size(0) == B && vc.sizes() == kc.sizes() && valid.size(0) == B &&
              valid.size(1) == kc.size(1) && kc.size(3) == hd,
              "drafter_attention: context shapes do not match q");
  TORCH_CHECK(kb.size(0) == B && kb.size(1) == K && kb.size(2) == kc.size(2) && kb.size(3) == hd
              && vb.sizes() == kb.sizes(), "drafter_attention: block K/V shapes do not match q");
  TORCH_CHECK(q.size(2) % kc.size(2) == 0, "drafter_attention: heads % kv heads != 0");
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dt, "drafter_attention", [&] {
    run_drafter<scalar_t>(q, kc, vc, kb, vb, valid, scale, out);
  });
  return out;
}
