// The example model: seeded weights and a batched forward pass (see model.h).
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace decode_loop {
namespace {

// SplitMix64: a tiny, platform-independent generator (std::normal_distribution is not
// specified bit for bit, so it would make weights differ between standard libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                           // Box-Muller
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

std::vector<float> normal_matrix(Rng& rng, int64_t rows, int64_t cols, double stddev) {
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& e : m) e = static_cast<float>(rng.normal() * stddev);
  return m;
}

std::vector<float> gains(Rng& rng, int32_t dim) {
  std::vector<float> g(dim);
  for (float& e : g) e = static_cast<float>(1.0 + 0.1 * rng.normal());
  return g;
}

// Transposes [rows, cols] to [cols, rows]: matmul() reads one output's weights contiguously.
std::vector<float> transpose(const std::vector<float>& m, int32_t rows, int32_t cols) {
  std::vector<float> t(m.size());
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t c = 0; c < cols; ++c) {
      t[static_cast<size_t>(c) * rows + r] = m[static_cast<size_t>(r) * cols + c];
    }
  }
  return t;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void rms_norm(const float* x, const float* g, float* y, int32_t n, int32_t dim, float eps) {
  for (int32_t r = 0; r < n; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* yr = y + static_cast<size_t>(r) * dim;
    double sum = 0.0;
    for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(sum / dim + eps));
    for (int32_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * g[i];
  }
}

ModelConfig llama_preset() { return ModelConfig{}; }

ModelConfig swa_preset() {
  using pagedkv::AttentionKind;
  ModelConfig c;
  c.kind = ModelKind::kSwa;
  c.num_layers = 4;
  c.layer_pattern = {{AttentionKind::kSlidingWindow, 40},
                     {AttentionKind::kSlidingWindow, 12},
                     {AttentionKind::kFull, 0},
                     {AttentionKind::kSlidingWindow, 40}};
  return c;
}

ModelConfig ssm_preset() {
  using pagedkv::AttentionKind;
  ModelConfig c;
  c.kind = ModelKind::kSsm;
  c.num_layers = 4;
  c.layer_pattern = {{AttentionKind::kState, 0},
                     {AttentionKind::kState, 0},
                     {AttentionKind::kFull, 0},
                     {AttentionKind::kState, 0}};
  return c;
}

ModelConfig mla_preset() {
  ModelConfig c;
  c.kind = ModelKind::kMla;
  c.num_layers = 2;
  c.num_q_heads = 8;
  c.kv_lora_rank = 64;
  c.qk_rope_head_dim = 16;
  c.qk_nope_head_dim = 32;
  c.v_head_dim = 32;
  return c;
}

absl::Status validate(const ModelConfig& c) {
  if (c.mla()) {
    for (const auto& [name, value] :
         {std::pair<const char*, int32_t>{"kv_lora_rank", c.kv_lora_rank},
          {"qk_nope_head_dim", c.qk_nope_head_dim},
          {"v_head_dim", c.v_head_dim}}) {
      if (value <= 0 || value % 8 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("model: ", name, " ", value, " must be a positive multiple of 8"));
      }
    }
    if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("model: qk_rope_head_dim ", c.qk_rope_head_dim,
                                                     " must be positive and even"));
    }
    if (c.num_q_heads <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: num_q_heads ", c.num_q_heads, " must be > 0"));
    }
  } else {
    if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: head_dim ", c.head_dim, " must be 64, 128 or 256"));
    }
    if (c.num_kv_heads <= 0 || c.num_q_heads <= 0 || c.num_q_heads % c.num_kv_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: num_q_heads ", c.num_q_heads,
                       " must be a positive multiple of num_kv_heads ", c.num_kv_heads));
    }
  }
  for (const auto& [name, value] : {std::pair<const char*, int32_t>{"d_model", c.d_model},
                                    {"ffn_dim", c.ffn_dim},
                                    {"vocab_size", c.vocab_size}}) {
    if (value <= 0 || value % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: ", name, " ", value, " must be a positive multiple of 8"));
    }
  }
  if (c.num_layers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: num_layers ", c.num_layers, " must be > 0"));
  }
  for (size_t i = 0; i < c.layer_pattern.size(); ++i) {
    const LayerAttention& a = c.layer_pattern[i];
    const bool windowed = a.kind == pagedkv::AttentionKind::kSlidingWindow ||
                          a.kind == pagedkv::AttentionKind::kChunkedLocal;
    if (windowed ? a.window <= 0 : a.window != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: layer pattern ", i, " (", pagedkv::attention_kind_name(a.kind),
                       ") has window ", a.window, windowed ? "; must be > 0" : "; must be 0"));
    }
    if (a.kind != pagedkv::AttentionKind::kFull && c.mla()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: layer pattern ", i, ": MLA layers here are full attention only"));
    }
    if (a.kind == pagedkv::AttentionKind::kState && (c.conv_kernel < 2 || c.conv_kernel > 8)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: conv_kernel ", c.conv_kernel, " outside [2, 8]"));
    }
  }
  return absl::OkStatus();
}

