// Internal: the host tier of KvCacheManager's prefix cache.
//
// A cached device block that allocation evicts is demoted into a host block (a demote
// copy) instead of being lost; match_prefix() continues from device hits into verified
// host hits and promotes them back (promote copies). Both pools index the same hashes,
// and copies carry their content keys, so a child verifies after its parent in either
// tier. The tier is exclusive: a promoted block leaves the host index.
//
//   device pool --evicted (take_evictions)--> demote  --> host block, indexed (import_copy)
//   device pool <--new block, indexed-------- promote <-- host hit, uncached
//   a promotion into a device block that held an evicted cached block: exchange (both)
//
// HostTier owns no pool: the manager passes its pools and step ledger to each call. It
// uses only the pool core's narrow tier interface (evictions, content keys, lookups, imports).
//
// With HostAdmission::kReused it demotes only blocks with evidence of reuse: it keeps a bit
// per device block (set by note_hit(), promote() and note_computed()) and a GhostList of
// the hashes that left both tiers (evictions it drops, host-tier evictions, which the host
// pool logs then).
#ifndef PAGEDKV_CACHE_HOST_TIER_H_
#define PAGEDKV_CACHE_HOST_TIER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/ghost_list.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "pagedkv/kv_cache_manager.h"
#include "pool/block_pool_core.h"

namespace pagedkv::internal {

class HostTier {
 public:
  struct Pools {
    BlockPoolCore& device;
    BlockPoolCore& host;
    StepLedger& ledger;
    int32_t group = 0;  // the layer group whose pools these are
  };
  struct Counters {
    int64_t blocks_demoted = 0;       // device -> host copies of cached blocks (demote, exchange)
    int64_t blocks_promoted = 0;      // host -> device copies of host hits (promote, exchange)
    int64_t blocks_not_admitted = 0;  // evictions dropped for want of evidence of reuse
    int64_t ghost_hits = 0;           // blocks computed while their hash was a ghost
  };

  // A tier over a device pool of `device_blocks` and a host pool of `host_blocks`.
  HostTier(HostAdmission admission, int32_t device_blocks, int32_t host_blocks)
      : reused_(admission == HostAdmission::kReused ? device_blocks : 0),
        ghosts_(admission == HostAdmission::kReused ? device_blocks + host_blocks : 0) {}

  bool admits_all() const { return reused_.empty(); }
  // Evidence of reuse, with HostAdmission::kReused: a prefix hit on the cached device
  // `block`; the blocks `computed` after their K/V was computed and they were offered to
  // the cache under `hashes` (a ghost's block counts as reused).
  void note_hit(BlockId block) {
    if (!admits_all()) reused_[block] = 1;
  }
  void note_computed(std::span<const BlockId> computed, std::span<const BlockHash> hashes);
  // A state group's checkpoint restored from the tier straight into a sequence's slot (a
  // promote copy that leaves the checkpoint in the tier): counts as a promotion.
  void note_restored() { ++counters_.blocks_promoted; }

  // The host-tier block cached under `hash` that holds `tokens` and `extra_keys` after the
  // contents `parent_key` names, or kNoBlock.
  static BlockId find_hit(const BlockPoolCore& host, const BlockHash& hash, uint64_t parent_key,
                          std::span<const TokenId> tokens, std::span<const uint64_t> extra_keys);

  // Promotes the host-tier blocks `hits` (verified by find_hit(), distinct) into new device
  // blocks, written to `promoted` (as many), with the hits' content keys; the caller indexes
  // them (after this call: their evicted contents are read here). The host blocks leave
  // the tier, except that a host block whose new device block held an evicted cached block
  // takes that block's contents in exchange: a promotion then costs the tier no block, as
  // in one LRU pool of both sizes. The device pool must have hits.size() free blocks.
  void promote(std::span<const BlockId> hits, std::span<BlockId> promoted, const Pools& pools);

  // Demotes the cached blocks the device pool evicted since the last call (see
  // demote()). Cheap when there are none: call it after every device allocation.
  void demote_evicted(const Pools& pools) {
    if (!pools.device.has_evictions() && !pools.host.has_evictions()) return;
    pools.device.take_evictions(evicted_);
    drop_unreused(pools.host);
    demote(pools);
  }

  const Counters& counters() const { return counters_; }

  // Promoted host blocks are out of the tier (its copy left with the promotion), except a
  // state group's (`exclusive` false: a restore keeps the checkpoint, held until the step
  // ends); the ghost list's invariants.
  absl::Status check_invariants(const BlockPoolCore& host, const StepLedger& ledger, int32_t group,
                                bool exclusive) const;

 private:
  void demote(const Pools& pools);
  void drop_unreused(const BlockPoolCore& host);
  void take_host_evictions(BlockPoolCore& host);
  bool refresh_host_copy(const BlockPoolCore::EvictedBlock& e, const Pools& pools);

  std::vector<BlockPoolCore::EvictedBlock> evicted_;  // the evictions being demoted
  std::vector<BlockPoolCore::EvictedBlock> host_evicted_;
  std::vector<uint8_t> reused_;  // per device block; empty with HostAdmission::kAll
  GhostList ghosts_;
  Counters counters_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_HOST_TIER_H_
