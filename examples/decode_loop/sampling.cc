// Greedy and seeded sampling (see sampling.h).
#include "sampling.h"

#include <cmath>
#include <vector>

namespace decode_loop {
namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) keyed by the four coordinates of one draw.
double keyed_uniform(uint64_t seed, int64_t request, int32_t sample, int32_t step) {
  uint64_t h = mix(seed + 0x9E3779B97F4A7C15ull);
  h = mix(h ^ static_cast<uint64_t>(request));
  h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(sample)) << 32 |
               static_cast<uint32_t>(step)));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace

pagedkv::TokenId pick_token(std::span<const float> logits, const SamplingParams& params,
                            int32_t step) {
  const auto n = static_cast<int32_t>(logits.size());
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (params.temperature <= 0.0f) return best;
  // Inverse-CDF sampling over softmax(logits / T), in double.
  const double max = logits[best];
  const double inv_t = 1.0 / params.temperature;
  double total = 0.0;
  std::vector<double> weights(n);
  for (int32_t i = 0; i < n; ++i) {
    weights[i] = std::exp((logits[i] - max) * inv_t);
    total += weights[i];
  }
  const double target = keyed_uniform(params.seed, params.request, params.sample, step) * total;
  double cumulative = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    cumulative += weights[i];
    if (target < cumulative) return i;
  }
  return best;  // rounding left the target past the last weight
}

float top2_gap(std::span<const float> logits) {
  float first = -INFINITY;
  float second = -INFINITY;
  for (const float l : logits) {
    if (l > first) {
      second = first;
      first = l;
    } else if (l > second) {
      second = l;
    }
  }
  return first - second;
}

}  // namespace decode_loop
