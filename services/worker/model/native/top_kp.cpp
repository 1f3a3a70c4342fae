// The sampler's top-k / top-p filter of tempered logits rows, one call for a batch.
//
// sampler._kept, per row, without sorting the vocabulary: the tokens within a span
// of the row's maximum are a prefix of the descending order (ties included), so
// once they number at least top_k and hold at least top_p of the mass, every kept
// token is among them and sorting them alone gives the answer; the span (8
// logits) doubles until they do. In Python that is ~10 ops a row (~0.2-0.5 ms a
// row of the default model's 49k vocabulary on the project's 2-core CPU, ~17 ms
// for the 32 rows of a sampled decode step at 32 concurrent requests); here the
// rows run in parallel, in a few vector passes each.
//
// Kept, in descending order of logit (ties: lower token id first): the first
// top_k (0 = all), then of those each token whose preceding mass (the
// distribution renormalised to the top-k set, or the whole row's without top-k)
// is below top_p; the first is always kept. Masses are summed in double, so at
// a top-p boundary deep in a long tail the last tokens, each of negligible mass,
// may fall differently from a float32 running sum.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "vec_exp.h"

namespace {

typedef dspark_f8v f8v;

inline f8v ld8(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

constexpr float kSpan = 8.0f;

// sum of exp(x - mx) over the row (float lanes, double total)
double exp_sum(const float* x, int64_t v, float mx) {
  const int64_t v8 = v / 8 * 8;
  f8v acc = {};
  double total = 0.0;
  for (int64_t i = 0; i < v8; i += 8) {
    acc += exp8(ld8(x + i) - mx);
    if ((i & 1023) == 1016) {  // flush the lanes now and then (float sums stay short)
      for (int j = 0; j < 8; ++j) total += acc[j];
      acc = f8v{};
    }
  }
  for (int j = 0; j < 8; ++j) total += acc[j];
  for (int64_t i = v8; i < v; ++i) total += std::exp(static_cast<double>(x[i] - mx));
  return total;
}

// One row: y gets x at the kept tokens and -inf elsewhere (y null: not written).
// Returns how many tokens were kept, cand[0..n) in descending order, or -1 when
// the row is kept whole (no filter, or no distribution: a NaN or an all -inf
// row; y is then a copy of x).
int64_t filter_row(const float* x, float* y, int64_t v, int64_t top_k, double top_p,
                   std::vector<int32_t>& cand) {
  if (top_k <= 0 || top_k >= v) top_k = 0;
  if (!top_k && top_p >= 1.0) {
    if (y) std::memcpy(y, x, v * sizeof(float));
    return -1;
  }
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t v8 = v / 8 * 8;
  f8v m = f8v{} - inf;
  dspark_i8v nan = {};
  for (int64_t i = 0; i < v8; i += 8) {
    const f8v a = ld8(x + i);
    nan |= (a != a);
    m = a > m ? a : m;
  }
  float mx = -inf;
  bool has_nan = false;
  for (int j = 0; j < 8; ++j) {
    mx = std::max(mx, m[j]);
    has_nan |= nan[j] != 0;
  }
  for (int64_t i = v8; i < v; ++i) {
    has_nan |= x[i] != x[i];
    mx = std::max(mx, x[i]);
  }
  // a NaN row has no distribution to filter, and in a row of -inf nothing has
  // mass: either is left as it is
  if (has_nan || mx == -inf) {
    if (y) std::memcpy(y, x, v * sizeof(float));
    return -1;
  }
  const bool need_mass = !top_k && top_p < 1.0;
  const double total = need_mass ? exp_sum(x, v, mx) : 0.0;
  const int64_t need = top_k ? top_k : 1;
  float span = kSpan;
  while (true) {
    cand.clear();
    const float floor = mx - span;
    for (int64_t i = 0; i < v; ++i)
      if (x[i] >= floor) cand.push_back(static_cast<int32_t>(i));
    bool enough = static_cast<int64_t>(cand.size()) >= need;
    if (enough && need_mass) {
      double mass = 0.0;
      for (int32_t i : cand) mass += std::exp(static_cast<double>(x[i] - mx));
      enough = mass >= top_p * total;
    }
    if (enough || static_cast<int64_t>(cand.size()) == v) break;
    span = span < 1e4f ? span * 2 : std::numeric_limits<float>::infinity();
  }
  // descending by logit, ties by token id (cand is in id order: a stable sort)
  std::stable_sort(cand.begin(), cand.end(), [x](int32_t a, int32_t b) { return x[a] > x[b]; });
  int64_t n = static_cast<int64_t>(cand.size());
  if (top_k) n = std::min(n, top_k);
  if (top_p < 1.0) {
    // the mass of each token under the distribution it is cut from
    double denom = total;
    if (top_k) {
      denom = 0.0;
      for (int64_t j = 0; j < n; ++j) denom += std::exp(static_cast<double>(x[cand[j]] - mx));
    }
    double before = 0.0;
    int64_t kept = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (before >= top_p) break;  // before is non-decreasing
      ++kept;
      before += std::exp(static_cast<double>(x[cand[j]] - mx)) / denom;
    }
    n = std::max<int64_t>(1, kept);
  }
  if (y) {
    std::fill(y, y + v, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n; ++j) y[cand[j]] = x[cand[j]];
  }
  return n;
}

// A sampled row (plain sampling, a bonus row, a draft position): x / temp,
// filtered; y = its softmax over the kept tokens; the token by inverse CDF at u (the first token, in id order, whose running
// sum passes u * total; never one without mass) and its probability.
void sample_row(const float* x, float* y, int64_t v, float temp, int64_t top_k,
                double top_p, double u, std::vector<int32_t>& cand,
                std::vector<float>& scaled, int64_t* tok, float* p_tok) {
  scaled.resize(v);
  for (int64_t i = 0; i < v; ++i) scaled[i] = x[i] / temp;
  const int64_t n = filter_row(scaled.data(), nullptr, v, top_k, top_p, cand);
  if (n < 0) {  // the whole row: a softmax over every token (-inf: no mass)
    const float inf = std::numeric_limits<float>::infinity();
    const float* s = scaled.data();
    float mx = -inf;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, s[i]);
    const int64_t v8 = v / 8 * 8;
    double total = 0.0;
    f8v acc = {};
    for (int64_t i = 0; i < v8; i += 8) {
      const f8v a = ld8(s + i);
      const f8v e = a == -inf ? f8v{} : exp8(a - mx);
      std::memcpy(y + i, &e, sizeof(e));
      acc += e;
      if ((i & 1023) == 1016) {
        for (int j = 0; j < 8; ++j) total += acc[j];
        acc = f8v{};
      }
    }
    for (int j = 0; j < 8; ++j) total += acc[j];
    for (int64_t i = v8; i < v; ++i) {
      y[i] = s[i] == -inf ? 0.f : std::exp(s[i] - mx);
      total += y[i];
    }
    if (!(total > 0.0) || !std::isfinite(total)) {  // no distribution (NaN, all -inf)
      std::fill(y, y + v, 0.f);
      *tok = 0;
      *p_tok = 0.f;
      return;
    }
    const float inv = static_cast<float>(1.0 / total);
    for (int64_t i = 0; i < v; ++i) y[i] *= inv;
    cand.resize(v);
    for (int64_t i = 0; i < v; ++i) cand[i] = static_cast<int32_t>(i);
  } else {  // the kept tokens only, in id order for the CDF
    cand.resize(n);
    const float mx = scaled[cand[0]];
    std::sort(cand.begin(), cand.end());
    double total = 0.0;
    for (int32_t i : cand) total += std::exp(static_cast<double>(scaled[i] - mx));
    std::fill(y, y + v, 0.f);
    for (int32_t i : cand)
      y[i] = static_cast<float>(std::exp(static_cast<double>(scaled[i] - mx)) / total);
  }
  double total = 0.0;
  for (int32_t i : cand) total += y[i];
  const double target = u * total;
  double run = 0.0;
  int64_t pick = -1, last = -1;
  for (int32_t i : cand) {
    if (y[i] <= 0.f) continue;
    last = i;
    run += y[i];
    if (run > target) {
      pick = i;
      break;
    }
  }
  if (pick < 0) pick = last >= 0 ? last : 0;  // u * total rounded up to the total
  *tok = pick;
  *p_tok = y[pick];
}

}  // namespace

