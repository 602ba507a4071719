// examples/planner/trace_lengths.h: nearest-rank percentiles of prompt + output lengths.
#include "trace_lengths.h"

#include <catch2/catch.hpp>
#include <vector>

namespace pagedkv::plan {
namespace {

TEST_CASE("nearest rank is the smallest value with percent% at or below it", "[planner]") {
  const std::vector<int64_t> ten = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5};
  CHECK(nearest_rank(ten, 50) == 5);   // rank ceil(0.5 x 10) = 5
  CHECK(nearest_rank(ten, 99) == 10);  // rank ceil(9.9) = 10
  CHECK(nearest_rank(ten, 100) == 10);
  CHECK(nearest_rank(ten, 1) == 1);
  CHECK(nearest_rank({7}, 50) == 7);
  CHECK(nearest_rank({}, 50) == 0);
}

TEST_CASE("a trace's lengths are prompt plus output tokens", "[planner]") {
  sim::Trace trace;
  trace.name = "t";
  for (int32_t i = 1; i <= 100; ++i) {
    sim::Request r;
    r.input_length = 100 * i;
    r.output_length = i;
    trace.requests.push_back(r);
  }
  const TraceLengths lengths = lengths_of(trace);
  CHECK(lengths.requests == 100);
  CHECK(lengths.p50 == 50 * 101);  // the 50th of 101, 202, ..., 10,100
  CHECK(lengths.p99 == 99 * 101);
  CHECK(lengths.max == 100 * 101);
  CHECK(lengths.prompt_footprint_tokens == 0);  // no hash ids
}

TEST_CASE("a trace's prompt footprint counts each hash block once, at its longest", "[planner]") {
  sim::Trace trace;
  // Ids 1, 2 (full 512-token blocks) and 3 (100 tokens); then 1 again and 3 with 300
  // tokens, and a new id 4 of 40: 512 + 512 + 300 + 40 = 1,364 tokens.
  trace.requests.push_back({.input_length = 1124, .output_length = 1, .hash_ids = {1, 2, 3}});
  trace.requests.push_back({.input_length = 812, .output_length = 1, .hash_ids = {1, 3}});
  trace.requests.push_back({.input_length = 40, .output_length = 1, .hash_ids = {4}});
  CHECK(lengths_of(trace).prompt_footprint_tokens == 1364);
}

TEST_CASE("a trace that cannot be read names the file", "[planner]") {
  absl::StatusOr<TraceLengths> lengths = read_trace_lengths("/nonexistent/trace.jsonl");
  CHECK(lengths.status().code() == absl::StatusCode::kNotFound);
  CHECK(lengths.status().message().find("/nonexistent/trace.jsonl") != std::string::npos);
}

}  // namespace
}  // namespace pagedkv::plan
