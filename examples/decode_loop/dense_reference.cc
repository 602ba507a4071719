// Dense, cache-free generation (see dense_reference.h).
#include "dense_reference.h"

#include <cmath>
#include <numeric>

#include "pagedkv/numeric.h"

namespace decode_loop {
namespace {

// The value a cache of `dtype` holds for x.
float round_to(pagedkv::DType dtype, float x) {
  switch (dtype) {
    case pagedkv::DType::kFloat16:
      return pagedkv::to_float(pagedkv::from_float<pagedkv::Half>(x));
    case pagedkv::DType::kBFloat16:
      return pagedkv::to_float(pagedkv::from_float<pagedkv::BFloat16>(x));
    case pagedkv::DType::kFloat8E4M3:
      return pagedkv::to_float(pagedkv::from_float<pagedkv::Fp8E4M3>(x));
    case pagedkv::DType::kFloat32:
      break;
  }
  return x;
}

// Causal softmax attention over all n tokens: token i attends to tokens 0..i.
void causal_attention(const ModelConfig& c, const AttentionIo& io, pagedkv::DType kv_dtype,
                      std::vector<float>& k, std::vector<float>& v, std::vector<float>& q_rounded,
                      std::vector<float>& scores) {
  const int32_t n = io.num_tokens;
  const int32_t hd = c.head_dim;
  const int32_t group = c.num_q_heads / c.num_kv_heads;
  // The paged cache stores K/V in kv_dtype, and a 16-bit cache runs attention with q and
  // out in that dtype too: round the same values here.
  k.assign(io.k, io.k + static_cast<size_t>(n) * c.kv_dim());
  v.assign(io.v, io.v + static_cast<size_t>(n) * c.kv_dim());
  for (float& e : k) e = round_to(kv_dtype, e);
  for (float& e : v) e = round_to(kv_dtype, e);
  q_rounded.assign(io.q, io.q + static_cast<size_t>(n) * c.q_dim());
  for (float& e : q_rounded) e = round_to(kv_dtype, e);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  scores.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t h = 0; h < c.num_q_heads; ++h) {
      const float* q = q_rounded.data() + (static_cast<size_t>(i) * c.num_q_heads + h) * hd;
      const int32_t kvh = h / group;
      float max = -INFINITY;
      for (int32_t j = 0; j <= i; ++j) {
        const float* kj = k.data() + (static_cast<size_t>(j) * c.num_kv_heads + kvh) * hd;
        float dot = 0.0f;
        for (int32_t d = 0; d < hd; ++d) dot += q[d] * kj[d];
        scores[j] = dot * scale;
        max = std::max(max, scores[j]);
      }
      float denom = 0.0f;
      for (int32_t j = 0; j <= i; ++j) {
        scores[j] = std::exp(scores[j] - max);
        denom += scores[j];
      }
      float* out = io.out + (static_cast<size_t>(i) * c.num_q_heads + h) * hd;
      std::fill(out, out + hd, 0.0f);
      for (int32_t j = 0; j <= i; ++j) {
        const float* vj = v.data() + (static_cast<size_t>(j) * c.num_kv_heads + kvh) * hd;
        const float p = scores[j] / denom;
        for (int32_t d = 0; d < hd; ++d) out[d] += p * vj[d];
      }
      for (int32_t d = 0; d < hd; ++d) out[d] = round_to(kv_dtype, out[d]);
    }
  }
}

}  // namespace

absl::StatusOr<DenseResult> dense_generate(const Model& model, std::span<const TokenId> prompt,
                                           int32_t num_new, const SamplingParams& sampling,
                                           pagedkv::DType kv_dtype) {
  const ModelConfig& c = model.config();
  std::vector<TokenId> tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> positions;
  std::vector<float> k, v, q_rounded, scores, logits;
  Workspace ws;
  DenseResult result;
  const AttentionFn attend = [&](const AttentionIo& io) {
    causal_attention(c, io, kv_dtype, k, v, q_rounded, scores);
    return absl::OkStatus();
  };
  for (int32_t step = 0; step < num_new; ++step) {
    // No cache: the whole sequence, every step.
    positions.resize(tokens.size());
    std::iota(positions.begin(), positions.end(), 0);
    const int32_t last[] = {static_cast<int32_t>(tokens.size()) - 1};
    const absl::Status status = model.forward(tokens, positions, attend, last, &logits, &ws);
    if (!status.ok()) return status;
    const TokenId next = pick_token(logits, sampling, step);
    result.tokens.push_back(next);
    result.top2_gaps.push_back(top2_gap(logits));
    tokens.push_back(next);
  }
  return result;
}

}  // namespace decode_loop
