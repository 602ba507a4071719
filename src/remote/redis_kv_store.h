// File: src/remote/redis_kv_store.h
//
// RedisKvStore: the QueuedKvStore backend behind create_redis_kv_store(). Everything
// here runs on the I/O thread, except the constructor and the URL parser.
#ifndef PAGEDKV_REMOTE_REDIS_KV_STORE_H_
#define PAGEDKV_REMOTE_REDIS_KV_STORE_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/redis_kv_store.h"
#include "remote/queued_kv_store.h"

struct redisContext;

namespace pagedkv::internal {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
};

// Parses "redis://HOST:PORT[/DB]" (HOST may be "[IPv6]"). InvalidArgument on anything
// else, a password included.
absl::StatusOr<RedisEndpoint> parse_redis_url(const std::string& url);

class RedisKvStore final : public QueuedKvStore {
 public:
  RedisKvStore(const RedisKvStoreOptions& options, RedisEndpoint endpoint, std::string password);
  ~RedisKvStore() override;

 private:
  void run_batch(RemoteRequest& request, RemoteCompletion* done) override;

  // Connected (and authenticated, db selected) or why not; honours the backoff.
  absl::Status ensure_connected();
  absl::Status connect_once();
  void disconnect();
  // The failed context's error; disconnects: after a failed write or read the replies
  // still due would pair with the wrong commands.
  absl::Status connection_lost();
  // Sends keys [begin, end) pipelined and reads their replies into `done`. A failed
  // connection: disconnected, the rest of the chunk stays kError, the status says why.
  absl::Status run_chunk(const RemoteRequest& request, size_t begin, size_t end,
                         RemoteCompletion* done);

  const RedisKvStoreOptions options_;
  const RedisEndpoint endpoint_;
  const std::string password_;  // never logged

  redisContext* context_ = nullptr;  // I/O thread only; null: not connected
  bool ever_connected_ = false;
  std::chrono::milliseconds backoff_{0};
  std::chrono::steady_clock::time_point next_connect_{};
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_REMOTE_REDIS_KV_STORE_H_
