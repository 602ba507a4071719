#include "remote/redis_kv_store.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace pagedkv {
namespace internal {
namespace {

// At most this many commands are appended before their replies are read, whatever
// their size: bounds hiredis' output buffer for batches of many small values.
constexpr size_t kMaxPipelineCommands = 1024;

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

timeval to_timeval(int32_t ms) {
  return timeval{.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

absl::StatusOr<std::string> read_password(const RedisKvStoreOptions& options) {
  if (!options.password_env.empty() && !options.password_file.empty()) {
    return absl::InvalidArgumentError("redis: set password_env or password_file, not both");
  }
  if (!options.password_env.empty()) {
    const char* value = std::getenv(options.password_env.c_str());
    if (value == nullptr || *value == '\0') {
      return absl::InvalidArgumentError(absl::StrCat(
          "redis: password_env names ", options.password_env, ", which is unset or empty"));
    }
    return std::string(value);
  }
  if (!options.password_file.empty()) {
    std::ifstream file(options.password_file);
    std::string line;
    if (!file || !std::getline(file, line) || line.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("redis: password_file ", options.password_file,
                                                     " cannot be read or its first line is empty"));
    }
    if (line.back() == '\r') line.pop_back();
    return line;
  }
  return std::string();
}

absl::Status check_options(const RedisKvStoreOptions& options) {
  const std::array<std::pair<const char*, int64_t>, 9> positive = {{
      {"connect_timeout_ms", options.connect_timeout_ms},
      {"command_timeout_ms", options.command_timeout_ms},
      {"reconnect_backoff_min_ms", options.reconnect_backoff_min_ms},
      {"reconnect_backoff_max_ms", options.reconnect_backoff_max_ms},
      {"pipeline_bytes", options.pipeline_bytes},
      {"limits.max_value_bytes", options.limits.max_value_bytes},
      {"limits.max_key_bytes", options.limits.max_key_bytes},
      {"limits.max_queued_requests", options.limits.max_queued_requests},
      {"limits.max_queued_bytes", options.limits.max_queued_bytes},
  }};
  for (const auto& [name, value] : positive) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis: ", name, " is ", value, "; it must be positive"));
    }
  }
  return absl::OkStatus();
}

// "redis HOST:PORT", the prefix of every message about the server.
std::string server_name(const RedisEndpoint& endpoint) {
  return absl::StrCat("redis ", endpoint.host, ":", endpoint.port);
}

// The status of a failed context, for a batch's error.
absl::Status context_error(const RedisEndpoint& endpoint, const redisContext* context,
                           int32_t command_timeout_ms) {
  const bool timed_out = context->err == REDIS_ERR_IO &&
                         (absl::StrContains(context->errstr, "temporarily unavailable") ||
                          absl::StrContains(context->errstr, "timed out"));
  return absl::UnavailableError(absl::StrCat(
      server_name(endpoint), ": ", context->errstr,
      timed_out ? absl::StrCat(" (no reply within command_timeout_ms ", command_timeout_ms, ")")
                : ""));
}

}  // namespace

absl::StatusOr<RedisEndpoint> parse_redis_url(const std::string& url) {
  constexpr absl::string_view kScheme = "redis://";
  const auto invalid = [&url](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis url '", url, "': ", why, " (expected redis://HOST:PORT[/DB])"));
  };
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, kScheme)) return invalid("not a redis:// URL");
  if (absl::StrContains(rest, '@')) {
    return absl::InvalidArgumentError(
        "redis url: credentials in the URL are refused; use password_env or password_file");
  }
  RedisEndpoint endpoint;
  const size_t slash = rest.find('/');
  if (slash != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(slash + 1), &endpoint.db) || endpoint.db < 0) {
      return invalid("the database is not a non-negative number");
    }
    rest = rest.substr(0, slash);
  }
  size_t colon = rest.rfind(':');
  if (absl::StartsWith(rest, "[")) {  // [IPv6]:PORT
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return invalid("unterminated [");
    endpoint.host = std::string(rest.substr(1, close - 1));
    colon = close + 1 < rest.size() && rest[close + 1] == ':' ? close + 1 : absl::string_view::npos;
  } else {
    endpoint.host = std::string(rest.substr(0, colon));
  }
  if (endpoint.host.empty()) return invalid("no host");
  if (colon != absl::string_view::npos &&
      (!absl::SimpleAtoi(rest.substr(colon + 1), &endpoint.port) || endpoint.port <= 0 ||
       endpoint.port > 65535)) {
    return invalid("the port is not a number in 1..65535");
  }
  return endpoint;
}

