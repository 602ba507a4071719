// File: examples/simulator/adaptive_eviction.h
//
// Eviction beyond LRU (issue 24): a prefix-aware adaptive replacement policy for the
// prefix cache, replayed under the same rule as replay_block_pool() (eviction.h), and its study
// against LRU and Belady.
//
// The policy is ARC (Megiddo and Modha, FAST '03) over cached blocks, made to respect the
// prefix tree:
//   - T1 holds blocks used once since they were cached, T2 blocks used at least twice;
//     each is a recency list. B1 and B2 are ghost lists: the ids of blocks recently
//     evicted from T1 and T2 (no data). |T1| + |B1| <= C and the four lists <= 2C.
//   - A miss found in B1 means T1 was too small: the target size p of T1 grows by
//     max(1, |B2| / |B1|). A miss found in B2 shrinks it by max(1, |B1| / |B2|). Either
//     ghost hit is cached into T2; any other miss into T1.
//   - To make room the policy evicts from T1 when |T1| > p (or == p on a B2 miss), else
//     from T2, taking the least recently used *leaf* of that list: a block with a cached
//     child is worth at least what the child is worth, so it is never evicted before it.
//     A non-leaf found at a list's LRU end is parked (taken off the list) until its last
//     cached child is evicted, then goes back to the LRU end it was taken from: nothing
//     on that list was used less recently. Each block is parked at most once per use, so
//     eviction is O(1) amortized.
//   - A block whose child in the request lands in T2 lands in T2 too (the same
//     argument), which keeps "a parent is in T2 if a child is" and, with the replay's
//     tail-to-head order (a parent is used after its children), makes T1's LRU end a leaf.
// p starts at 0 and adapts to the trace; nothing else is a parameter.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_ADAPTIVE_EVICTION_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_ADAPTIVE_EVICTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eviction.h"

namespace pagedkv::sim {

struct AdaptiveReplayResult {
  ReplayResult replay;              // hits and evictions, as replay_block_pool() counts them
  int64_t recent_ghost_hits = 0;    // misses found in B1 (p grew)
  int64_t frequent_ghost_hits = 0;  // misses found in B2 (p shrank)
  int64_t parked = 0;               // non-leaves taken off a list's LRU end
  double final_target = 0;          // p at the end, in blocks
};

// The prefix-aware ARC replay with `capacity` blocks. Errors: InvalidArgument when
// capacity < 1 or a request has more blocks than the pool.
[[nodiscard]] absl::StatusOr<AdaptiveReplayResult> replay_adaptive(const BlockStreams& streams,
                                                                   int32_t capacity);

struct PolicyRow {
  int64_t capacity = 0;
  ReplayResult lru;
  AdaptiveReplayResult adaptive;
  ReplayResult library_adaptive;  // BlockPool with EvictionPolicy::kAdaptive
  ReplayResult belady;
  // The share of the LRU-to-Belady gap the adaptive policy closes (0 when there is none).
  double gap_closed() const;
};

// LRU (BlockPool), the adaptive policy (the model above, and BlockPool's) and Belady at
// each capacity.
[[nodiscard]] absl::StatusOr<std::vector<PolicyRow>> policy_study(
    const BlockStreams& streams, const std::vector<int32_t>& capacities);

std::string format_policy_table(const std::vector<PolicyRow>& rows);

// The host tier's admission rule: the tiered replay (eviction.h) with HostAdmission::kAll
// and kReused at one size, in the model and through the KvCacheManager.
struct AdmissionRow {
  TieredReplayResult demote_all;
  TieredReplayResult demote_reused;
  TieredReplayResult manager_all;
  TieredReplayResult manager_reused;
  // Demotions saved, as a share of demote-all's (the model's, or the manager's).
  double demotions_saved() const;
  double manager_demotions_saved() const;
};

[[nodiscard]] absl::StatusOr<AdmissionRow> admission_study(const BlockStreams& streams,
                                                           int32_t device_blocks,
                                                           int32_t host_blocks);

std::string format_admission_table(const AdmissionRow& row);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_ADAPTIVE_EVICTION_H_
