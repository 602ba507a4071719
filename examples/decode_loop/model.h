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
// Three presets (--model):
//   llama  every layer full attention, grouped-query heads (the default)
//   swa    a hybrid: layers repeat a pattern of sliding-window and full attention layers
//          (Gemma 3, gpt-oss), each a GQA layer; a layer at position p attends to
//          [first_attended(kind, window, p), p] (layer_group.h)
//   mla    multi-head latent attention (DeepSeek-V2/V3) with small dims: each token's K/V
//          are one latent vector (kv_lora_rank normalized dims + qk_rope_head_dim RoPE
//          dims) from which every head's K and V are up-projected (W_UK, W_UV). The
//          callback gets the latents; mla_absorb_queries() and mla_apply_values() serve an
//          engine that attends over the latents (absorbed), mla_expand() a reference that
//          up-projects them to per-head K/V.
//   ssm    a hybrid of state-space and attention layers (Qwen3-Next's three linear layers
//          per attention layer): a state layer replaces attention by a gated diagonal
//          selective scan over a short causal convolution (scan_token()), whose state per
//          sequence is the last conv_kernel - 1 inputs and one recurrent value per
//          channel. forward() hands a state layer's inputs to the caller's ScanFn, which
//          keeps the states: the paged engine in state slots, the dense reference in a
//          plain array from token 0.
//
// Determinism: every row of every projection is computed by the same loop in the same
// order, whatever the batch holds, so a token's activations do not depend on which other
// tokens share its batch. Only attention differs between the paged and dense paths.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_MODEL_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_MODEL_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/layer_group.h"
#include "pagedkv/types.h"

namespace decode_loop {

using pagedkv::TokenId;

// Which tokens one layer's attention sees (layer_group.h).
struct LayerAttention {
  pagedkv::AttentionKind kind = pagedkv::AttentionKind::kFull;
  int32_t window = 0;  // tokens; > 0 for the windowed kinds, 0 for full attention
  bool operator==(const LayerAttention&) const = default;
};

enum class ModelKind { kLlama, kSwa, kMla, kSsm };

struct ModelConfig {
  ModelKind kind = ModelKind::kLlama;
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
  // Layer l attends as layer_pattern[l % size] (empty: every layer full attention).
  std::vector<LayerAttention> layer_pattern;
  // MLA (kind kMla): num_q_heads heads, each with qk_nope_head_dim + qk_rope_head_dim
  // query / key dims and v_head_dim value dims; one latent of kv_lora_rank +
  // qk_rope_head_dim per token (num_kv_heads and head_dim do not apply).
  int32_t kv_lora_rank = 0;
  int32_t qk_rope_head_dim = 0;
  int32_t qk_nope_head_dim = 0;
  int32_t v_head_dim = 0;
  // State layers (LayerAttention kind kState): the convolution's taps per channel.
  int32_t conv_kernel = 4;

  bool mla() const { return kind == ModelKind::kMla; }
  bool is_state_layer(int32_t layer) const {
    return attention(layer).kind == pagedkv::AttentionKind::kState;
  }
  LayerAttention attention(int32_t layer) const {
    return layer_pattern.empty() ? LayerAttention{}
                                 : layer_pattern[static_cast<size_t>(layer) % layer_pattern.size()];
  }
  // Per head: query / key dims, value dims.
  int32_t qk_head_dim() const { return mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int32_t value_head_dim() const { return mla() ? v_head_dim : head_dim; }
  int32_t q_dim() const { return num_q_heads * qk_head_dim(); }
  int32_t attn_out_dim() const { return num_q_heads * value_head_dim(); }
  // K (or V) elements cached per token and layer: the latent for MLA.
  int32_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  int32_t kv_dim() const { return mla() ? latent_dim() : num_kv_heads * head_dim; }
  // The rotary dims: the whole head, or MLA's rope part.
  int32_t rope_dim() const { return mla() ? qk_rope_head_dim : head_dim; }
  // A state layer's channels (its output feeds the same projection as attention's) and
  // its state per sequence: the conv window, then the recurrent values (fp32 each).
  int32_t state_channels() const { return attn_out_dim(); }
  int64_t conv_state_elements() const { return int64_t{conv_kernel - 1} * state_channels(); }
  int64_t recurrent_state_elements() const { return state_channels(); }
};

// The presets of --model. swa: 4 layers (repeating with --layers) of sliding window 40,
// sliding window 12, full, sliding window 40: two windowed groups beside a full one, one
// window below a 16-token block and one not a multiple of it. mla: 2 layers, 8 heads of
// 32 + 16 query / key dims and 32 value dims, latents of 64 + 16. ssm: 4 layers (repeating
// with --layers) of state, state, full, state; 512 scan channels, conv kernel 4.
ModelConfig llama_preset();
ModelConfig swa_preset();
ModelConfig mla_preset();
ModelConfig ssm_preset();

// The activations of one layer's attention for a batch of n new tokens, row-major:
//   q   [n, num_q_heads, head_dim]   after RoPE
//   k   [n, num_kv_heads, head_dim]  after RoPE
//   v   [n, num_kv_heads, head_dim]
//   out [n, num_q_heads, head_dim]   written by the callback
// For MLA:
//   q   [n, num_q_heads, qk_nope_head_dim + qk_rope_head_dim]  rope part after RoPE
//   k   [n, kv_lora_rank + qk_rope_head_dim]  the latents: normalized c_kv, then k_pe
//                                             after RoPE (one for all heads)
//   v   null
//   out [n, num_q_heads, v_head_dim]
struct AttentionIo {
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
};

using AttentionFn = std::function<absl::Status(const AttentionIo&)>;

// The inputs of one state layer for a batch of n new tokens, row-major [n, state_channels]:
// the scan's input and its per-token decay in (0, 1). The callback runs scan_token() over
// each sequence's rows in order, in that sequence's state, and writes out [n, channels].
struct ScanIo {
  int32_t layer = 0;
  int32_t num_tokens = 0;
  const float* input = nullptr;
  const float* decay = nullptr;
  float* out = nullptr;
};

using ScanFn = std::function<absl::Status(const ScanIo&)>;

// Reusable activation buffers of forward(); one per thread.
struct Workspace {
  std::vector<float> x, xn, q, k, v, attn, proj, h1, h3, logits_in, decay, gate;
};

// Multiply-accumulates of one token's projections (attention excluded), for reports.
int64_t macs_per_token(const ModelConfig& config);

// InvalidArgument naming the first size that the model or the library's kernels cannot
// take (head_dim 64/128/256, heads divisible, dimensions multiples of 8, windows > 0,
// MLA dims positive and multiples of 8, rope dims even, conv_kernel 2-8).
absl::Status validate(const ModelConfig& config);

// "4 layers: 2 sliding window 40, 1 sliding window 12, 1 full" for summaries.
std::string describe_layers(const ModelConfig& config);

class Model {
 public:
  // `config` must pass validate(); the weights are drawn from config.seed.
  explicit Model(const ModelConfig& config);

