// File: examples/simulator/eviction.h
//
// The eviction studies (docs/results.md "Eviction study" to "Host-tier admission"): the
// block-level prefix hit rate of the Mooncake trace's 512-token blocks under the replay rule
// of shared/traces/README.md. Requests are replayed one by one in file order. A request's
// hits are the longest prefix of its blocks already cached. Then all of its blocks are
// inserted or touched from tail to head, so head blocks end up most recent. No concurrency,
// no decode blocks. Every pagedkv figure is the library's:
//
//   - One pool: a BlockPool of block_size 1 (one pool block stands for one trace block,
//     whose single token is derived from its hash id), evicting by LRU or
//     EvictionPolicy::kAdaptive. find_cached() along the chain finds the hit prefix and
//     touch() pins it; allocate() takes the misses (evicting cached blocks in the policy's
//     order) and cache_full_block() indexes them; free() returns the request's blocks tail
//     to head, so the head lands at the free queue's most recent end.
//   - Two tiers: a KvCacheManager of one-token blocks with a host tier
//     (Options::enable_host_cache) behind the device pool. Each request is added, matched
//     (device hits, then host hits, which are promoted), computed in one step and freed
//     (tail first); the tier's admission rule and retention priorities on each request's
//     head blocks are the manager's own.
//
// Beside them, the offline optimum: Belady's MIN (studies/belady.h).
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_EVICTION_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_EVICTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_manager.h"
#include "trace.h"

namespace pagedkv::sim {

// Block id streams: one vector of hash ids per request, in file order.
using BlockStreams = std::vector<std::vector<int64_t>>;

BlockStreams block_streams(const Trace& trace);

// Number of distinct block ids: the pool size at which nothing is ever evicted.
int64_t distinct_blocks(const BlockStreams& streams);

struct ReplayResult {
  int64_t capacity = 0;      // blocks in the pool
  int64_t total_blocks = 0;  // block references replayed
  int64_t hit_blocks = 0;    // references inside a request's cached prefix
  int64_t evictions = 0;     // cached blocks dropped to make room
  int64_t unregistered = 0;  // BlockPool only: missing blocks whose hash was already indexed
                             // (a prefix-closure violation; 0 on well-formed traces)
  // EvictionPolicy::kAdaptive: blocks cached while their hash was a ghost of a block
  // evicted once-used (the policy then favours recency) or reused (frequency).
  int64_t recent_ghost_hits = 0;
  int64_t frequent_ghost_hits = 0;
  double hit_rate() const {
    return total_blocks == 0 ? 0.0 : static_cast<double>(hit_blocks) / total_blocks;
  }
};

// Replay on a BlockPool of `capacity` blocks evicting by `policy`. Errors: InvalidArgument
// when capacity < 1 or a request has more blocks than the pool.
[[nodiscard]] absl::StatusOr<ReplayResult> replay_block_pool(
    const BlockStreams& streams, int32_t capacity, EvictionPolicy policy = EvictionPolicy::kLru);

struct EvictionRow {
  int64_t capacity = 0;
  bool infinite = false;  // capacity == distinct_blocks(): nothing is ever evicted
  ReplayResult lru;
  ReplayResult belady;
};

// LRU (BlockPool) and Belady at each capacity, then at the infinite size.
[[nodiscard]] absl::StatusOr<std::vector<EvictionRow>> eviction_study(
    const BlockStreams& streams, const std::vector<int32_t>& capacities);

// --- Two tiers: device and host ----------------------------------------------------------

// A device pool, the host tier behind it (0: none) and the retention of each request's
// first `retained_head_blocks` blocks: a priority above the default, so that the device
// evicts a request's tail before its head (0: plain LRU).
struct TierSize {
  int32_t device_blocks = 0;
  int32_t host_blocks = 0;
  int32_t retained_head_blocks = 0;
};

struct TieredReplayResult {
  TierSize size;
  int64_t total_blocks = 0;       // block references replayed
  int64_t device_hit_blocks = 0;  // hits found on the device
  int64_t host_hit_blocks = 0;    // hits found in the host tier (each one promoted)
  int64_t demotions = 0;          // device -> host copies (Stats::blocks_demoted)
  int64_t promotions = 0;         // host -> device copies (Stats::blocks_promoted)
  int64_t dropped = 0;            // blocks dropped from the host tier (the device: none)
  int64_t not_admitted = 0;       // device evictions the admission rule dropped (kReused)
  int64_t hit_blocks() const { return device_hit_blocks + host_hit_blocks; }
  double rate(int64_t blocks) const {
    return total_blocks == 0 ? 0.0 : static_cast<double>(blocks) / total_blocks;
  }
  double hit_rate() const { return rate(hit_blocks()); }
  double device_hit_rate() const { return rate(device_hit_blocks); }
  double host_hit_rate() const { return rate(host_hit_blocks); }
};

// The replay through a KvCacheManager of `size` with the host tier's `admission` rule. Each
// request's sequence holds one token more than its blocks, never computed (a hit never
// covers a prompt's last token), so that all of its blocks can hit.
// Errors: InvalidArgument when device_blocks < 1, host_blocks or retained_head_blocks < 0,
// or a request's blocks and that token need more than the device; the manager's.
[[nodiscard]] absl::StatusOr<TieredReplayResult> replay_tiers(
    const BlockStreams& streams, const TierSize& size,
    HostAdmission admission = HostAdmission::kAll);

struct TierRow {
  TieredReplayResult tiered;
  ReplayResult single;  // LRU on one BlockPool of device_blocks + host_blocks
};

// replay_tiers() at each size, next to single-pool LRU (BlockPool) of the same total.
// Errors: those of both replays; InvalidArgument when a total exceeds int32.
[[nodiscard]] absl::StatusOr<std::vector<TierRow>> tier_study(const BlockStreams& streams,
                                                              const std::vector<TierSize>& sizes);

// What moving blocks between tiers costs against recomputing them, for the report.
struct TierCostModel {
  int64_t block_bytes = 0;          // KV bytes of one trace block (all layers, K and V)
  int32_t block_tokens = 512;       // tokens per trace block
  double prefill_tokens_per_s = 0;  // recompute speed
  double trace_seconds = 0;         // first to last arrival of the replayed trace
  struct Link {
    const char* name;
    double bytes_per_s;
  };
  std::vector<Link> links = {{"PCIe 5.0 x16", 55e9}, {"NVLink-C2C", 450e9}};