std::string describe_layers(const ModelConfig& c) {
  std::vector<std::pair<LayerAttention, int32_t>> counts;  // in order of first appearance
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerAttention a = c.attention(l);
    auto it =
        std::find_if(counts.begin(), counts.end(), [&](const auto& e) { return e.first == a; });
    if (it == counts.end()) {
      counts.emplace_back(a, 1);
    } else {
      ++it->second;
    }
  }
  std::string out = absl::StrCat(c.num_layers, c.mla() ? " MLA layers:" : " layers:");
  for (size_t i = 0; i < counts.size(); ++i) {
    const auto& [a, n] = counts[i];
    absl::StrAppend(&out, i == 0 ? " " : ", ", n, " ");
    if (a.kind == pagedkv::AttentionKind::kFull) {
      absl::StrAppend(&out, "full");
    } else if (a.kind == pagedkv::AttentionKind::kState) {
      absl::StrAppend(&out, "state-space");
    } else {
      absl::StrAppend(
          &out,
          a.kind == pagedkv::AttentionKind::kSlidingWindow ? "sliding window " : "chunked local ",
          a.window);
    }
  }
  return out;
}

Model::Model(const ModelConfig& config) : config_(config) {
  const ModelConfig& c = config_;
  Rng rng(c.seed * 0x2545F4914F6CDD1Dull + 17);
  const double d_std = 1.0 / std::sqrt(static_cast<double>(c.d_model));
  embedding_ = normal_matrix(rng, c.vocab_size, c.d_model, 1.0);
  // The output projection and the MLP, the same in attention and state layers.
  const auto init_output_and_mlp = [&](Layer& layer) {
    const int32_t out_dim = c.attn_out_dim();
    layer.wo = transpose(
        normal_matrix(rng, out_dim, c.d_model, 1.0 / std::sqrt(static_cast<double>(out_dim))),
        out_dim, c.d_model);
    layer.mlp_norm = gains(rng, c.d_model);
    layer.w1 = transpose(normal_matrix(rng, c.d_model, c.ffn_dim, d_std), c.d_model, c.ffn_dim);
    layer.w3 = transpose(normal_matrix(rng, c.d_model, c.ffn_dim, d_std), c.d_model, c.ffn_dim);
    layer.w2 = transpose(
        normal_matrix(rng, c.ffn_dim, c.d_model, 1.0 / std::sqrt(static_cast<double>(c.ffn_dim))),
        c.ffn_dim, c.d_model);
  };
  // A state layer's decays spread over channels from ~0.88 to ~0.999 (biases 2 to 7):
  // some channels forget within tokens, some remember hundreds, so a wrong state shows in
  // the logits long after.
  const auto init_state_layer = [&](Layer& layer) {
    const int32_t ch = c.state_channels();
    layer.w_in = transpose(normal_matrix(rng, c.d_model, ch, 2.0 * d_std), c.d_model, ch);
    layer.w_decay = transpose(normal_matrix(rng, c.d_model, ch, 0.5 * d_std), c.d_model, ch);
    layer.decay_bias.resize(ch);
    for (float& b : layer.decay_bias) b = static_cast<float>(2.0 + 5.0 * rng.uniform());
    layer.w_gate = transpose(normal_matrix(rng, c.d_model, ch, d_std), c.d_model, ch);
    layer.conv = normal_matrix(rng, c.conv_kernel, ch, 1.0 / std::sqrt(c.conv_kernel));
  };
  for (int32_t l = 0; l < c.num_layers; ++l) {
    Layer layer;
    layer.attn_norm = gains(rng, c.d_model);
    if (c.is_state_layer(l)) {
      init_state_layer(layer);
      init_output_and_mlp(layer);
      layers_.push_back(std::move(layer));
      continue;
    }
    // Queries and keys get a larger scale so that attention is selective, not uniform.
    layer.wq =
        transpose(normal_matrix(rng, c.d_model, c.q_dim(), 2.0 * d_std), c.d_model, c.q_dim());
    if (c.mla()) {
      // W_DKV gives the latent and k_pe; the latent is normalized, and W_UK / W_UV give
      // keys and values of the GQA model's scales (std 2 and 1).
      const int32_t rank = c.kv_lora_rank;
      const double rank_std = 1.0 / std::sqrt(static_cast<double>(rank));
      layer.wk = transpose(normal_matrix(rng, c.d_model, c.latent_dim(), 2.0 * d_std), c.d_model,
                           c.latent_dim());
      layer.kv_norm = gains(rng, rank);
      // matmul's transposed form, [out, in] per head.
      layer.w_uk =
          normal_matrix(rng, int64_t{c.num_q_heads} * c.qk_nope_head_dim, rank, 2.0 * rank_std);
      layer.w_uv = normal_matrix(rng, int64_t{c.num_q_heads} * c.v_head_dim, rank, rank_std);
      const auto head_size = static_cast<ptrdiff_t>(c.qk_nope_head_dim) * rank;
      for (int32_t h = 0; h < c.num_q_heads; ++h) {
        const std::vector<float> head(layer.w_uk.begin() + h * head_size,
                                      layer.w_uk.begin() + (h + 1) * head_size);
        const std::vector<float> t = transpose(head, c.qk_nope_head_dim, rank);
        layer.w_uk_t.insert(layer.w_uk_t.end(), t.begin(), t.end());
      }
    } else {
      layer.wk =
          transpose(normal_matrix(rng, c.d_model, c.kv_dim(), 2.0 * d_std), c.d_model, c.kv_dim());
      layer.wv = transpose(normal_matrix(rng, c.d_model, c.kv_dim(), d_std), c.d_model, c.kv_dim());
    }
    init_output_and_mlp(layer);
    layers_.push_back(std::move(layer));
  }
  final_norm_ = gains(rng, c.d_model);
  w_out_ = transpose(normal_matrix(rng, c.d_model, c.vocab_size, c.logit_scale * d_std), c.d_model,
                     c.vocab_size);
  init_rope();
}

