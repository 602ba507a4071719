// --kv-events: the engine's KV events published for KV-aware routers
// (pagedkv::KvEventPublisher, vLLM's wire format; docs/events.md).
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_KV_EVENT_FEED_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_KV_EVENT_FEED_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_event_publisher.h"
#include "pagedkv/kv_events.h"

namespace decode_loop {

struct KvEventFeedOptions {
  std::string endpoint;         // PUB, bound
  std::string replay_endpoint;  // ROUTER, bound; empty: none
  // CURVE (KvEventPublisher::Options): both empty, or both set.
  std::string curve_secret_key_file;
  std::string curve_allowed_clients_dir;
};

class KvEventFeed {
 public:
  // Binds the PUB (and, unless empty, ROUTER) endpoints and prints them on stderr, with a
  // warning for an endpoint that other machines can reach while CURVE is off.
  // Unimplemented when pagedkv was built without pagedkv::events.
  static absl::StatusOr<std::unique_ptr<KvEventFeed>> start(const KvEventFeedOptions& options);
  virtual ~KvEventFeed() = default;
  virtual pagedkv::KvEventSink* sink() = 0;
  virtual void end_step() = 0;
  // The sequence number the next batch would get: batches [0, next_seq) were handed to
  // the publisher thread.
  virtual int64_t next_seq() const = 0;
  // The publisher's counters (any thread).
  virtual pagedkv::KvEventPublisher::Stats stats() const = 0;
  // Waits, at most `timeout_s`, until the publisher thread has sent (or dropped, counted)
  // every batch handed to it, so that a router told next_seq() can replay all of them.
  // Returns whether it has.
  virtual bool wait_until_sent(double timeout_s) = 0;
};

// Whether a bound `endpoint` is reachable from other machines: a tcp:// endpoint whose
// host is not loopback (127.0.0.0/8, ::1, localhost, lo). ipc:// and inproc:// are local.
bool reachable_from_network(const std::string& endpoint);

// Prints a warning on stderr, naming `program` and the endpoint, for each endpoint that is
// reachable from the network while CURVE is off: anyone who reaches it reads the events.
void warn_if_exposed(const char* program, const std::string& endpoint, bool curve);

// Writes the prefix index of both tiers to `path`, for comparison with a router's index:
// one line "HASH MEDIUM" per cached block, HASH in 32 hex digits as the events send it (hi
// then lo), MEDIUM as the events name it ("GPU": device pool, "CPU": host tier), sorted.
// False on I/O error.
bool write_prefix_index(const pagedkv::KvCacheManager& manager, const std::string& path);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_KV_EVENT_FEED_H_
