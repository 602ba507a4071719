#include "trace.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace pagedkv::sim {
namespace {

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace file '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string stem(absl::string_view path) {
  size_t slash = path.find_last_of('/');
  if (slash != absl::string_view::npos) path.remove_prefix(slash + 1);
  size_t dot = path.find_last_of('.');
  if (dot != absl::string_view::npos) path = path.substr(0, dot);
  return std::string(path);
}

template <typename T>
bool parse_int(absl::string_view text, T* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

// Days from 1970-01-01 to the civil date y-m-d (proleptic Gregorian; H. Hinnant's method).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// Parses "YYYY-MM-DD HH:MM:SS[.fffffff]" into seconds since the epoch.
bool parse_timestamp(absl::string_view text, double* seconds) {
  text = absl::StripAsciiWhitespace(text);
  if (text.size() < 19 || text[4] != '-' || text[7] != '-' || text[10] != ' ' || text[13] != ':' ||
      text[16] != ':') {
    return false;
  }
  int64_t year, month, day, hour, minute, second;
  if (!parse_int(text.substr(0, 4), &year) || !parse_int(text.substr(5, 2), &month) ||
      !parse_int(text.substr(8, 2), &day) || !parse_int(text.substr(11, 2), &hour) ||
      !parse_int(text.substr(14, 2), &minute) || !parse_int(text.substr(17, 2), &second)) {
    return false;
  }
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return false;
  }
  double fraction = 0;
  if (text.size() > 19) {
    if (text[19] != '.' || text.size() == 20) return false;
    double scale = 0.1;
    for (char c : text.substr(20)) {
      if (c < '0' || c > '9') return false;
      fraction += (c - '0') * scale;
      scale /= 10;
    }
  }
  *seconds = static_cast<double>(days_from_civil(year, month, day) * 86400 + hour * 3600 +
                                 minute * 60 + second) +
             fraction;
  return true;
}

absl::Status row_error(absl::string_view name, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": ", what));
}

// A trace value in an error message: its JSON text, cut short (hash_ids run to thousands).
std::string excerpt(const nlohmann::json& value) {
  constexpr size_t kMaxChars = 40;
  std::string text = value.dump();
  if (text.size() > kMaxChars) text = absl::StrCat(text.substr(0, kMaxChars), "...");
  return text;
}

// One line of JSON text as an object. Errors: InvalidArgument with nlohmann's account of
// the first syntax error and its column.
absl::StatusOr<nlohmann::json> parse_object(absl::string_view line) {
  nlohmann::json row;
  try {
    row = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.N] parse error at line 1, column C: detail".
    const absl::string_view what = e.what();
    const size_t detail = what.find(": ");
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at column ", e.byte, ": ",
                     detail == absl::string_view::npos ? what : what.substr(detail + 2)));
  }
  if (!row.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected a JSON object, got ", excerpt(row)));
  }
  return row;
}

// `value` when it is a JSON integer that fits an int64.
std::optional<int64_t> as_int64(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  // Non-negative integers parse as unsigned; get<int64_t> would wrap those above INT64_MAX.
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  return value.get<int64_t>();
}

// The member `key` of a row: an integer in [min, max], which `requirement` says in words.
absl::StatusOr<int64_t> integer_member(const nlohmann::json& row, const char* key, int64_t min,
                                       int64_t max, absl::string_view requirement) {
  const auto member = row.find(key);
  if (member == row.end()) {
    return absl::InvalidArgumentError(absl::StrCat("missing \"", key, "\" (", requirement, ")"));
  }
  const std::optional<int64_t> value = as_int64(*member);
  if (!value || *value < min || *value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be ", requirement, ", got ", excerpt(*member)));
  }
  return *value;
}

// The member "hash_ids" of a row: an array of int64.
absl::StatusOr<std::vector<int64_t>> hash_ids_member(const nlohmann::json& row) {
  const auto member = row.find("hash_ids");
  if (member == row.end()) {
    return absl::InvalidArgumentError("missing \"hash_ids\" (an array of integers)");
  }
  if (!member->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"hash_ids\" must be an array of integers, got ", excerpt(*member)));
  }
  std::vector<int64_t> ids;
  ids.reserve(member->size());
  for (const nlohmann::json& id : *member) {
    const std::optional<int64_t> value = as_int64(id);
    if (!value) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"hash_ids\"[", ids.size(), "] must be an int64, got ", excerpt(id)));
    }
    ids.push_back(*value);
  }
  return ids;
}

// One Mooncake row; errors say what is wrong, the caller adds the file and line.
absl::StatusOr<Request> parse_mooncake_row(absl::string_view line) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  constexpr absl::string_view kPositiveInt32 = "a positive int32, in tokens";
  const absl::StatusOr<nlohmann::json> row = parse_object(line);
  if (!row.ok()) return row.status();
  const absl::StatusOr<int64_t> timestamp = integer_member(
      *row, "timestamp", 0, std::numeric_limits<int64_t>::max(), "an integer >= 0, in ms");
  if (!timestamp.ok()) return timestamp.status();
  const absl::StatusOr<int64_t> input =
      integer_member(*row, "input_length", 1, kMaxInt32, kPositiveInt32);
  if (!input.ok()) return input.status();
  const absl::StatusOr<int64_t> output =
      integer_member(*row, "output_length", 1, kMaxInt32, kPositiveInt32);
  if (!output.ok()) return output.status();
  absl::StatusOr<std::vector<int64_t>> hash_ids = hash_ids_member(*row);
  if (!hash_ids.ok()) return hash_ids.status();
  const int64_t expected = (*input + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
  if (static_cast<int64_t>(hash_ids->size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat("hash_ids has ", hash_ids->size(),
                                                   " ids, input_length ", *input, " needs ceil(",
                                                   *input, " / 512) = ", expected));
  }
  Request request;
  request.arrival_s = static_cast<double>(*timestamp) / 1000.0;
  request.input_length = static_cast<int32_t>(*input);
  request.output_length = static_cast<int32_t>(*output);
  request.hash_ids = *std::move(hash_ids);
  return request;
}

}  // namespace

