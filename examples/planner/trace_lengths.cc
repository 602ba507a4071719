#include "trace_lengths.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace pagedkv::plan {

int64_t nearest_rank(std::vector<int64_t> values, double percent) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(percent / 100.0 * static_cast<double>(values.size()));
  const size_t index =
      static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(values.size())));
  return values[index - 1];
}

TraceLengths lengths_of(const sim::Trace& trace) {
  std::vector<int64_t> lengths;
  lengths.reserve(trace.requests.size());
  for (const sim::Request& r : trace.requests) {
    lengths.push_back(int64_t{r.input_length} + r.output_length);
  }
  TraceLengths out;
  out.name = trace.name;
  out.requests = static_cast<int64_t>(lengths.size());
  out.p50 = nearest_rank(lengths, 50);
  out.p99 = nearest_rank(lengths, 99);
  out.max = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  absl::flat_hash_map<int64_t, int64_t> block_tokens;  // hash id -> its longest block
  for (const sim::Request& r : trace.requests) {
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      const int64_t start = static_cast<int64_t>(i) * sim::kMooncakeBlockTokens;
      const int64_t tokens = std::min<int64_t>(sim::kMooncakeBlockTokens, r.input_length - start);
      int64_t& longest = block_tokens[r.hash_ids[i]];
      longest = std::max(longest, tokens);
    }
  }
  for (const auto& [id, tokens] : block_tokens) out.prompt_footprint_tokens += tokens;
  return out;
}

absl::StatusOr<TraceLengths> read_trace_lengths(const std::string& path) {
  absl::StatusOr<sim::Trace> trace = sim::read_trace(path);
  if (!trace.ok()) return trace.status();
  if (trace->requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("trace ", path, " has no requests"));
  }
  return lengths_of(*trace);
}

}  // namespace pagedkv::plan