  // Seconds to recompute one block, and to copy one over `link`.
  double recompute_s() const { return block_tokens / prefill_tokens_per_s; }
  double copy_s(const Link& link) const {
    return static_cast<double>(block_bytes) / link.bytes_per_s;
  }
  // Bytes per second of trace for `blocks` copies.
  double bytes_per_s(int64_t blocks) const {
    return trace_seconds > 0 ? static_cast<double>(blocks) * block_bytes / trace_seconds : 0.0;
  }
};

// The first-to-last arrival span of a trace, in seconds (0 for fewer than two requests).
double trace_seconds(const Trace& trace);

// --- Eviction beyond LRU (issue 24) --------------------------------------------------------

struct PolicyRow {
  int64_t capacity = 0;
  ReplayResult lru;       // BlockPool, EvictionPolicy::kLru
  ReplayResult adaptive;  // BlockPool, EvictionPolicy::kAdaptive
  ReplayResult belady;
  // The share of the LRU-to-Belady gap the adaptive policy closes (0 when there is none).
  double gap_closed() const;
};

// LRU, the adaptive policy and Belady at each capacity.
[[nodiscard]] absl::StatusOr<std::vector<PolicyRow>> policy_study(
    const BlockStreams& streams, const std::vector<int32_t>& capacities);

// The host tier's admission rule at one size: HostAdmission::kAll against kReused.
struct AdmissionRow {
  TieredReplayResult all;
  TieredReplayResult reused;
  // Demotions kReused saves, as a share of kAll's.
  double demotions_saved() const;
};

[[nodiscard]] absl::StatusOr<AdmissionRow> admission_study(const BlockStreams& streams,
                                                           const TierSize& size);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_EVICTION_H_
