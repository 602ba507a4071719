// File: examples/decode_loop/model.h
//
// A small decoder-only transformer in the Llama layout, with weights drawn from a seeded
// generator so that every run is reproducible without a download:
//
//   embedding -> N x [RMSNorm -> attention (RoPE, grouped-query heads) -> residual
//                     RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> output projection
//
// The model computes everything except attention itself. forward() calls back into the
// caller once per layer with the new tokens' q, k and v, and the caller decides where K/V
// live: the paged engine writes them into the paged KV cache and runs the library's
// kernels; the dense reference keeps them in plain arrays and attends over all of them.
//
// Determinism: every row of every projection is computed by the same loop in the same
// order, whatever the batch holds, so a token's activations do not depend on which other
// tokens share its batch. Only attention differs between the paged and dense paths.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_MODEL_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_MODEL_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "pagedkv/types.h"

namespace decode_loop {

using pagedkv::TokenId;

struct ModelConfig {
  int32_t vocab_size = 1024;
  int32_t d_model = 256;
  int32_t num_layers = 2;
  int32_t num_q_heads = 8;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 64;
  int32_t ffn_dim = 768;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  float logit_scale = 4.0f;  // std of the logits; large enough that sampling is peaked
  uint64_t seed = 1;

  int32_t q_dim() const { return num_q_heads * head_dim; }
  int32_t kv_dim() const { return num_kv_heads * head_dim; }
};

// The activations of one layer's attention for a batch of n new tokens, row-major:
//   q   [n, num_q_heads, head_dim]   after RoPE
//   k   [n, num_kv_heads, head_dim]  after RoPE
//   v   [n, num_kv_heads, head_dim]
//   out [n, num_q_heads, head_dim]   written by the callback
struct AttentionIo {
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
};

using AttentionFn = std::function<absl::Status(const AttentionIo&)>;

// Reusable activation buffers of forward(); one per thread.
struct Workspace {
  std::vector<float> x, xn, q, k, v, attn, proj, h1, h3, logits_in;
};

// Multiply-accumulates of one token's projections (attention excluded), for reports.
int64_t macs_per_token(const ModelConfig& config);

// InvalidArgument naming the first size that the model or the library's kernels cannot
// take (head_dim 64/128/256, heads divisible, dimensions multiples of 8).
absl::Status validate(const ModelConfig& config);

class Model {
 public:
  // `config` must pass validate().
  explicit Model(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }

  // Runs the model over `tokens` at `positions` (both [n]). `attend` is called once per
  // layer. For each index r in `logit_rows` (rows of the batch, ascending or not), writes
  // vocab_size logits to (*logits)[i * vocab_size ...] where i is r's index in logit_rows.
  absl::Status forward(std::span<const TokenId> tokens, std::span<const int32_t> positions,
                       const AttentionFn& attend, std::span<const int32_t> logit_rows,
                       std::vector<float>* logits, Workspace* ws) const;

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2;
  };

  void rope(float* x, int32_t num_heads, std::span<const int32_t> positions) const;

  ModelConfig config_;
  std::vector<float> embedding_;  // [vocab, d_model]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;  // [d_model]
  std::vector<float> w_out_;       // [d_model, vocab]
  std::vector<float> inv_freq_;    // [head_dim / 2]
};

// y[n, out] = x[n, in] * W, row-major, with W stored transposed as wt [out, in] so that one
// output's weights are contiguous; `in` is a multiple of 8. Each output element sums its
// products in one fixed order (8 strided partial sums, then a fixed tree), whatever n is:
// batching never changes a row's bits.
void matmul(const float* x, const float* wt, float* y, int32_t n, int32_t in, int32_t out);

// Row-wise RMSNorm with a gain: y = x / sqrt(mean(x^2) + eps) * g.
void rms_norm(const float* x, const float* g, float* y, int32_t n, int32_t dim, float eps);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_MODEL_H_