// x [N, V] float32 tempered logits, top_k [N] int64 (0 or >= V: none), top_p [N]
// float64 (>= 1: none) -> [N, V]: each row's kept tokens keep their logit, the
// rest are -inf (rows with neither filter are copied).
torch::Tensor top_kp_filter(torch::Tensor x, torch::Tensor top_k, torch::Tensor top_p) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "top_kp_filter: x [N, V] contiguous float32");
  TORCH_CHECK(x.size(1) < (int64_t{1} << 31), "top_kp_filter: V must be < 2^31");
  const int64_t n = x.size(0), v = x.size(1);
  TORCH_CHECK(top_k.dim() == 1 && top_k.size(0) == n && top_k.scalar_type() == at::kLong &&
                  top_k.is_contiguous(),
              "top_kp_filter: top_k [N] int64");
  TORCH_CHECK(top_p.dim() == 1 && top_p.size(0) == n && top_p.scalar_type() == at::kDouble &&
                  top_p.is_contiguous(),
              "top_kp_filter: top_p [N] float64");
  auto y = torch::empty_like(x);
  if (n == 0 || v == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t* kp = top_k.data_ptr<int64_t>();
  const double* pp = top_p.data_ptr<double>();
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<int32_t> cand;
    cand.reserve(1024);
    for (int64_t r = lo; r < hi; ++r) filter_row(xp + r * v, yp + r * v, v, kp[r], pp[r], cand);
  });
  return y;
}

