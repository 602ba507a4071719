// File: pagedkv/remote_kv_store.h
//
// RemoteKvStore: a store of KV block payloads shared by engines (Redis, a directory on a
// shared filesystem), batched and asynchronous. It is the slice of the remote tier that
// moves bytes; the tier above it (behind the host tier, DESIGN.md) builds the keys, frames
// and verifies the payloads and decides what to admit. docs/remote.md covers the backends
// and their fault behaviour.
//
// Threading: one caller thread (the scheduler) enqueues put(), get() and exists() of a
// batch of keys and polls completions; none of these calls waits for I/O. They take a
// short lock to hand the batch to the store's own I/O thread, which runs the batches in
// the order they were accepted. stats() may be read from any thread.
//
// Every accepted request (an id returned) gets exactly one RemoteCompletion from poll(),
// also when it fails: a backend that is down, a timeout or a full queue complete the
// request with per-key errors or misses instead of holding it back. A refused request
// (an error Status) gets none and changes nothing, the stats included.
//
// Memory is bounded: at most Options::max_queued_requests requests and
// Options::max_queued_bytes bytes of values wait for the I/O thread. A put that does not
// fit is dropped (RemoteKvStats::dropped_puts) and a get or exists that does not fit
// completes at once as misses (RemoteKvStats::failed_fast); both completions carry
// `queue_full`. Completions wait in poll()'s queue until taken: poll regularly.
//
// Example (in a function returning a Status; `store` from create_redis_kv_store()):
//   std::vector<std::string> keys = {remote_block_key(ns, hash)};
//   auto put_id = store->put(keys, {std::move(payload)});
//   if (!put_id.ok()) return put_id.status();
//   auto get_id = store->get(std::move(keys));
//   if (!get_id.ok()) return get_id.status();
//   std::vector<RemoteCompletion> done;
//   store->poll(&done);  // later, once per scheduler step
//   for (const RemoteCompletion& c : done)
//     if (c.id == *get_id && c.results[0] == RemoteKeyResult::kOk) use(c.values[0]);
#ifndef PAGEDKV_REMOTE_KV_STORE_H_
#define PAGEDKV_REMOTE_KV_STORE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/types.h"

namespace pagedkv {

// The key of a block's payload in a remote store: "pagedkv:<namespace_digest>:<hash>",
// the hash as 32 lowercase hex digits (hi then lo). `namespace_digest` names everything
// that makes two engines' blocks interchangeable (model, dtype, layout, block size,
// layers, TP rank); the tier above computes it, as printable text without ':'. Inline,
// so that the allocator can build keys without linking a backend.
inline std::string remote_block_key(std::string_view namespace_digest, const BlockHash& hash) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string key = "pagedkv:";
  key.append(namespace_digest);
  key.push_back(':');
  for (const uint64_t half : {hash.hi, hash.lo}) {
    for (int shift = 60; shift >= 0; shift -= 4) key.push_back(kHex[(half >> shift) & 0xf]);
  }
  return key;
}

using RemoteRequestId = uint64_t;

enum class RemoteOp : uint8_t { kPut, kGet, kExists };

// The outcome for one key of a request.
enum class RemoteKeyResult : uint8_t {
  kOk,        // put: stored; get: found, value in RemoteCompletion::values; exists: present
  kNotFound,  // get, exists: no such key (or the request failed fast on a full queue)
  kError,     // the backend failed (down, timeout, reply error) or the put was dropped
};

struct RemoteCompletion {
  RemoteRequestId id = 0;
  RemoteOp op = RemoteOp::kGet;
  std::vector<RemoteKeyResult> results{};  // one per key, in the request's order
  std::vector<std::string> values{};       // get: one per key, empty unless kOk; else none
  bool queue_full = false;  // never sent: the queue was full (put dropped, get missed)
  absl::Status error{};     // the first backend error of the request, for logs; else OK
  int64_t latency_us = 0;   // from enqueue to completion, queueing included
};