absl::StatusOr<Trace> parse_azure_csv(absl::string_view text, absl::string_view name) {
  Trace trace;
  trace.name = std::string(name);
  int64_t line_number = 0;
  int time_col = -1, context_col = -1, generated_col = -1;
  size_t num_cols = 0;
  double first_time = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    if (time_col < 0) {
      num_cols = fields.size();
      for (size_t i = 0; i < fields.size(); ++i) {
        absl::string_view f = absl::StripAsciiWhitespace(fields[i]);
        if (f == "TIMESTAMP") time_col = static_cast<int>(i);
        if (f == "ContextTokens") context_col = static_cast<int>(i);
        if (f == "GeneratedTokens") generated_col = static_cast<int>(i);
      }
      if (time_col < 0 || context_col < 0 || generated_col < 0) {
        return row_error(name, line_number,
                         "header must name TIMESTAMP, ContextTokens and GeneratedTokens");
      }
      continue;
    }
    if (fields.size() != num_cols) {
      return row_error(name, line_number,
                       absl::StrCat("expected ", num_cols, " fields, got ", fields.size()));
    }
    Request request;
    double t;
    if (!parse_timestamp(fields[time_col], &t)) {
      return row_error(name, line_number, absl::StrCat("bad TIMESTAMP '", fields[time_col], "'"));
    }
    if (!parse_int(fields[context_col], &request.input_length) || request.input_length <= 0) {
      return row_error(name, line_number,
                       absl::StrCat("ContextTokens must be a positive integer, got '",
                                    fields[context_col], "'"));
    }
    if (!parse_int(fields[generated_col], &request.output_length) || request.output_length <= 0) {
      return row_error(name, line_number,
                       absl::StrCat("GeneratedTokens must be a positive integer, got '",
                                    fields[generated_col], "'"));
    }
    if (trace.requests.empty()) first_time = t;
    request.arrival_s = t - first_time;
    if (!trace.requests.empty() && request.arrival_s < trace.requests.back().arrival_s) {
      return row_error(name, line_number, "TIMESTAMP goes backwards");
    }
    trace.requests.push_back(std::move(request));
  }
  if (time_col < 0) return row_error(name, line_number, "empty file: no header row");
  return trace;
}

absl::StatusOr<Trace> parse_mooncake_jsonl(absl::string_view text, absl::string_view name) {
  Trace trace;
  trace.name = std::string(name);
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    absl::StatusOr<Request> request = parse_mooncake_row(line);
    if (!request.ok()) return row_error(name, line_number, request.status().message());
    if (!trace.requests.empty() && request->arrival_s < trace.requests.back().arrival_s) {
      return row_error(name, line_number, "timestamp goes backwards");
    }
    trace.requests.push_back(*std::move(request));
  }
  return trace;
}

absl::StatusOr<Trace> read_azure_csv(const std::string& path) {
  absl::StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  return parse_azure_csv(*text, stem(path));
}

absl::StatusOr<Trace> read_mooncake_jsonl(const std::string& path) {
  absl::StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  return parse_mooncake_jsonl(*text, absl::StrCat("mooncake_", stem(path)));
}

absl::StatusOr<Trace> read_trace(const std::string& path) {
  if (absl::EndsWith(path, ".csv")) return read_azure_csv(path);
  if (absl::EndsWith(path, ".jsonl")) return read_mooncake_jsonl(path);
  return absl::InvalidArgumentError(
      absl::StrCat("trace '", path, "': unknown format (expected .csv or .jsonl)"));
}

ClampStats clamp_to_model_len(Trace& trace, int32_t max_model_len) {
  ClampStats stats;
  for (Request& r : trace.requests) {
    if (r.input_length >= max_model_len) {
      r.input_length = max_model_len - 1;
      if (!r.hash_ids.empty()) {
        r.hash_ids.resize((r.input_length + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens);
      }
      r.system_prompt_length = std::min(r.system_prompt_length, r.input_length);
      ++stats.prompts_truncated;
    }
    if (r.input_length + r.output_length > max_model_len) {
      r.output_length = max_model_len - r.input_length;
      ++stats.outputs_clamped;
    }
  }
  return stats;
}

void truncate_trace(Trace& trace, int64_t max_requests) {
  if (max_requests >= 0 && static_cast<int64_t>(trace.requests.size()) > max_requests) {
    trace.requests.resize(max_requests);
  }
}

void scale_arrivals(Trace& trace, double factor) {
  for (Request& r : trace.requests) r.arrival_s /= factor;
}

}  // namespace pagedkv::sim
