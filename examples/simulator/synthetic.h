// File: examples/simulator/synthetic.h
//
// A synthetic workload generator for what the public traces lack: shared system prompts,
// parallel sampling (n samples per request) and beam-style forks. Arrivals are Poisson;
// prompt and output lengths are log-normal with the given means, clamped to [min, max].
// Deterministic for a given seed.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_SYNTHETIC_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_SYNTHETIC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "trace.h"

namespace pagedkv::sim {

struct SyntheticOptions {
  int32_t num_requests = 2000;
  double rate_per_s = 20;     // Poisson arrival rate
  double prompt_mean = 600;   // tokens, after the system prompt
  double prompt_sigma = 0.8;  // sigma of log(length)
  double output_mean = 250;   // tokens
  double output_sigma = 0.8;
  int32_t min_length = 4;               // tokens, for prompts and outputs
  int32_t max_length = 4096;            // tokens, for prompts and outputs
  int32_t num_system_prompts = 4;       // distinct shared system prompts
  int32_t system_prompt_length = 1024;  // tokens
  double system_prompt_fraction = 0.8;  // requests that start with a system prompt
  double parallel_fraction = 0.2;       // requests with num_samples > 1
  int32_t num_samples = 4;              // samples of a parallel request
  double beam_fraction = 0.1;           // requests decoded as beams
  int32_t beam_width = 4;
  uint64_t seed = 1;
};

// Generates a trace named "generated" (not to be confused with Mooncake's
// synthetic_trace.jsonl, which the reader names "mooncake_synthetic_trace"). Errors:
// InvalidArgument naming the bad option.
[[nodiscard]] absl::StatusOr<Trace> generate_synthetic(const SyntheticOptions& options);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_SYNTHETIC_H_