// Completion latency histogram: bucket i counts latencies <= kRemoteLatencyBoundsUs[i]
// microseconds (and above the previous bound); the last bucket counts the rest.
inline constexpr std::array<int64_t, 13> kRemoteLatencyBoundsUs = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000};

// Counters since the store was created. Requests are counted when they complete; keys
// of dropped or failed-fast requests count in dropped_puts / failed_fast, not in puts,
// gets, hits or misses.
struct RemoteKvStats {
  int64_t requests = 0;         // completions handed out or waiting, queue-full ones included
  int64_t puts = 0;             // keys put, stored or not
  int64_t gets = 0;             // keys asked by get or exists
  int64_t hits = 0;             // of those, found
  int64_t misses = 0;           // of those, not found
  int64_t errors = 0;           // keys that completed with kError (dropped puts excluded)
  int64_t bytes_written = 0;    // value bytes stored
  int64_t bytes_read = 0;       // value bytes returned by gets
  int64_t reconnects = 0;       // connections re-established after a failure
  int64_t redirects = 0;        // MOVED / ASK replies received (Redis Cluster)
  int64_t dropped_puts = 0;     // put requests dropped on a full queue
  int64_t failed_fast = 0;      // get and exists requests missed on a full queue
  int64_t queued_requests = 0;  // waiting for the I/O thread now (gauge)
  int64_t queued_bytes = 0;     // their value bytes now (gauge)
  int64_t latency_sum_us = 0;   // over requests that reached the I/O thread
  int64_t latency_max_us = 0;
  std::array<int64_t, kRemoteLatencyBoundsUs.size() + 1> latency_histogram = {};
};

// Limits every backend honours (each backend's Options holds one).
struct RemoteKvLimits {
  int64_t max_value_bytes = 64 << 20;    // a larger value is refused (InvalidArgument)
  int32_t max_key_bytes = 512;           // a longer key is refused (InvalidArgument)
  int32_t max_queued_requests = 256;     // requests waiting for the I/O thread
  int64_t max_queued_bytes = 1ll << 30;  // value bytes waiting for the I/O thread
};

class RemoteKvStore {
 public:
  virtual ~RemoteKvStore() = default;

  // RemoteKvStore::put()
  //
  // Enqueues storing values[i] under keys[i]; an existing key is overwritten. Returns the
  // request's id; its completion has one result per key (kOk: stored).
  // Errors (nothing enqueued, nothing counted): InvalidArgument for an empty batch,
  // keys.size() != values.size(), an empty key, a key over max_key_bytes or a value over
  // max_value_bytes; the message names the index, the size and the limit.
  [[nodiscard]] virtual absl::StatusOr<RemoteRequestId> put(std::vector<std::string> keys,
                                                            std::vector<std::string> values) = 0;

  // RemoteKvStore::get()
  //
  // Enqueues reading `keys`. The completion has one result per key and, for each kOk,
  // its value. Errors: InvalidArgument as for put().
  [[nodiscard]] virtual absl::StatusOr<RemoteRequestId> get(std::vector<std::string> keys) = 0;

  // RemoteKvStore::exists()
  //
  // Enqueues asking whether `keys` are present, without moving their values.
  // Errors: InvalidArgument as for put().
  [[nodiscard]] virtual absl::StatusOr<RemoteRequestId> exists(std::vector<std::string> keys) = 0;

  // RemoteKvStore::poll()
  //
  // Moves up to `max_completions` finished requests, oldest first, to the end of `out`;
  // returns how many. Never waits.
  virtual size_t poll(std::vector<RemoteCompletion>* out, size_t max_completions = SIZE_MAX) = 0;

  // RemoteKvStore::stats()
  //
  // A consistent snapshot of the counters; callable from any thread.
  virtual RemoteKvStats stats() const = 0;
};

}  // namespace pagedkv

#endif  // PAGEDKV_REMOTE_KV_STORE_H_
