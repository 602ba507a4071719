// Synthetic and trace-driven workloads (see workload.h).
#include "workload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include "absl/strings/string_view.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace decode_loop {
namespace {

using pagedkv::TokenId;

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Token `i` of a stream named by (seed, stream): a pure function, so equal names give equal
// token blocks (and so prefix-cache hits) wherever they appear.
TokenId stream_token(uint64_t seed, uint64_t stream, int64_t i, int32_t vocab) {
  return static_cast<TokenId>(mix(mix(seed ^ mix(stream)) + static_cast<uint64_t>(i)) %
                              static_cast<uint64_t>(vocab));
}

constexpr uint64_t kSystemStream = 0x5157E3;
constexpr uint64_t kSuffixStream = 1ull << 40;
constexpr uint64_t kHashStream = 2ull << 40;

int32_t scaled(int64_t tokens, double scale) {
  return static_cast<int32_t>(
      std::max<int64_t>(1, std::llround(static_cast<double>(tokens) * scale)));
}

// Cuts the prompt so prompt + output fits max_total_len (keeping at least one token).
void fit(Request& r, int32_t max_total_len, int32_t& truncated) {
  r.max_new_tokens = std::min(r.max_new_tokens, max_total_len - 1);
  const auto limit = static_cast<size_t>(std::max(1, max_total_len - r.max_new_tokens));
  if (r.prompt.size() > limit) {
    r.prompt.resize(limit);
    ++truncated;
  }
}

Workload synthetic(const WorkloadOptions& o) {
  Workload w;
  const uint64_t own = o.request_seed != 0 ? o.request_seed : o.seed;
  for (int32_t i = 0; i < o.num_requests; ++i) {
    Request r;
    r.id = i;
    const auto system = static_cast<uint64_t>(i % o.num_system_prompts);
    for (int32_t t = 0; t < o.system_prompt_len; ++t) {
      r.prompt.push_back(stream_token(o.seed, kSystemStream + system, t, o.vocab_size));
    }
    const uint64_t draw = mix(own ^ mix(static_cast<uint64_t>(i) + 77));
    const int32_t suffix_span = std::max(1, o.max_suffix_len - o.min_suffix_len + 1);
    const int32_t suffix = o.min_suffix_len + static_cast<int32_t>(draw % suffix_span);
    for (int32_t t = 0; t < suffix; ++t) {
      r.prompt.push_back(stream_token(own, kSuffixStream + i, t, o.vocab_size));
    }
    const int32_t min_new = std::max(1, o.max_new_tokens / 2);
    r.max_new_tokens =
        min_new + static_cast<int32_t>((draw >> 20) % (o.max_new_tokens - min_new + 1));
    if (o.max_samples > 1 && i % 4 == 1) {
      r.num_samples = 2 + (i / 4) % (o.max_samples - 1);
      r.temperature = o.temperature;
    }
    fit(r, o.max_total_len, w.truncated_prompts);
    w.requests.push_back(std::move(r));
  }
  w.description = absl::StrCat(
      "synthetic: ", o.num_requests, " requests, ",
      o.num_system_prompts == 1 ? std::string("shared system prompt")
                                : absl::StrCat(o.num_system_prompts, " system prompts in turn"),
      " of ", o.system_prompt_len, " tokens + user suffix ", o.min_suffix_len, "..",
      o.max_suffix_len, ", samples up to ", o.max_samples);
  return w;
}

// Reads integer field `key` of a flat JSON object line; false when absent or malformed.
bool json_int(absl::string_view line, absl::string_view key, int64_t* out) {
  const std::string needle = absl::StrCat("\"", key, "\"");
  size_t pos = line.find(needle);
  if (pos == absl::string_view::npos) return false;
  pos = line.find(':', pos + needle.size());
  if (pos == absl::string_view::npos) return false;
  ++pos;
  while (pos < line.size() && line[pos] == ' ') ++pos;
  size_t end = pos;
  while (end < line.size() &&
         (std::isdigit(static_cast<unsigned char>(line[end])) || line[end] == '-'))
    ++end;
  return absl::SimpleAtoi(line.substr(pos, end - pos), out);
}

bool json_int_list(absl::string_view line, absl::string_view key, std::vector<int64_t>* out) {
  const std::string needle = absl::StrCat("\"", key, "\"");
  size_t pos = line.find(needle);
  if (pos == absl::string_view::npos) return false;
  const size_t open = line.find('[', pos);
  const size_t close = line.find(']', open);
  if (open == absl::string_view::npos || close == absl::string_view::npos) return false;
  out->clear();
  for (absl::string_view item : absl::StrSplit(line.substr(open + 1, close - open - 1), ',')) {
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v)) return false;
    out->push_back(v);
  }
  return true;
}