RedisKvStore::RedisKvStore(const RedisKvStoreOptions& options, RedisEndpoint endpoint,
                           std::string password)
    : QueuedKvStore(options.limits),
      options_(options),
      endpoint_(std::move(endpoint)),
      password_(std::move(password)) {
  start_io_thread();
}

RedisKvStore::~RedisKvStore() {
  stop_io_thread();
  disconnect();
}

void RedisKvStore::disconnect() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

absl::Status RedisKvStore::connect_once() {
  context_ = redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port,
                                     to_timeval(options_.connect_timeout_ms));
  if (context_ == nullptr) return absl::ResourceExhaustedError("redis: cannot allocate a context");
  if (context_->err != 0) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat(server_name(endpoint_), ": connect: ", context_->errstr,
                     " (connect_timeout_ms ", options_.connect_timeout_ms, ")"));
    disconnect();
    return status;
  }
  redisSetTimeout(context_, to_timeval(options_.command_timeout_ms));
  redisEnableKeepAlive(context_);
  // AUTH, then SELECT: each reply checked before the connection serves a batch.
  std::vector<std::vector<std::string>> setup;
  if (!password_.empty()) {
    if (options_.username.empty())
      setup.push_back({"AUTH", password_});
    else
      setup.push_back({"AUTH", options_.username, password_});
  }
  if (endpoint_.db != 0) setup.push_back({"SELECT", std::to_string(endpoint_.db)});
  for (const std::vector<std::string>& command : setup) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& arg : command) {
      argv.push_back(arg.data());
      lengths.push_back(arg.size());
    }
    ReplyPtr reply(static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
    absl::Status status;
    if (reply == nullptr) {
      status = context_error(endpoint_, context_, options_.command_timeout_ms);
    } else if (reply->type == REDIS_REPLY_ERROR) {
      // The server's message ("WRONGPASS ...", "ERR DB index is out of range") names no
      // password; the command's first word says which step failed.
      status = absl::PermissionDeniedError(absl::StrCat(server_name(endpoint_), ": ", command[0],
                                                        ": ", std::string(reply->str, reply->len)));
    }
    if (!status.ok()) {
      disconnect();
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status RedisKvStore::ensure_connected() {
  if (context_ != nullptr) return absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  if (now < next_connect_) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_connect_ - now);
    return absl::UnavailableError(absl::StrCat(server_name(endpoint_),
                                               ": not connected; next attempt in ", wait.count(),
                                               " ms (reconnect backoff)"));
  }
  if (absl::Status status = connect_once(); !status.ok()) {
    backoff_ =
        std::clamp(2 * backoff_, std::chrono::milliseconds(options_.reconnect_backoff_min_ms),
                   std::chrono::milliseconds(options_.reconnect_backoff_max_ms));
    next_connect_ = now + backoff_;
    return status;
  }
  if (ever_connected_) count_reconnect();
  ever_connected_ = true;
  backoff_ = std::chrono::milliseconds(0);
  return absl::OkStatus();
}

absl::Status RedisKvStore::connection_lost() {
  absl::Status status = context_error(endpoint_, context_, options_.command_timeout_ms);
  disconnect();
  return status;
}

