// --kv-events: the engine's KV events published for KV-aware routers
// (pagedkv::KvEventPublisher, vLLM's wire format; docs/events.md).
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_KV_EVENT_FEED_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_KV_EVENT_FEED_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_events.h"

namespace decode_loop {

class KvEventFeed {
 public:
  // Binds the PUB (and, unless empty, ROUTER) endpoints and prints them on stderr.
  // Unimplemented when pagedkv was built without pagedkv::events.
  static absl::StatusOr<std::unique_ptr<KvEventFeed>> start(const std::string& endpoint,
                                                            const std::string& replay_endpoint);
  virtual ~KvEventFeed() = default;
  virtual pagedkv::KvEventSink* sink() = 0;
  virtual void end_step() = 0;
  // The sequence number the next batch would get: batches [0, next_seq) were handed to
  // the publisher thread.
  virtual int64_t next_seq() const = 0;
  // Waits, at most `timeout_s`, until the publisher thread has sent (or dropped, counted)
  // every batch handed to it, so that a router told next_seq() can replay all of them.
  // Returns whether it has.
  virtual bool wait_until_sent(double timeout_s) = 0;
};

// Writes the prefix index of both tiers to `path`, for comparison with a router's index:
// one line "HASH MEDIUM" per cached block, HASH in 32 hex digits as the events send it (hi
// then lo), MEDIUM as the events name it ("GPU": device pool, "CPU": host tier), sorted.
// False on I/O error.
bool write_prefix_index(const pagedkv::KvCacheManager& manager, const std::string& path);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_KV_EVENT_FEED_H_