// Sampling for a batch of rows (sampler.native_sample): x [N, V] float32 logits,
// temperature [N] (> 0), top_k [N] int64 (0 or >= V: none), top_p [N] float64
// (>= 1: none), u [N] float64 in (0, 1) -> (probs [N, V] float32: the
// distribution each row draws from, tokens [N] int64, p(token) [N] float32).
std::vector<torch::Tensor> sample_rows(torch::Tensor x, torch::Tensor temperature,
                                       torch::Tensor top_k, torch::Tensor top_p,
                                       torch::Tensor u) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "sample_rows: x [N, V] contiguous float32");
  TORCH_CHECK(x.size(1) > 0 && x.size(1) < (int64_t{1} << 31), "sample_rows: 0 < V < 2^31");
  const int64_t n = x.size(0), v = x.size(1);
  for (const auto& [t, dt, name] :
       {std::tuple{&temperature, at::kDouble, "temperature"}, std::tuple{&top_k, at::kLong, "top_k"},
        std::tuple{&top_p, at::kDouble, "top_p"}, std::tuple{&u, at::kDouble, "u"}})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == n && t->scalar_type() == dt && t->is_contiguous(),
                "sample_rows: ", name, " [N] of ", c10::toString(dt));
  auto probs = torch::empty_like(x);
  auto tokens = torch::empty({n}, x.options().dtype(at::kLong));
  auto p_tok = torch::empty({n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = probs.data_ptr<float>();
  const double* tp = temperature.data_ptr<double>();
  const int64_t* kp = top_k.data_ptr<int64_t>();
  const double* pp = top_p.data_ptr<double>();
  const double* up = u.data_ptr<double>();
  int64_t* op = tokens.data_ptr<int64_t>();
  float* qp = p_tok.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    TORCH_CHECK(tp[r] > 0.0, "sample_rows: temperature must be > 0 (row ", r, ")");
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    std::vector<int32_t> cand;
    std::vector<float> scaled;
    cand.reserve(1024);
    for (int64_t r = lo; r < hi; ++r)
      sample_row(xp + r * v, yp + r * v, v, static_cast<float>(tp[r]), kp[r], pp[r], up[r],
                 cand, scaled, op + r, qp + r);
  });
  return {probs, tokens, p_tok};
}