absl::StatusOr<Workload> from_trace(const WorkloadOptions& o) {
  std::ifstream in(o.trace_path);
  if (!in) return absl::NotFoundError(absl::StrCat("--trace: cannot open ", o.trace_path));
  const bool csv =
      o.trace_path.size() >= 4 && o.trace_path.compare(o.trace_path.size() - 4, 4, ".csv") == 0;
  const int32_t hash_block = scaled(512, o.trace_scale);
  Workload w;
  std::string line;
  int64_t line_no = 0;
  while (static_cast<int32_t>(w.requests.size()) < o.num_requests && std::getline(in, line)) {
    ++line_no;
    if (line.empty() || (csv && line_no == 1)) continue;
    int64_t input_len = 0;
    int64_t output_len = 0;
    std::vector<int64_t> hash_ids;
    if (csv) {
      const std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
      if (fields.size() < 3 || !absl::SimpleAtoi(fields[1], &input_len) ||
          !absl::SimpleAtoi(fields[2], &output_len)) {
        return absl::InvalidArgumentError(absl::StrCat(
            o.trace_path, ":", line_no, ": expected TIMESTAMP,ContextTokens,GeneratedTokens"));
      }
    } else if (!json_int(line, "input_length", &input_len) ||
               !json_int(line, "output_length", &output_len) ||
               !json_int_list(line, "hash_ids", &hash_ids)) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.trace_path, ":", line_no, ": expected input_length, output_length and hash_ids"));
    }
    Request r;
    r.id = static_cast<int64_t>(w.requests.size());
    const int32_t prompt_len = scaled(input_len, o.trace_scale);
    if (hash_ids.empty()) {
      for (int32_t t = 0; t < prompt_len; ++t) {
        r.prompt.push_back(
            stream_token(o.seed, kSuffixStream + static_cast<uint64_t>(r.id), t, o.vocab_size));
      }
    } else {
      for (const int64_t id : hash_ids) {
        for (int32_t t = 0; t < hash_block && static_cast<int32_t>(r.prompt.size()) < prompt_len;
             ++t) {
          r.prompt.push_back(
              stream_token(o.seed, kHashStream + static_cast<uint64_t>(id), t, o.vocab_size));
        }
      }
    }
    r.max_new_tokens = std::min(scaled(output_len, o.trace_scale), o.max_new_tokens);
    if (o.max_samples > 1 && r.id % 4 == 1) {
      r.num_samples = 2 + static_cast<int32_t>(r.id / 4) % (o.max_samples - 1);
      r.temperature = o.temperature;
    }
    fit(r, o.max_total_len, w.truncated_prompts);
    w.requests.push_back(std::move(r));
  }
  if (w.requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--trace: no requests in ", o.trace_path));
  }
  w.description = absl::StrCat(
      "trace ", o.trace_path, ": ", w.requests.size(), " requests, lengths x", o.trace_scale,
      csv ? " (no prefix information)" : absl::StrCat(" (hash block = ", hash_block, " tokens)"));
  return w;
}

absl::StatusOr<Workload> from_prompts(const WorkloadOptions& options) {
  const std::string& path = options.prompts_path;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--prompts ", path, ": cannot read"));
  Workload w;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    Request r{.id = static_cast<int64_t>(w.requests.size()),
              .prompt = {},
              .max_new_tokens = options.max_new_tokens};
    for (const absl::string_view field : absl::StrSplit(line, ' ', absl::SkipWhitespace())) {
      int64_t token = -1;
      if (!absl::SimpleAtoi(field, &token) || token < 0 || token >= options.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": token \"", field,
                                                       "\" is not an id in [0, ",
                                                       options.vocab_size, ")"));
      }
      r.prompt.push_back(static_cast<pagedkv::TokenId>(token));
    }
    if (r.prompt.empty()) continue;
    if (std::ssize(r.prompt) + r.max_new_tokens > options.max_total_len) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", r.prompt.size(), " tokens + ", r.max_new_tokens,
                       " new ones exceed the ", options.max_total_len, " a sequence may hold"));
    }
    w.requests.push_back(std::move(r));
  }
  if (w.requests.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompt"));
  w.description = absl::StrCat(w.requests.size(), " prompts from ", path, ", greedy, ",
                               options.max_new_tokens, " new tokens each");
  return w;
}

}  // namespace

absl::StatusOr<Workload> make_workload(const WorkloadOptions& options) {
  if (options.num_requests <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--requests ", options.num_requests, " must be > 0"));
  }
  if (options.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-new-tokens ", options.max_new_tokens, " must be > 0"));
  }
  if (options.num_system_prompts <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--system-prompts ", options.num_system_prompts, " must be > 0"));
  }
  if (!options.prompts_path.empty()) return from_prompts(options);
  if (options.trace_path.empty()) return synthetic(options);
  if (!(options.trace_scale > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace-scale ", options.trace_scale, " must be > 0"));
  }
  return from_trace(options);
}

}  // namespace decode_loop
