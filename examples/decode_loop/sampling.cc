// Greedy and seeded sampling (see sampling.h).
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace decode_loop {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Unnormalized softmax(logits / temperature) weights in double; returns their sum.
double softmax_weights(std::span<const float> logits, float temperature,
                       std::vector<double>* weights) {
  const double max = *std::max_element(logits.begin(), logits.end());
  const double inv_t = 1.0 / temperature;
  weights->resize(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    (*weights)[i] = std::exp((logits[i] - max) * inv_t);
    total += (*weights)[i];
  }
  return total;
}

}  // namespace

// Uniform in [0, 1) keyed by the four coordinates of one draw.
double sampling_draw(const SamplingParams& params, int32_t step) {
  uint64_t h = mix(params.seed + 0x9E3779B97F4A7C15ull);
  h = mix(h ^ static_cast<uint64_t>(params.request));
  h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(params.sample)) << 32 |
               static_cast<uint32_t>(step)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

pagedkv::TokenId pick_token(std::span<const float> logits, const SamplingParams& params,
                            int32_t step) {
  const auto n = static_cast<int32_t>(logits.size());
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (params.temperature <= 0.0f) return best;
  // Inverse-CDF sampling over softmax(logits / T), in double.
  std::vector<double> weights;
  const double total = softmax_weights(logits, params.temperature, &weights);
  const double target = sampling_draw(params, step) * total;
  double cumulative = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    cumulative += weights[i];
    if (target < cumulative) return i;
  }
  return best;  // rounding left the target past the last weight
}

DrawInterval draw_interval(std::span<const float> logits, float temperature,
                           pagedkv::TokenId token) {
  std::vector<double> weights;
  const double total = softmax_weights(logits, temperature, &weights);
  double before = 0.0;
  for (pagedkv::TokenId i = 0; i < token; ++i) before += weights[i];
  return {.lo = before / total, .hi = (before + weights[token]) / total};
}

}  // namespace decode_loop
