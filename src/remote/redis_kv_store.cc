#include "remote/redis_kv_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
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
// their size: bounds the output buffer for batches of many small values.
constexpr size_t kMaxPipelineCommands = 1024;

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
  const std::array<std::pair<const char*, int64_t>, 10> positive = {{
      {"connect_timeout_ms", options.connect_timeout_ms},
      {"command_timeout_ms", options.command_timeout_ms},
      {"reconnect_backoff_min_ms", options.reconnect_backoff_min_ms},
      {"reconnect_backoff_max_ms", options.reconnect_backoff_max_ms},
      {"pipeline_bytes", options.pipeline_bytes},
      {"max_redirects", options.max_redirects},
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
      settings_{.connect_timeout_ms = options.connect_timeout_ms,
                .command_timeout_ms = options.command_timeout_ms,
                .reconnect_backoff_min_ms = options.reconnect_backoff_min_ms,
                .reconnect_backoff_max_ms = options.reconnect_backoff_max_ms,
                .username = options.username,
                .password = std::move(password),
                .db = endpoint.db} {
  nodes_.push_back(std::make_unique<RedisConnection>(
      RedisNodeAddress{.host = std::move(endpoint.host), .port = endpoint.port}, &settings_));
  start_io_thread();
}

RedisKvStore::~RedisKvStore() { stop_io_thread(); }

absl::Status RedisKvStore::connect(size_t node, BatchState& batch) {
  if (batch.node_failed.size() < nodes_.size()) batch.node_failed.resize(nodes_.size());
  if (!batch.node_failed[node].ok()) return batch.node_failed[node];
  bool reconnected = false;
  absl::Status status = nodes_[node]->ensure_connected(&reconnected);
  if (reconnected) count_reconnect();
  if (!status.ok()) node_lost(node, status, batch);
  return status;
}

void RedisKvStore::node_lost(size_t node, const absl::Status& status, BatchState& batch) {
  batch.node_failed[node] = status;
  // A cluster node that fails may have been replaced by its replica: read the map again.
  map_stale_ = mode_ == Mode::kCluster;
}

absl::Status RedisKvStore::discover_mode(BatchState& batch) {
  if (absl::Status status = connect(0, batch); !status.ok()) return status;
  absl::StatusOr<RedisReplyPtr> info = nodes_[0]->command({"INFO", "cluster"});
  if (!info.ok()) {
    node_lost(0, info.status(), batch);
    return info.status();
  }
  // An error reply (INFO not allowed for this ACL user, say) reads as a single server.
  const redisReply& reply = **info;
  const bool cluster =
      reply.type == REDIS_REPLY_STRING &&
      absl::StrContains(absl::string_view(reply.str, reply.len), "cluster_enabled:1");
  mode_ = cluster ? Mode::kCluster : Mode::kSingle;
  if (cluster) {
    slot_owner_.assign(kRedisClusterSlots, -1);
    // Without a map every key goes to the URL's server and follows its MOVED replies.
    refresh_slot_map(batch).IgnoreError();
  }
  return absl::OkStatus();
}

absl::Status RedisKvStore::refresh_slot_map(BatchState& batch) {
  batch.map_refreshed = true;
  absl::Status why = absl::UnavailableError("CLUSTER SLOTS: no node answered");
  for (size_t node = 0; node < nodes_.size(); ++node) {
    if (absl::Status status = connect(node, batch); !status.ok()) {
      why = status;
      continue;
    }
    RedisConnection& connection = *nodes_[node];
    absl::StatusOr<RedisReplyPtr> reply = connection.command({"CLUSTER", "SLOTS"});
    if (!reply.ok()) {
      node_lost(node, reply.status(), batch);
      why = reply.status();
      continue;
    }
    absl::StatusOr<std::vector<RedisSlotRange>> ranges =
        (*reply)->type == REDIS_REPLY_ERROR
            ? absl::InternalError(std::string((*reply)->str, (*reply)->len))
            : parse_cluster_slots(**reply, connection.address().host);
    if (!ranges.ok()) {
      why = absl::Status(ranges.status().code(),
                         absl::StrCat(connection.name(), ": ", ranges.status().message()));
      continue;
    }
    std::fill(slot_owner_.begin(), slot_owner_.end(), -1);
    for (const RedisSlotRange& range : *ranges) {
      const auto owner = static_cast<int32_t>(node_index(range.master));
      std::fill(slot_owner_.begin() + range.first, slot_owner_.begin() + range.last + 1, owner);
    }
    map_stale_ = false;  // also when a node failed on the way: this map is newer
    return absl::OkStatus();
  }
  return why;
}

size_t RedisKvStore::node_index(const RedisNodeAddress& address) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->address() == address) return i;
  }
  nodes_.push_back(std::make_unique<RedisConnection>(address, &settings_));
  return nodes_.size() - 1;
}

void RedisKvStore::fail_key(size_t key, absl::Status status, RemoteCompletion* done) {
  done->results[key] = RemoteKeyResult::kError;
  if (!done->values.empty()) done->values[key].clear();
  if (done->error.ok()) done->error = std::move(status);
}

