#include "trace.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

// A minimal JSON reader for one Mooncake row: an object whose values we need are integers
// and an array of integers; other values are skipped.
class JsonRow {
 public:
  explicit JsonRow(absl::string_view text) : text_(text) {}

  // Calls on_int(key, value) / on_int_array(key, values) for the top-level members.
  template <typename OnInt, typename OnArray>
  absl::Status parse(OnInt on_int, OnArray on_int_array) {
    skip_ws();
    if (!consume('{')) return error("expected '{'");
    skip_ws();
    if (consume('}')) return trailing();
    while (true) {
      skip_ws();
      std::string key;
      if (absl::Status s = parse_string(&key); !s.ok()) return s;
      skip_ws();
      if (!consume(':')) return error(absl::StrCat("expected ':' after \"", key, "\""));
      skip_ws();
      if (peek() == '[') {
        std::vector<int64_t> values;
        bool all_ints = true;
        if (absl::Status s = parse_array(&values, &all_ints); !s.ok()) return s;
        if (all_ints) on_int_array(key, std::move(values));
      } else if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
        absl::string_view number = take_number();
        int64_t value;
        if (parse_int(number, &value)) {
          on_int(key, value);
        } else if (double d; parse_double(number, &d)) {
          // Non-integer numbers are reported as "not an integer" by the caller's checks.
          on_int(key,
                 std::isfinite(d) && d == std::floor(d) ? static_cast<int64_t>(d) : kNotInteger);
        } else {
          return error(absl::StrCat("bad number '", number, "' for \"", key, "\""));
        }
      } else {
        if (absl::Status s = skip_value(); !s.ok()) return s;
      }
      skip_ws();
      if (consume(',')) continue;
      if (consume('}')) return trailing();
      return error("expected ',' or '}'");
    }
  }

  static constexpr int64_t kNotInteger = INT64_MIN;

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool consume(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void skip_ws() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\n')) {
      ++pos_;
    }
  }
  absl::Status error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at column ", pos_ + 1));
  }
  absl::Status trailing() {
    skip_ws();
    if (pos_ != text_.size()) return error("unexpected text after the object");
    return absl::OkStatus();
  }
  static bool parse_double(absl::string_view text, double* out) {
    std::string copy(text);
    char* end = nullptr;
    *out = std::strtod(copy.c_str(), &end);
    return end == copy.c_str() + copy.size();
  }
  absl::string_view take_number() {
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-' ||
            text_[pos_] == '+' || text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }
  absl::Status parse_string(std::string* out) {
    if (!consume('"')) return error("expected a string");
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] == '\\') {
        ++pos_;
        if (pos_ >= text_.size()) break;
      }
      out->push_back(text_[pos_++]);
    }
    if (!consume('"')) return error("unterminated string");
    return absl::OkStatus();
  }
  absl::Status parse_array(std::vector<int64_t>* values, bool* all_ints) {
    consume('[');
    skip_ws();
    if (consume(']')) return absl::OkStatus();
    while (true) {
      skip_ws();
      if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
        absl::string_view number = take_number();
        int64_t value;
        if (parse_int(number, &value)) {
          values->push_back(value);
        } else {
          *all_ints = false;
        }
      } else {
        *all_ints = false;
        if (absl::Status s = skip_value(); !s.ok()) return s;
      }
      skip_ws();
      if (consume(',')) continue;
      if (consume(']')) return absl::OkStatus();
      return error("expected ',' or ']' in an array");
    }
  }
  absl::Status skip_value() {
    skip_ws();
    char c = peek();
    if (c == '"') {
      std::string ignored;
      return parse_string(&ignored);
    }
    if (c == '[' || c == '{') {
      // Skips a nested value by bracket depth, honouring strings.
      int depth = 0;
      do {
        char d = peek();
        if (d == '\0') return error("unterminated array or object");
        if (d == '"') {
          std::string ignored;
          if (absl::Status s = parse_string(&ignored); !s.ok()) return s;
          continue;
        }
        if (d == '[' || d == '{') ++depth;
        if (d == ']' || d == '}') --depth;
        ++pos_;
      } while (depth > 0);
      return absl::OkStatus();
    }
    for (absl::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return absl::OkStatus();
      }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      take_number();
      return absl::OkStatus();
    }
    return error("unexpected character");
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

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
    int64_t timestamp = -1, input = -1, output = -1;
    bool has_hash_ids = false;
    Request request;
    absl::Status s = JsonRow(line).parse(
        [&](const std::string& key, int64_t value) {
          if (key == "timestamp") timestamp = value;
          if (key == "input_length") input = value;
          if (key == "output_length") output = value;
        },
        [&](const std::string& key, std::vector<int64_t> values) {
          if (key == "hash_ids") {
            has_hash_ids = true;
            request.hash_ids = std::move(values);
          }
        });
    if (!s.ok()) return row_error(name, line_number, s.message());
    if (timestamp < 0) {
      return row_error(name, line_number, "missing or negative integer \"timestamp\" (ms)");
    }
    if (input <= 0 || input > INT32_MAX) {
      return row_error(name, line_number, "\"input_length\" must be a positive int32");
    }
    if (output <= 0 || output > INT32_MAX) {
      return row_error(name, line_number, "\"output_length\" must be a positive int32");
    }
    if (!has_hash_ids) {
      return row_error(name, line_number, "missing integer array \"hash_ids\"");
    }
    const int64_t expected = (input + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
    if (static_cast<int64_t>(request.hash_ids.size()) != expected) {
      return row_error(name, line_number,
                       absl::StrCat("hash_ids has ", request.hash_ids.size(), " ids, input_length ",
                                    input, " needs ceil(", input, " / 512) = ", expected));
    }
    request.arrival_s = static_cast<double>(timestamp) / 1000.0;
    request.input_length = static_cast<int32_t>(input);
    request.output_length = static_cast<int32_t>(output);
    if (!trace.requests.empty() && request.arrival_s < trace.requests.back().arrival_s) {
      return row_error(name, line_number, "timestamp goes backwards");
    }
    trace.requests.push_back(std::move(request));
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