void Model::init_rope() {
  const int32_t rope_dim = config_.rope_dim();
  inv_freq_.resize(rope_dim / 2);
  for (int32_t i = 0; i < rope_dim / 2; ++i) {
    inv_freq_[i] = static_cast<float>(std::pow(static_cast<double>(config_.rope_theta),
                                               -2.0 * i / static_cast<double>(rope_dim)));
  }
}

absl::StatusOr<Model> Model::with_weights(const ModelConfig& c, Weights weights) {
  if (absl::Status s = validate(c); !s.ok()) return s;
  if (c.kind != ModelKind::kLlama || !c.layer_pattern.empty()) {
    return absl::InvalidArgumentError("model weights: only full-attention GQA layers (llama)");
  }
  if (std::ssize(weights.layers) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("model weights: ", weights.layers.size(),
                                                   " layers, the config has ", c.num_layers));
  }
  // Each tensor's element count, as the config gives it.
  const auto check = [](const std::string& name, const std::vector<float>& t, int64_t rows,
                        int64_t cols) -> absl::Status {
    if (std::ssize(t) != rows * cols) {
      return absl::InvalidArgumentError(absl::StrCat("model weights: ", name, " holds ", t.size(),
                                                     " values, the config gives [", rows, ", ",
                                                     cols, "]"));
    }
    return absl::OkStatus();
  };
  const int64_t d = c.d_model;
  for (const auto& [name, t, rows, cols] :
       {std::tuple<const char*, const std::vector<float>&, int64_t, int64_t>{
            "embedding", weights.embedding, c.vocab_size, d},
        {"final_norm", weights.final_norm, 1, d},
        {"w_out", weights.w_out, c.vocab_size, d}}) {
    if (absl::Status s = check(name, t, rows, cols); !s.ok()) return s;
  }
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    for (const auto& [name, t, rows, cols] :
         {std::tuple<const char*, const std::vector<float>&, int64_t, int64_t>{"attn_norm",
                                                                               w.attn_norm, 1, d},
          {"wq", w.wq, c.q_dim(), d},
          {"wk", w.wk, c.kv_dim(), d},
          {"wv", w.wv, c.kv_dim(), d},
          {"wo", w.wo, d, c.attn_out_dim()},
          {"mlp_norm", w.mlp_norm, 1, d},
          {"w1", w.w1, c.ffn_dim, d},
          {"w3", w.w3, c.ffn_dim, d},
          {"w2", w.w2, d, c.ffn_dim}}) {
      if (absl::Status s = check(absl::StrCat("layer ", l, " ", name), t, rows, cols); !s.ok()) {
        return s;
      }
    }
  }
  Model m;
  m.config_ = c;
  m.embedding_ = std::move(weights.embedding);
  m.final_norm_ = std::move(weights.final_norm);
  m.w_out_ = std::move(weights.w_out);
  for (LayerWeights& w : weights.layers) {
    Layer layer;
    layer.attn_norm = std::move(w.attn_norm);
    layer.wq = std::move(w.wq);
    layer.wk = std::move(w.wk);
    layer.wv = std::move(w.wv);
    layer.wo = std::move(w.wo);
    layer.mlp_norm = std::move(w.mlp_norm);
    layer.w1 = std::move(w.w1);
    layer.w3 = std::move(w.w3);
    layer.w2 = std::move(w.w2);
    m.layers_.push_back(std::move(layer));
  }
  m.init_rope();
  return m;
}

