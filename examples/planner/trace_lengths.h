// File: examples/planner/trace_lengths.h
//
// The sequence lengths of a request trace for pagedkv-plan --trace: each request's prompt
// plus output tokens (the most KV it ever holds), summarized by nearest-rank percentiles.
// Traces are read by the simulator's readers (Azure CSV, Mooncake JSONL; formats in
// shared/traces/README.md).
#ifndef PAGEDKV_EXAMPLES_PLANNER_TRACE_LENGTHS_H_
#define PAGEDKV_EXAMPLES_PLANNER_TRACE_LENGTHS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trace.h"

namespace pagedkv::plan {

struct TraceLengths {
  std::string name;  // the trace's file stem
  int64_t requests = 0;
  int64_t p50 = 0;  // tokens, nearest rank
  int64_t p99 = 0;
  int64_t max = 0;
  // Tokens of distinct prompt content (Mooncake hash ids, each block counted once at
  // its longest): what a prefix cache that never evicts would hold. 0 without ids.
  int64_t prompt_footprint_tokens = 0;
};

// The nearest-rank `percent` percentile (0 < percent <= 100) of `values`: the smallest
// value with at least percent% of them at or below it. 0 for no values.
int64_t nearest_rank(std::vector<int64_t> values, double percent);

// Prompt + output lengths of `trace`, summarized, and its prompt footprint.
TraceLengths lengths_of(const sim::Trace& trace);

// Reads the trace at `path` (.csv Azure, .jsonl Mooncake) and summarizes it.
// Errors: those of sim::read_trace(), and InvalidArgument for a trace without requests.
[[nodiscard]] absl::StatusOr<TraceLengths> read_trace_lengths(const std::string& path);

}  // namespace pagedkv::plan

#endif  // PAGEDKV_EXAMPLES_PLANNER_TRACE_LENGTHS_H_
