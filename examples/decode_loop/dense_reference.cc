// Dense, cache-free reference and fp8 calibration (see dense_reference.h).
#include "dense_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace decode_loop {
namespace {

// The largest finite e4m3 value; calibrated amax maps to half of it.
constexpr float kFp8Max = 448.0f;
constexpr float kFp8Headroom = 2.0f;

// Causal softmax attention over all n tokens: token i attends to tokens
// first_attended(kind, window, i)..i of its layer (all of 0..i for full attention). GQA:
// K/V as the cache holds them, q / out as the kernels take them. MLA: the latents as the
// cache holds them, up-projected to every head's K and V (W_UK, W_UV), and plain
// multi-head attention over those; the engine's absorbed form rounds other values (the
// absorbed queries, the weighted latents) than these, which the reference cannot mirror.
class CausalAttention {
 public:
  CausalAttention(const Model& model, const KvFormat& format)
      : model_(model), c_(model.config()), format_(format) {}

  void operator()(const AttentionIo& io) {
    const int32_t n = io.num_tokens;
    const int32_t qk = c_.qk_head_dim();
    const int32_t vd = c_.value_head_dim();
    const int32_t kv_heads = c_.mla() ? c_.num_q_heads : c_.num_kv_heads;
    const int32_t group = c_.num_q_heads / kv_heads;
    const size_t q_size = static_cast<size_t>(n) * c_.q_dim();
    q_.assign(io.q, io.q + q_size);
    if (c_.mla()) {
      latents_.resize(static_cast<size_t>(n) * c_.latent_dim());
      for (size_t i = 0; i < latents_.size(); ++i)
        latents_[i] = format_.stored_k(io.layer, io.k[i]);
      k_.resize(static_cast<size_t>(n) * kv_heads * qk);
      v_.resize(static_cast<size_t>(n) * kv_heads * vd);
      model_.mla_expand(io.layer, latents_.data(), n, k_.data(), v_.data());
    } else {
      k_.resize(static_cast<size_t>(n) * c_.kv_dim());
      v_.resize(k_.size());
      for (size_t i = 0; i < k_.size(); ++i) {
        k_[i] = format_.stored_k(io.layer, io.k[i]);
        v_[i] = format_.stored_v(io.layer, io.v[i]);
      }
      for (float& x : q_) x = format_.attention_value(x);
    }
    const LayerAttention attention = c_.attention(io.layer);
    const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
    scores_.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      const auto first =
          static_cast<int32_t>(pagedkv::first_attended(attention.kind, attention.window, i));
      for (int32_t h = 0; h < c_.num_q_heads; ++h) {
        const float* q = q_.data() + (static_cast<size_t>(i) * c_.num_q_heads + h) * qk;
        const int32_t kvh = h / group;
        float max = -INFINITY;
        for (int32_t j = first; j <= i; ++j) {
          const float* kj = k_.data() + (static_cast<size_t>(j) * kv_heads + kvh) * qk;
          float dot = 0.0f;
          for (int32_t d = 0; d < qk; ++d) dot += q[d] * kj[d];
          scores_[j] = dot * scale;
          max = std::max(max, scores_[j]);
        }
        float denom = 0.0f;
        for (int32_t j = first; j <= i; ++j) {
          scores_[j] = std::exp(scores_[j] - max);
          denom += scores_[j];
        }
        float* out = io.out + (static_cast<size_t>(i) * c_.num_q_heads + h) * vd;
        std::fill(out, out + vd, 0.0f);
        for (int32_t j = first; j <= i; ++j) {
          const float* vj = v_.data() + (static_cast<size_t>(j) * kv_heads + kvh) * vd;
          const float p = scores_[j] / denom;
          for (int32_t d = 0; d < vd; ++d) out[d] += p * vj[d];
        }
        if (!c_.mla()) {
          for (int32_t d = 0; d < vd; ++d) out[d] = format_.attention_value(out[d]);
        }
      }
    }
  }

 private:
  const Model& model_;
  const ModelConfig& c_;
  const KvFormat& format_;
  std::vector<float> k_, v_, q_, latents_, scores_;
};

// A state layer's scan over the whole sequence from a zero state at token 0, one token
// after another: no checkpoint, restore or copy involved.
absl::Status scan_from_start(const Model& model, const ScanIo& io) {
  const ModelConfig& c = model.config();
  const int32_t ch = c.state_channels();
  std::vector<float> conv(c.conv_state_elements(), 0.0f);
  std::vector<float> recurrent(c.recurrent_state_elements(), 0.0f);
  for (int32_t t = 0; t < io.num_tokens; ++t) {
    const size_t row = static_cast<size_t>(t) * ch;
    model.scan_token(io.layer, io.input + row, io.decay + row, conv.data(), recurrent.data(),
                     io.out + row);
  }
  return absl::OkStatus();
}

std::vector<int32_t> iota(int32_t n, int32_t first = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

}  // namespace

absl::StatusOr<std::vector<float>> dense_logits(const Model& model, std::span<const TokenId> tokens,
                                                int32_t num_rows, const KvFormat& format) {
  const auto n = static_cast<int32_t>(tokens.size());
  if (num_rows < 1 || num_rows > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense_logits: num_rows ", num_rows, " outside [1, ", n, "]"));
  }
  CausalAttention attention(model, format);
  const AttentionFn attend = [&](const AttentionIo& io) {
    attention(io);
    return absl::OkStatus();
  };
  const ScanFn scan = [&](const ScanIo& io) { return scan_from_start(model, io); };
  std::vector<float> logits;
  Workspace ws;
  const absl::Status status =
      model.forward(tokens, iota(n), attend, scan, iota(num_rows, n - num_rows), &logits, &ws);
  if (!status.ok()) return status;
  return logits;
}

absl::StatusOr<KvFormat> calibrate_fp8(const Model& model, std::span<const TokenId> tokens) {
  const ModelConfig& c = model.config();
  if (tokens.empty()) return absl::InvalidArgumentError("calibrate_fp8: no calibration tokens");
  const KvFormat fp32;
  CausalAttention attention(model, fp32);
  std::vector<float> k_amax(c.num_layers, 0.0f);
  std::vector<float> v_amax(c.num_layers, 0.0f);
  const AttentionFn attend = [&](const AttentionIo& io) {
    const size_t count = static_cast<size_t>(io.num_tokens) * c.kv_dim();
    for (size_t i = 0; i < count; ++i) {
      k_amax[io.layer] = std::max(k_amax[io.layer], std::abs(io.k[i]));
      // MLA caches only the latents (in K): its V scales stay 1.
      if (io.v != nullptr) v_amax[io.layer] = std::max(v_amax[io.layer], std::abs(io.v[i]));
    }
    attention(io);
    return absl::OkStatus();
  };
  std::vector<float> logits;
  Workspace ws;
  const auto n = static_cast<int32_t>(tokens.size());
  const int32_t last[] = {n - 1};
  const ScanFn scan = [&](const ScanIo& io) { return scan_from_start(model, io); };
  const absl::Status status = model.forward(tokens, iota(n), attend, scan, last, &logits, &ws);
  if (!status.ok()) return status;
  KvFormat format;
  format.cache_dtype = pagedkv::DType::kFloat8E4M3;
  auto scale = [](float amax) { return amax > 0.0f ? amax * kFp8Headroom / kFp8Max : 1.0f; };
  for (int32_t l = 0; l < c.num_layers; ++l) {
    format.k_scales.push_back(scale(k_amax[l]));
    format.v_scales.push_back(scale(v_amax[l]));
  }
  return format;
}

}  // namespace decode_loop