int64_t macs_per_token(const ModelConfig& c) {
  // MLA: W_DKV gives one latent and no separate V; absorbing queries and applying W_UV
  // per head are counted with attention. A state layer: input, decay and gate.
  const int64_t kv_proj = c.mla() ? c.latent_dim() : 2 * c.kv_dim();
  const int64_t common = int64_t{c.attn_out_dim()} * c.d_model + int64_t{3} * c.d_model * c.ffn_dim;
  int64_t macs = int64_t{c.d_model} * c.vocab_size;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    macs += common + int64_t{c.d_model} *
                         (c.is_state_layer(l) ? 3 * c.state_channels() : c.q_dim() + kv_proj);
  }
  return macs;
}

// Rotary embedding, rotate-half form (Llama): dims i and i + rope_dim / 2 of the rotated
// part form a pair rotated by position * inv_freq[i]. The angle is computed in double so
// both paths agree.
void Model::rope(float* x, int32_t num_heads, int32_t head_stride, int32_t offset,
                 std::span<const int32_t> positions) const {
  const int32_t half = config_.rope_dim() / 2;
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq_[i];
      const auto cs = static_cast<float>(std::cos(angle));
      const auto sn = static_cast<float>(std::sin(angle));
      for (int32_t h = 0; h < num_heads; ++h) {
        float* row = x + (t * num_heads + h) * head_stride + offset;
        const float a = row[i];
        const float b = row[i + half];
        row[i] = a * cs - b * sn;
        row[i + half] = b * cs + a * sn;
      }
    }
  }
}

// Each (token, head) row is multiplied on its own, so the result never depends on the
// batch.
void Model::mla_absorb_queries(int32_t layer, const float* q, int32_t n, float* q_abs) const {
  const ModelConfig& c = config_;
  const Layer& w = layers_[layer];
  const int32_t nope = c.qk_nope_head_dim, rank = c.kv_lora_rank, qk = c.qk_head_dim();
  for (int32_t r = 0; r < n * c.num_q_heads; ++r) {
    const int32_t h = r % c.num_q_heads;
    const float* qh = q + static_cast<size_t>(r) * qk;
    float* out = q_abs + static_cast<size_t>(r) * c.latent_dim();
    matmul(qh, w.w_uk_t.data() + static_cast<size_t>(h) * rank * nope, out, 1, nope, rank);
    std::copy_n(qh + nope, c.qk_rope_head_dim, out + rank);
  }
}

void Model::mla_apply_values(int32_t layer, const float* out_latent, int32_t n, float* out) const {
  const ModelConfig& c = config_;
  const Layer& w = layers_[layer];
  const int32_t rank = c.kv_lora_rank, vd = c.v_head_dim;
  for (int32_t r = 0; r < n * c.num_q_heads; ++r) {
    const int32_t h = r % c.num_q_heads;
    matmul(out_latent + static_cast<size_t>(r) * rank,
           w.w_uv.data() + static_cast<size_t>(h) * vd * rank, out + static_cast<size_t>(r) * vd, 1,
           rank, vd);
  }
}

