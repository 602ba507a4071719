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

// Causal softmax attention over all n tokens: token i attends to tokens 0..i, with K/V as
// the cache holds them and q / out as the kernels take them.
class CausalAttention {
 public:
  CausalAttention(const ModelConfig& config, const KvFormat& format)
      : c_(config), format_(format) {}

  void operator()(const AttentionIo& io) {
    const int32_t n = io.num_tokens;
    const int32_t hd = c_.head_dim;
    const int32_t group = c_.num_q_heads / c_.num_kv_heads;
    k_.resize(static_cast<size_t>(n) * c_.kv_dim());
    v_.resize(k_.size());
    for (size_t i = 0; i < k_.size(); ++i) {
      k_[i] = format_.stored_k(io.layer, io.k[i]);
      v_[i] = format_.stored_v(io.layer, io.v[i]);
    }
    q_.resize(static_cast<size_t>(n) * c_.q_dim());
    for (size_t i = 0; i < q_.size(); ++i) q_[i] = format_.attention_value(io.q[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    scores_.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t h = 0; h < c_.num_q_heads; ++h) {
        const float* q = q_.data() + (static_cast<size_t>(i) * c_.num_q_heads + h) * hd;
        const int32_t kvh = h / group;
        float max = -INFINITY;
        for (int32_t j = 0; j <= i; ++j) {
          const float* kj = k_.data() + (static_cast<size_t>(j) * c_.num_kv_heads + kvh) * hd;
          float dot = 0.0f;
          for (int32_t d = 0; d < hd; ++d) dot += q[d] * kj[d];
          scores_[j] = dot * scale;
          max = std::max(max, scores_[j]);
        }
        float denom = 0.0f;
        for (int32_t j = 0; j <= i; ++j) {
          scores_[j] = std::exp(scores_[j] - max);
          denom += scores_[j];
        }
        float* out = io.out + (static_cast<size_t>(i) * c_.num_q_heads + h) * hd;
        std::fill(out, out + hd, 0.0f);
        for (int32_t j = 0; j <= i; ++j) {
          const float* vj = v_.data() + (static_cast<size_t>(j) * c_.num_kv_heads + kvh) * hd;
          const float p = scores_[j] / denom;
          for (int32_t d = 0; d < hd; ++d) out[d] += p * vj[d];
        }
        for (int32_t d = 0; d < hd; ++d) out[d] = format_.attention_value(out[d]);
      }
    }
  }

 private:
  const ModelConfig& c_;
  const KvFormat& format_;
  std::vector<float> k_, v_, q_, scores_;
};

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
  CausalAttention attention(model.config(), format);
  const AttentionFn attend = [&](const AttentionIo& io) {
    attention(io);
    return absl::OkStatus();
  };
  std::vector<float> logits;
  Workspace ws;
  const absl::Status status =
      model.forward(tokens, iota(n), attend, iota(num_rows, n - num_rows), &logits, &ws);
  if (!status.ok()) return status;
  return logits;
}

absl::StatusOr<KvFormat> calibrate_fp8(const Model& model, std::span<const TokenId> tokens) {
  const ModelConfig& c = model.config();
  if (tokens.empty()) return absl::InvalidArgumentError("calibrate_fp8: no calibration tokens");
  const KvFormat fp32;
  CausalAttention attention(c, fp32);
  std::vector<float> k_amax(c.num_layers, 0.0f);
  std::vector<float> v_amax(c.num_layers, 0.0f);
  const AttentionFn attend = [&](const AttentionIo& io) {
    const size_t count = static_cast<size_t>(io.num_tokens) * c.kv_dim();
    for (size_t i = 0; i < count; ++i) {
      k_amax[io.layer] = std::max(k_amax[io.layer], std::abs(io.k[i]));
      v_amax[io.layer] = std::max(v_amax[io.layer], std::abs(io.v[i]));
    }
    attention(io);
    return absl::OkStatus();
  };
  std::vector<float> logits;
  Workspace ws;
  const auto n = static_cast<int32_t>(tokens.size());
  const int32_t last[] = {n - 1};
  const absl::Status status = model.forward(tokens, iota(n), attend, last, &logits, &ws);
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