void RedisKvStore::read_replies(const RemoteRequest& request, size_t node,
                                const std::vector<Routed>& keys, BatchState& batch,
                                RemoteCompletion* done, std::vector<Routed>* next) {
  RedisConnection& connection = *nodes_[node];
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t key = keys[k].key;
    // ASKING's own reply (+OK) first; were it an error, the command's reply says so too.
    absl::StatusOr<RespReply> reply = RespReply{};
    if (keys[k].asking) reply = connection.read_reply(nullptr);
    if (reply.ok()) {
      reply = connection.read_reply(request.op == RemoteOp::kGet ? &done->values[key] : nullptr);
    }
    if (!reply.ok()) {  // lost: this key and the rest of this node's keys fail
      node_lost(node, reply.status(), batch);
      for (size_t rest = k; rest < keys.size(); ++rest) {
        fail_key(keys[rest].key, reply.status(), done);
      }
      return;
    }
    RemoteKeyResult& result = done->results[key];
    switch (reply->type) {
      case RespReply::Type::kStatus:  // SET: +OK
      case RespReply::Type::kBulk:    // GET: the value, already in done->values[key]
        result = RemoteKeyResult::kOk;
        break;
      case RespReply::Type::kNil:  // GET: no such key
        result = RemoteKeyResult::kNotFound;
        break;
      case RespReply::Type::kInteger:  // EXISTS: 1 or 0
        result = reply->integer > 0 ? RemoteKeyResult::kOk : RemoteKeyResult::kNotFound;
        break;
      case RespReply::Type::kError: {  // MOVED, ASK, or OOM, WRONGTYPE ... for this key
        const std::optional<RedisRedirect> redirect =
            mode_ == Mode::kCluster ? parse_redis_redirect(reply->text) : std::nullopt;
        if (!redirect) {
          fail_key(key,
                   absl::InternalError(absl::StrCat(connection.name(), ": key '", request.keys[key],
                                                    "': ", reply->text)),
                   done);
          break;
        }
        batch.redirects += 1;
        const size_t to = node_index(redirect->node);
        if (!redirect->ask) {
          slot_owner_[redirect->slot] = static_cast<int32_t>(to);
          batch.moved.emplace_back(redirect->slot, to);
        }
        next->push_back({.key = key, .node = to, .asking = redirect->ask});
        break;
      }
    }
  }
}

std::vector<RedisKvStore::Routed> RedisKvStore::run_round(const RemoteRequest& request,
                                                          const std::vector<Routed>& round,
                                                          BatchState& batch,
                                                          RemoteCompletion* done) {
  // Each node's keys in request order; every node's pipeline is sent before any reply is
  // read, so that the nodes work in parallel.
  std::vector<std::vector<Routed>> by_node(nodes_.size());
  for (const Routed& routed : round) by_node[routed.node].push_back(routed);
  std::vector<size_t> sent;
  for (size_t node = 0; node < by_node.size(); ++node) {
    if (by_node[node].empty()) continue;
    absl::Status status = connect(node, batch);
    if (status.ok()) {
      RedisConnection& connection = *nodes_[node];
      for (const Routed& routed : by_node[node]) {
        if (routed.asking) connection.append({"ASKING"});
        const std::string& key = request.keys[routed.key];
        switch (request.op) {
          case RemoteOp::kPut:
            connection.append_with_value({"SET", key}, request.values[routed.key]);
            break;
          case RemoteOp::kGet:
            connection.append({"GET", key});
            break;
          case RemoteOp::kExists:
            connection.append({"EXISTS", key});
            break;
        }
      }
      status = connection.flush();
      if (!status.ok()) node_lost(node, status, batch);
    }
    if (!status.ok()) {
      for (const Routed& routed : by_node[node]) fail_key(routed.key, status, done);
      continue;
    }
    sent.push_back(node);
  }
  std::vector<Routed> next;
  batch.moved.clear();
  for (const size_t node : sent) read_replies(request, node, by_node[node], batch, done, &next);
  if (!batch.moved.empty() && !batch.map_refreshed) {
    // A slot moved: others may have too. The map read now may lag the MOVED replies just
    // seen (the node asked may not know yet), so those stay as the replies said.
    if (refresh_slot_map(batch).ok()) {
      for (const auto& [slot, node] : batch.moved) slot_owner_[slot] = static_cast<int32_t>(node);
    }
  }
  return next;
}

void RedisKvStore::run_chunk(const RemoteRequest& request, size_t begin, size_t end,
                             BatchState& batch, RemoteCompletion* done) {
  std::vector<Routed> round;
  for (size_t key = begin; key < end; ++key) {
    const int32_t owner =
        mode_ == Mode::kCluster ? slot_owner_[redis_key_slot(request.keys[key])] : 0;
    round.push_back({.key = key, .node = owner >= 0 ? static_cast<size_t>(owner) : 0});
  }
  for (int32_t redirects = 0; !round.empty(); ++redirects) {
    if (redirects > options_.max_redirects) {
      for (const Routed& routed : round) {
        fail_key(routed.key,
                 absl::UnavailableError(absl::StrCat(
                     nodes_[routed.node]->name(), ": key '", request.keys[routed.key],
                     "': still redirected after max_redirects ", options_.max_redirects)),
                 done);
      }
      return;
    }
    round = run_round(request, round, batch, done);
  }
}

void RedisKvStore::run_batch(RemoteRequest& request, RemoteCompletion* done) {
  BatchState batch{.node_failed = std::vector<absl::Status>(nodes_.size())};
  if (mode_ == Mode::kUnknown) {
    if (absl::Status status = discover_mode(batch); !status.ok()) {
      done->error = std::move(status);
      return;
    }
  } else if (map_stale_) {
    // Without a fresh map the keys still go out, to the owners last known.
    refresh_slot_map(batch).IgnoreError();
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
    run_chunk(request, begin, end, batch, done);
    begin = end;
  }
  if (batch.redirects > 0) count_redirects(batch.redirects);
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