absl::Status RedisKvStore::run_chunk(const RemoteRequest& request, size_t begin, size_t end,
                                     RemoteCompletion* done) {
  for (size_t i = begin; i < end; ++i) {
    const std::string& key = request.keys[i];
    int appended = REDIS_ERR;
    if (request.op == RemoteOp::kPut) {
      const std::string& value = request.values[i];
      const char* argv[] = {"SET", key.data(), value.data()};
      const size_t lengths[] = {3, key.size(), value.size()};
      appended = redisAppendCommandArgv(context_, 3, argv, lengths);
    } else {
      const char* name = request.op == RemoteOp::kGet ? "GET" : "EXISTS";
      const char* argv[] = {name, key.data()};
      const size_t lengths[] = {std::char_traits<char>::length(name), key.size()};
      appended = redisAppendCommandArgv(context_, 2, argv, lengths);
    }
    if (appended != REDIS_OK) return connection_lost();
  }
  absl::Status first_reply_error;
  for (size_t i = begin; i < end; ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK) return connection_lost();
    ReplyPtr reply(static_cast<redisReply*>(raw));
    RemoteKeyResult& result = done->results[i];
    switch (reply->type) {
      case REDIS_REPLY_STATUS:  // SET: +OK
        result = RemoteKeyResult::kOk;
        break;
      case REDIS_REPLY_STRING:  // GET: the value
        result = RemoteKeyResult::kOk;
        done->values[i].assign(reply->str, reply->len);
        break;
      case REDIS_REPLY_NIL:  // GET: no such key
        result = RemoteKeyResult::kNotFound;
        break;
      case REDIS_REPLY_INTEGER:  // EXISTS: 1 or 0
        result = reply->integer > 0 ? RemoteKeyResult::kOk : RemoteKeyResult::kNotFound;
        break;
      default:  // REDIS_REPLY_ERROR (OOM, NOAUTH, MOVED ...) or an unexpected type
        result = RemoteKeyResult::kError;
        if (first_reply_error.ok()) {
          first_reply_error = absl::InternalError(absl::StrCat(
              server_name(endpoint_), ": key '", request.keys[i], "': ",
              reply->type == REDIS_REPLY_ERROR ? std::string(reply->str, reply->len)
                                               : absl::StrCat("reply type ", reply->type)));
        }
    }
  }
  return first_reply_error;
}

void RedisKvStore::run_batch(RemoteRequest& request, RemoteCompletion* done) {
  if (absl::Status status = ensure_connected(); !status.ok()) {
    done->error = std::move(status);
    return;
  }
  size_t begin = 0;
  while (begin < request.keys.size()) {
    // A chunk: values up to pipeline_bytes (at least one key), at most kMaxPipelineCommands.
    size_t end = begin;
    int64_t bytes = 0;
    while (end < request.keys.size() && end - begin < kMaxPipelineCommands &&
           (end == begin || request.op != RemoteOp::kPut ||
            bytes + std::ssize(request.values[end]) <= options_.pipeline_bytes)) {
      if (request.op == RemoteOp::kPut) bytes += std::ssize(request.values[end]);
      ++end;
    }
    absl::Status status = run_chunk(request, begin, end, done);
    if (!status.ok() && done->error.ok()) done->error = status;
    if (context_ == nullptr) return;  // lost: the rest stays kError; the next batch reconnects
    begin = end;
  }
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<RemoteKvStore>> create_redis_kv_store(
    const RedisKvStoreOptions& options) {
  if (absl::Status status = internal::check_options(options); !status.ok()) return status;
  absl::StatusOr<internal::RedisEndpoint> endpoint = internal::parse_redis_url(options.url);
  if (!endpoint.ok()) return endpoint.status();
  absl::StatusOr<std::string> password = internal::read_password(options);
  if (!password.ok()) return password.status();
  return std::make_unique<internal::RedisKvStore>(options, *std::move(endpoint),
                                                  *std::move(password));
}

}  // namespace pagedkv