void Model::mla_expand(int32_t layer, const float* latents, int32_t n, float* k, float* v) const {
  const ModelConfig& c = config_;
  const Layer& w = layers_[layer];
  const int32_t nope = c.qk_nope_head_dim, rank = c.kv_lora_rank, qk = c.qk_head_dim();
  const int32_t vd = c.v_head_dim;
  for (int32_t r = 0; r < n * c.num_q_heads; ++r) {
    const int32_t h = r % c.num_q_heads;
    const float* latent = latents + static_cast<size_t>(r / c.num_q_heads) * c.latent_dim();
    matmul(latent, w.w_uk.data() + static_cast<size_t>(h) * nope * rank,
           k + static_cast<size_t>(r) * qk, 1, rank, nope);
    std::copy_n(latent + rank, c.qk_rope_head_dim, k + static_cast<size_t>(r) * qk + nope);
    matmul(latent, w.w_uv.data() + static_cast<size_t>(h) * vd * rank,
           v + static_cast<size_t>(r) * vd, 1, rank, vd);
  }
}

void Model::scan_token(int32_t layer, const float* input, const float* decay, float* conv_state,
                       float* recurrent_state, float* out) const {
  const int32_t ch = config_.state_channels();
  const int32_t taps = config_.conv_kernel;
  const float* w = layers_[layer].conv.data();
  for (int32_t c = 0; c < ch; ++c) {
    float conv = w[static_cast<size_t>(taps - 1) * ch + c] * input[c];
    for (int32_t i = 0; i < taps - 1; ++i) {
      conv += w[static_cast<size_t>(i) * ch + c] * conv_state[static_cast<size_t>(i) * ch + c];
    }
    for (int32_t i = 0; i + 1 < taps - 1; ++i) {
      conv_state[static_cast<size_t>(i) * ch + c] = conv_state[static_cast<size_t>(i + 1) * ch + c];
    }
    conv_state[static_cast<size_t>(taps - 2) * ch + c] = input[c];
    recurrent_state[c] = decay[c] * recurrent_state[c] + (1.0f - decay[c]) * silu(conv);
    out[c] = recurrent_state[c];
  }
}

// A state layer: input, decay and gate projections, the caller's scan, the gate.
absl::Status Model::state_mixer(int32_t l, int32_t n, const ScanFn& scan, Workspace* ws) const {
  const ModelConfig& c = config_;
  const Layer& layer = layers_[l];
  const int32_t ch = c.state_channels();
  const auto size = static_cast<size_t>(n) * ch;
  ws->decay.resize(size);
  ws->gate.resize(size);
  matmul(ws->xn.data(), layer.w_in.data(), ws->q.data(), n, c.d_model, ch);
  matmul(ws->xn.data(), layer.w_decay.data(), ws->decay.data(), n, c.d_model, ch);
  matmul(ws->xn.data(), layer.w_gate.data(), ws->gate.data(), n, c.d_model, ch);
  for (size_t i = 0; i < size; ++i) ws->decay[i] = sigmoid(ws->decay[i] + layer.decay_bias[i % ch]);
  if (!scan) return absl::InternalError(absl::StrCat("forward: layer ", l, " needs a scan"));
  const absl::Status status = scan({.layer = l,
                                    .num_tokens = n,
                                    .input = ws->q.data(),
                                    .decay = ws->decay.data(),
                                    .out = ws->attn.data()});
  if (!status.ok()) return status;
  for (size_t i = 0; i < size; ++i) ws->attn[i] *= silu(ws->gate[i]);
  return absl::OkStatus();
}

// An attention layer: q, k, v (or the latents), RoPE, the caller's attention.
absl::Status Model::attention_mixer(int32_t l, int32_t n, std::span<const int32_t> positions,
                                    const AttentionFn& attend, Workspace* ws) const {
  const ModelConfig& c = config_;
  const Layer& layer = layers_[l];
  matmul(ws->xn.data(), layer.wq.data(), ws->q.data(), n, c.d_model, c.q_dim());
  matmul(ws->xn.data(), layer.wk.data(), ws->k.data(), n, c.d_model, c.kv_dim());
  if (c.mla()) {
    // The latent part of each row normalized (DeepSeek's kv_a_layernorm); RoPE on the
    // rope parts of q and of the latent row (k_pe, shared by every head).
    for (int32_t t = 0; t < n; ++t) {
      float* latent = ws->k.data() + static_cast<size_t>(t) * c.latent_dim();
      rms_norm(latent, layer.kv_norm.data(), latent, 1, c.kv_lora_rank, c.rms_eps);
    }
    rope(ws->q.data(), c.num_q_heads, c.qk_head_dim(), c.qk_nope_head_dim, positions);
    rope(ws->k.data(), 1, c.latent_dim(), c.kv_lora_rank, positions);
  } else {
    matmul(ws->xn.data(), layer.wv.data(), ws->v.data(), n, c.d_model, c.kv_dim());
    rope(ws->q.data(), c.num_q_heads, c.head_dim, 0, positions);
    rope(ws->k.data(), c.num_kv_heads, c.head_dim, 0, positions);
  }
  return attend({.layer = l,
                 .num_tokens = n,
                 .q = ws->q.data(),
                 .k = ws->k.data(),
                 .v = c.mla() ? nullptr : ws->v.data(),
                 .out = ws->attn.data()});
}

