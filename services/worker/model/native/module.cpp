// The Python module of the native CPU kernels (one extension, built by
// dspark.worker.model.native_attention.load).
#include <torch/extension.h>

#include <vector>

void paged_short_attention(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                           torch::Tensor seqs, torch::Tensor tables, double scale,
                           torch::Tensor out);
torch::Tensor rope_write_attention(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin,
                                   torch::Tensor k_pool, torch::Tensor v_pool,
                                   torch::Tensor seqs, torch::Tensor tables, double scale,
                                   int64_t heads, int64_t kv_heads);
torch::Tensor drafter_attention(torch::Tensor q, torch::Tensor kc, torch::Tensor vc,
                                torch::Tensor kb, torch::Tensor vb, torch::Tensor valid,
                                double scale);
torch::Tensor pack_rows_weight(torch::Tensor w);
torch::Tensor linear_rows(torch::Tensor x, torch::Tensor wp, int64_t N);
torch::Tensor linear_gguf(torch::Tensor x, torch::Tensor qp, int64_t N, int64_t kind);
torch::Tensor unpack_gguf_weight(torch::Tensor qp, int64_t N, int64_t K, int64_t kind);
int64_t set_gguf_fused_rows(int64_t n);
torch::Tensor rms_norm_rows(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor add_rms_norm_rows(torch::Tensor x, torch::Tensor add, torch::Tensor w, double eps);
torch::Tensor silu_mul_rows(torch::Tensor gu);
torch::Tensor rope_rows(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t heads);
torch::Tensor argmax_rows(torch::Tensor x);
bool has_linear_bf16();
torch::Tensor pack_bf16_weight(torch::Tensor w);
torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor wp, int64_t N, bool huge_pages);
bool has_markov_bf16();
torch::Tensor top_kp_filter(torch::Tensor x, torch::Tensor top_k, torch::Tensor top_p);
std::vector<torch::Tensor> sample_rows(torch::Tensor x, torch::Tensor temperature,
                                       torch::Tensor top_k, torch::Tensor top_p,
                                       torch::Tensor u);
std::vector<torch::Tensor> markov_greedy(torch::Tensor base, torch::Tensor e0, torch::Tensor w1,
                                         torch::Tensor wp, int64_t n);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_short_attention", &paged_short_attention,
        "attention of short query windows over a paged KV pool (in place into out)");
  m.def("rope_write_attention", &rope_write_attention,
        "a step of short windows: RoPE of qkv's query and key heads, the keys and values"
        " written into the pools, then paged_short_attention -> [T, H * hd]");
  m.def("drafter_attention", &drafter_attention,
        "the drafter's block rows over their visible context rows and their own block"
        " (q, kc, vc, kb, vb, valid, scale) -> out");
  m.def("pack_rows_weight", &pack_rows_weight,
        "w [N, K] fp32 -> [ceil(N / 16), K, 16], the layout linear_rows reads");
  m.def("linear_rows", &linear_rows, "x [M, K] @ w.T from a packed w, fp32 (N outputs)");
  m.def("linear_gguf", &linear_gguf,
        "x [M, K] @ w.T in fp32 from GGUF blocks packed by native_linear.pack_gguf "
        "(N outputs; kind 0 Q4_1, 1 Q8_0): the dense fp32 result, bit for bit");
  m.def("unpack_gguf_weight", &unpack_gguf_weight,
        "a packed GGUF weight's float32 values (qp, N, K, kind) -> [N, K]");
  m.def("set_gguf_fused_rows", &set_gguf_fused_rows,
        "benchmarks: the most rows linear_gguf dequantizes in registers (returns the old)");
  m.def("has_linear_bf16", &has_linear_bf16,
        "whether this build has the AVX512-BF16 linear kernel (linear_bf16)");
  m.def("pack_bf16_weight", &pack_bf16_weight,
        "w [N, K] bf16 -> [ceil(N / 16), K / 2, 16, 2], the layout linear_bf16 reads");
  m.def("linear_bf16", &linear_bf16,
        "x [M, K] @ w.T from a packed w, bf16 (N outputs); huge_pages: the weight is on "
        "2 MiB pages (prefetched into L2 further ahead; else into L1 for 4 KiB pages)",
        py::arg("x"), py::arg("wp"), py::arg("N"), py::arg("huge_pages") = false);
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of each row of x [T, d], fp32");
  m.def("add_rms_norm_rows", &add_rms_norm_rows,
        "x += add in place, then RMSNorm of each row of x [T, d] (fp32 or bf16)");
  m.def("silu_mul_rows", &silu_mul_rows, "[gate | up] [T, 2I] -> silu(gate) * up, fp32");
  m.def("rope_rows", &rope_rows,
        "rotate-half RoPE of the first heads of qkv [T, W] at cos / sin_signed [T, hd]"
        " -> [T, heads, hd], as mul + roll + addcmul");
  m.def("argmax_rows", &argmax_rows, "x [M, N] fp32 or bf16 -> int64 [M], as x.argmax(-1)");
  m.def("has_markov_bf16", &has_markov_bf16,
        "whether this build has the AVX512-BF16 Markov loop (markov_greedy in bf16)");
  m.def("markov_greedy", &markov_greedy,
        "the drafter's greedy Markov loop: (base [B, D, N], e0 [B, R], W1 by slot, packed W2, N)"
        " -> (slots [B, D], W1 rows [B, D, R])");
  m.def("top_kp_filter", &top_kp_filter,
        "the sampler's top-k / top-p filter of tempered logits [N, V] (others set to -inf)");
  m.def("sample_rows", &sample_rows,
        "sampled rows: (logits, temperature, top_k, top_p, u) -> (probs, tokens, p(token))");
}
