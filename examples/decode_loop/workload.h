// File: examples/decode_loop/workload.h
//
// The requests the decode loop serves: a default synthetic workload (many requests that
// share a long system prompt, or take turns among a few, with distinct user suffixes, some
// asking for several samples), or a replay of a public trace (../shared/traces) with lengths scaled
// down to the example model.
//
// Trace formats:
//   Mooncake JSONL  {"timestamp", "input_length", "output_length", "hash_ids"}: hash_ids
//                   name 512-token prefix blocks; equal ids become equal token blocks here,
//                   so the trace's prefix sharing becomes real prefix-cache hits.
//   Azure CSV       TIMESTAMP,ContextTokens,GeneratedTokens: lengths only, no sharing.
// Timestamps are ignored: every request is queued at the start (offline batch).
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_WORKLOAD_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/types.h"

namespace decode_loop {

struct Request {
  int64_t id = 0;
  std::vector<pagedkv::TokenId> prompt;
  int32_t max_new_tokens = 0;  // tokens generated per sample (no end-of-sequence token)
  int32_t num_samples = 1;     // > 1: forked samples sharing the prompt's KV
  float temperature = 0.0f;    // 0: greedy; samples of multi-sample requests use > 0
};

struct WorkloadOptions {
  int32_t num_requests = 32;
  int32_t system_prompt_len = 192;  // tokens shared by every synthetic request
  // Distinct system prompts: request i uses prompt i mod num_system_prompts, so a prompt
  // comes back every num_system_prompts requests (after being evicted, when the device
  // cache cannot hold all of them).
  int32_t num_system_prompts = 1;
  int32_t min_suffix_len = 8;  // distinct user suffix, tokens
  int32_t max_suffix_len = 40;
  int32_t max_new_tokens = 24;  // per sample; synthetic requests draw [max / 2, max]
  int32_t max_samples = 4;      // every 4th synthetic request asks for 2..max_samples
  float temperature = 0.8f;     // of multi-sample requests
  int32_t vocab_size = 1024;
  uint64_t seed = 1;
  // The synthetic requests' own parts (user suffixes and lengths); 0: `seed`. Two
  // engines with one seed and different request seeds share system prompts only.
  uint64_t request_seed = 0;
  // Trace replay (empty path: synthetic).
  std::string trace_path;
  // Given prompts (--prompts; empty path: synthetic or trace): one per line, token ids
  // separated by spaces, each a greedy request of max_new_tokens.
  std::string prompts_path;
  double trace_scale = 1.0 / 64;    // multiplies trace token lengths (and the 512-token hash block)
  int32_t max_total_len = 1 << 20;  // prompts are cut so prompt + output fits
};

struct Workload {
  std::vector<Request> requests;
  std::string description;  // one line for the summary
  int32_t truncated_prompts = 0;
};

// Builds the workload. Errors: NotFound / InvalidArgument for an unreadable or malformed
// trace or prompts file, naming the file and line.
absl::StatusOr<Workload> make_workload(const WorkloadOptions& options);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_WORKLOAD_H_