  // Given weights (a checkpoint's, checkpoint.h) of a model of full-attention GQA layers,
  // each matrix stored [out, in] as torch.nn.Linear stores it: q, k, v and o
  // projections, the SwiGLU gate (w1), up (w3) and down (w2) projections, the RMSNorm
  // gains, the embedding [vocab, d_model] and the output projection [vocab, d_model].
  struct LayerWeights {
    std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2;
  };
  struct Weights {
    std::vector<float> embedding, final_norm, w_out;
    std::vector<LayerWeights> layers;
  };
  // Errors: InvalidArgument when `config` fails validate(), is not one of full-attention
  // GQA layers, or a tensor's size is not the one `config` gives (naming it).
  static absl::StatusOr<Model> with_weights(const ModelConfig& config, Weights weights);

  const ModelConfig& config() const { return config_; }

  // Runs the model over `tokens` at `positions` (both [n]). `attend` is called once per
  // attention layer, `scan` once per state layer (may be empty for a model without). For
  // each index r in `logit_rows` (rows of the batch, ascending or not), writes vocab_size
  // logits to (*logits)[i * vocab_size ...] where i is r's index in logit_rows.
  absl::Status forward(std::span<const TokenId> tokens, std::span<const int32_t> positions,
                       const AttentionFn& attend, const ScanFn& scan,
                       std::span<const int32_t> logit_rows, std::vector<float>* logits,
                       Workspace* ws) const;

  // One token of state layer `layer`'s scan, every channel c: the causal convolution of
  // conv_state's last conv_kernel - 1 inputs and input[c], then
  //   recurrent[c] = decay[c] * recurrent[c] + (1 - decay[c]) * silu(conv)
  //   out[c] = recurrent[c]
  // with conv_state shifted to end at input. The state starts at zero before position 0.
  // The arithmetic of a channel is fixed, so the state after a token is the same bits
  // whoever computes it.
  void scan_token(int32_t layer, const float* input, const float* decay, float* conv_state,
                  float* recurrent_state, float* out) const;

  // MLA, the absorbed form (an engine attending over the cached latents):
  // q_abs [n, num_q_heads, latent_dim()] = per head (q_nope W_UK, q_pe): a query whose dot
  // product with a latent is the head's q . k.
  void mla_absorb_queries(int32_t layer, const float* q, int32_t n, float* q_abs) const;
  // out [n, num_q_heads, v_head_dim] = per head W_UV of the probability-weighted latents
  // out_latent [n, num_q_heads, kv_lora_rank].
  void mla_apply_values(int32_t layer, const float* out_latent, int32_t n, float* out) const;
  // MLA, the full up-projection (the dense reference): per head K = (W_UK c, k_pe)
  // [n, num_q_heads, qk_head_dim()] and V = W_UV c [n, num_q_heads, v_head_dim] of the
  // latents [n, latent_dim()].
  void mla_expand(int32_t layer, const float* latents, int32_t n, float* k, float* v) const;

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2;
    // MLA: wk is W_DKV [latent_dim, d_model] (latent and k_pe), kv_norm the latent's gain,
    // w_uk [num_q_heads][qk_nope][kv_lora_rank], w_uv [num_q_heads][v_head_dim][kv_lora_rank].
    std::vector<float> kv_norm, w_uk, w_uk_t, w_uv;  // w_uk_t: [num_q_heads][kv_lora_rank][qk_nope]
    // A state layer: input, decay and gate projections [channels, d_model] (transposed),
    // the decay's bias and the conv taps [conv_kernel][channels] (wq, wk, wv unused).
    std::vector<float> w_in, w_decay, decay_bias, w_gate, conv;
  };

  // A layer's token mixer, from ws->xn to ws->attn: attention through `attend`, or a
  // state layer's projections, `scan` and gate.
  absl::Status attention_mixer(int32_t layer, int32_t n, std::span<const int32_t> positions,
                               const AttentionFn& attend, Workspace* ws) const;
  absl::Status state_mixer(int32_t layer, int32_t n, const ScanFn& scan, Workspace* ws) const;

  // RoPE on `rows` rows of `num_heads` heads each `head_stride` elements apart, rotating
  // rope_dim() dims from `offset` in each head.
  void rope(float* x, int32_t num_heads, int32_t head_stride, int32_t offset,
            std::span<const int32_t> positions) const;

  Model() = default;  // with_weights()
  void init_rope();

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
