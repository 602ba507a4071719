// File: examples/simulator/eviction.h
//
// The eviction study: block-level prefix hit rate of a single pool of C blocks under the
// replay rule of shared/traces/README.md, for LRU (the library's BlockPool, whose free
// queue is the LRU order) and for the offline optimum (Belady's MIN).
//
// Replay rule: requests are replayed one by one in file order. A request's hits are the
// longest prefix of its blocks already in the pool. Then all of its blocks are inserted
// or touched from tail to head, so head blocks end up most recent. No concurrency, no
// pinning across requests, no decode blocks.
//
// LRU with BlockPool (block_size 1: one pool block stands for one 512-token trace block,
// whose single token is derived from its hash id): the hit prefix is found with
// find_cached() along the chain, hit blocks are touched, the missing ones allocated (which
// evicts from the head of the free queue, the least recently used) and cached, and the
// request's blocks are then freed tail to head, so the head ends up at the queue's tail.
//
// Belady: the cached block whose next use (in the flattened reference stream) is farthest
// in the future is evicted; a missing block whose own next use is farther than every
// cached block's is not inserted (bypass), which is what makes MIN optimal. Parents are
// always used no later than their children, so both pools stay prefix-closed and "longest
// cached prefix" equals "blocks present".
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_EVICTION_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_EVICTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trace.h"

namespace pagedkv::sim {

// Block id streams: one vector of hash ids per request, in file order.
using BlockStreams = std::vector<std::vector<int64_t>>;

BlockStreams block_streams(const Trace& trace);

struct ReplayResult {
  int64_t capacity = 0;      // blocks in the pool
  int64_t total_blocks = 0;  // block references replayed
  int64_t hit_blocks = 0;    // references inside a request's cached prefix
  int64_t evictions = 0;     // cached blocks dropped to make room
  int64_t unregistered = 0;  // LRU only: missing blocks whose hash was already indexed
                             // (a prefix-closure violation; 0 on well-formed traces)
  double hit_rate() const {
    return total_blocks == 0 ? 0.0 : static_cast<double>(hit_blocks) / total_blocks;
  }
};

// Number of distinct block ids: the pool size at which nothing is ever evicted.
int64_t distinct_blocks(const BlockStreams& streams);

// LRU replay on a pagedkv BlockPool of `capacity` blocks. Errors: InvalidArgument when
// capacity < 1 or a request has more blocks than the pool.
[[nodiscard]] absl::StatusOr<ReplayResult> replay_lru(const BlockStreams& streams,
                                                      int32_t capacity);

// Belady (MIN) replay with `capacity` blocks. Errors: InvalidArgument when capacity < 1.
[[nodiscard]] absl::StatusOr<ReplayResult> replay_belady(const BlockStreams& streams,
                                                         int64_t capacity);

struct EvictionRow {
  int64_t capacity = 0;
  bool infinite = false;  // capacity == distinct_blocks(): nothing is ever evicted
  ReplayResult lru;
  ReplayResult belady;
};

// Both replays at each capacity, then at the infinite size.
[[nodiscard]] absl::StatusOr<std::vector<EvictionRow>> eviction_study(
    const BlockStreams& streams, const std::vector<int32_t>& capacities);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_EVICTION_H_