absl::Status Model::forward(std::span<const TokenId> tokens, std::span<const int32_t> positions,
                            const AttentionFn& attend, const ScanFn& scan,
                            std::span<const int32_t> logit_rows, std::vector<float>* logits,
                            Workspace* ws) const {
  const ModelConfig& c = config_;
  const auto n = static_cast<int32_t>(tokens.size());
  if (positions.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward: ", tokens.size(), " tokens but ", positions.size(), " positions"));
  }
  if (n == 0) return absl::OkStatus();
  const auto rows = static_cast<size_t>(n);
  ws->x.resize(rows * c.d_model);
  ws->xn.resize(rows * c.d_model);
  ws->q.resize(rows * std::max(c.q_dim(), c.state_channels()));
  ws->k.resize(rows * c.kv_dim());
  ws->v.resize(c.mla() ? 0 : rows * c.kv_dim());
  ws->attn.resize(rows * c.attn_out_dim());
  ws->proj.resize(rows * c.d_model);
  ws->h1.resize(rows * c.ffn_dim);
  ws->h3.resize(rows * c.ffn_dim);
  for (int32_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forward: token ", tokens[t], " at row ", t,
                                                     " outside the vocabulary of ", c.vocab_size));
    }
    std::copy_n(embedding_.begin() + static_cast<ptrdiff_t>(tokens[t]) * c.d_model, c.d_model,
                ws->x.begin() + static_cast<ptrdiff_t>(t) * c.d_model);
  }
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const Layer& layer = layers_[l];
    rms_norm(ws->x.data(), layer.attn_norm.data(), ws->xn.data(), n, c.d_model, c.rms_eps);
    const absl::Status status = c.is_state_layer(l) ? state_mixer(l, n, scan, ws)
                                                    : attention_mixer(l, n, positions, attend, ws);
    if (!status.ok()) return status;
    matmul(ws->attn.data(), layer.wo.data(), ws->proj.data(), n, c.attn_out_dim(), c.d_model);
    for (size_t i = 0; i < ws->x.size(); ++i) ws->x[i] += ws->proj[i];
    rms_norm(ws->x.data(), layer.mlp_norm.data(), ws->xn.data(), n, c.d_model, c.rms_eps);
    matmul(ws->xn.data(), layer.w1.data(), ws->h1.data(), n, c.d_model, c.ffn_dim);
    matmul(ws->xn.data(), layer.w3.data(), ws->h3.data(), n, c.d_model, c.ffn_dim);
    for (size_t i = 0; i < ws->h1.size(); ++i) ws->h1[i] = silu(ws->h1[i]) * ws->h3[i];
    matmul(ws->h1.data(), layer.w2.data(), ws->proj.data(), n, c.ffn_dim, c.d_model);
    for (size_t i = 0; i < ws->x.size(); ++i) ws->x[i] += ws->proj[i];
  }
  const auto num_logits = static_cast<int32_t>(logit_rows.size());
  ws->logits_in.resize(static_cast<size_t>(num_logits) * c.d_model);
  for (int32_t i = 0; i < num_logits; ++i) {
    const int32_t r = logit_rows[i];
    if (r < 0 || r >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward: logit row ", r, " outside the batch of ", n));
    }
    rms_norm(ws->x.data() + static_cast<size_t>(r) * c.d_model, final_norm_.data(),
             ws->logits_in.data() + static_cast<size_t>(i) * c.d_model, 1, c.d_model, c.rms_eps);
  }
  logits->resize(static_cast<size_t>(num_logits) * c.vocab_size);
  matmul(ws->logits_in.data(), w_out_.data(), logits->data(), num_logits, c.d_model, c.vocab_size);
  return absl::OkStatus();
}

}  // namespace decode_loop
