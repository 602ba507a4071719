// File: examples/simulator/trace.h
//
// Request traces for the workload simulator: the public Azure LLM inference traces (CSV:
// arrival, prompt and output lengths) and the Mooncake traces (JSONL: arrival, lengths and
// 512-token prefix-block hash ids), both described in shared/traces/README.md, plus the
// synthetic workloads of synthetic.h. Every reader returns a Trace or a Status naming the
// file and line of the first malformed row.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_TRACE_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace pagedkv::sim {

// Tokens per block of the Mooncake hash ids.
inline constexpr int32_t kMooncakeBlockTokens = 512;

// One request of a trace.
struct Request {
  double arrival_s = 0;       // seconds from the start of the trace
  int32_t input_length = 0;   // prompt tokens, > 0
  int32_t output_length = 0;  // generated tokens, > 0
  // Mooncake: one id per 512-token block of the prompt (the last one may be partial);
  // equal ids mean equal content. Empty for traces without content identity.
  std::vector<int64_t> hash_ids;
  // Synthetic workloads: the shared system prompt that starts the prompt (-1: none) and
  // its length in tokens.
  int32_t system_prompt_id = -1;
  int32_t system_prompt_length = 0;
  int32_t num_samples = 1;  // parallel samples sharing the prompt (forks after prefill)
  int32_t beam_width = 1;   // beam-style forks: live beams re-forked during decode
};

struct Trace {
  std::string name;  // file stem or "synthetic"
  std::vector<Request> requests;
};

// Reads an Azure LLM inference trace (header TIMESTAMP,ContextTokens,GeneratedTokens;
// timestamps "YYYY-MM-DD HH:MM:SS.fffffff"). Arrivals are relative to the first row.
// Errors: NotFound (cannot open), InvalidArgument naming the line of a malformed row or a
// missing column.
[[nodiscard]] absl::StatusOr<Trace> read_azure_csv(const std::string& path);
[[nodiscard]] absl::StatusOr<Trace> parse_azure_csv(absl::string_view text, absl::string_view name);

// Reads a Mooncake JSONL trace (timestamp in ms, input_length, output_length, hash_ids).
// Checks len(hash_ids) == ceil(input_length / 512). Errors as read_azure_csv().
[[nodiscard]] absl::StatusOr<Trace> read_mooncake_jsonl(const std::string& path);
[[nodiscard]] absl::StatusOr<Trace> parse_mooncake_jsonl(absl::string_view text,
                                                         absl::string_view name);

// Reads a trace by its extension (.csv: Azure, .jsonl: Mooncake).
[[nodiscard]] absl::StatusOr<Trace> read_trace(const std::string& path);

// What clamp_to_model_len() changed.
struct ClampStats {
  int32_t prompts_truncated = 0;  // prompt cut to max_model_len - 1 tokens
  int32_t outputs_clamped = 0;    // output cut so that prompt + output <= max_model_len
};

// Makes every request fit a model context of `max_model_len` tokens (prompt + output),
// as a serving engine's length limit would: long prompts keep their head (and the hash
// ids that cover it), outputs are shortened.
ClampStats clamp_to_model_len(Trace& trace, int32_t max_model_len);

// Keeps the first `max_requests` requests (a no-op when the trace is shorter).
void truncate_trace(Trace& trace, int64_t max_requests);

// Divides every arrival time by `factor` (> 0): factor 10 replays the trace ten times
// faster, raising the load without changing the length distributions.
void scale_arrivals(Trace& trace, double factor);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_TRACE_H_
