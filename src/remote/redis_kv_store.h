// File: src/remote/redis_kv_store.h
//
// RedisKvStore: the QueuedKvStore backend behind create_redis_kv_store(), on one server
// or on a Redis Cluster. Everything here runs on the I/O thread, except the constructor
// and the URL parser.
//
// The first batch connects to the URL's server and asks INFO cluster. Without
// cluster_enabled:1 every key goes to that server. With it, the store reads the slot map
// (CLUSTER SLOTS) and sends each key to its slot's master, one lazily opened connection
// per master (nodes_), following -MOVED (the slot's owner in the map is replaced; the
// whole map is read again at most once per batch) and -ASK (ASKING, then the command, to
// the named node; the map unchanged) at most max_redirects times per key.
#ifndef PAGEDKV_REMOTE_REDIS_KV_STORE_H_
#define PAGEDKV_REMOTE_REDIS_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/redis_kv_store.h"
#include "remote/queued_kv_store.h"
#include "remote/redis_connection.h"

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
  // A key of a chunk on its way: the node it goes to next, with ASKING first or not.
  struct Routed {
    size_t key = 0;  // index in the request
    size_t node = 0;
    bool asking = false;
  };
  // Per batch: the first failure of each node (a node that failed is not tried again in
  // the same batch: each costs at most one timeout), whether the map was read again.
  struct BatchState {
    std::vector<absl::Status> node_failed{};
    bool map_refreshed = false;
    int64_t redirects = 0;
    std::vector<std::pair<int, size_t>> moved{};  // (slot, node) of the round's MOVED replies
  };

  void run_batch(RemoteRequest& request, RemoteCompletion* done) override;

  // Connected to nodes_[node], or why not (also when it failed earlier in the batch).
  absl::Status connect(size_t node, BatchState& batch);
  // Records that `node` failed in this batch; in a cluster, the map is then stale.
  void node_lost(size_t node, const absl::Status& status, BatchState& batch);
  // Learns, once, whether the URL's server is a cluster node, and then its slot map.
  absl::Status discover_mode(BatchState& batch);
  // Reads CLUSTER SLOTS from the first node that answers and rebuilds slot_owner_.
  absl::Status refresh_slot_map(BatchState& batch);
  // The index of the node at `address` in nodes_, added (not connected) if new.
  size_t node_index(const RedisNodeAddress& address);
  // Runs keys [begin, end) of `request`: one pipeline per node, then the redirected keys
  // again, at most max_redirects rounds.
  void run_chunk(const RemoteRequest& request, size_t begin, size_t end, BatchState& batch,
                 RemoteCompletion* done);
  // One round: sends each node its keys, reads the replies, and returns the keys
  // redirected elsewhere.
  std::vector<Routed> run_round(const RemoteRequest& request, const std::vector<Routed>& round,
                                BatchState& batch, RemoteCompletion* done);
  // Reads the replies of `keys` from `node`, in order; appends redirected keys to *next.
  void read_replies(const RemoteRequest& request, size_t node, const std::vector<Routed>& keys,
                    BatchState& batch, RemoteCompletion* done, std::vector<Routed>* next);
  // Marks key `key` kError with `status` (its value cleared), the request's first error.
  static void fail_key(size_t key, absl::Status status, RemoteCompletion* done);

  const RedisKvStoreOptions options_;
  const RedisConnectionSettings settings_;  // nodes_ point to it

  enum class Mode : uint8_t { kUnknown, kSingle, kCluster };
  Mode mode_ = Mode::kUnknown;
  std::vector<std::unique_ptr<RedisConnection>> nodes_;  // [0]: the URL's server
  std::vector<int32_t> slot_owner_;  // cluster: index in nodes_ per slot, -1 unknown
  bool map_stale_ = false;           // a node failed: read the map at the next batch
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_REMOTE_REDIS_KV_STORE_H_
