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
// uses only BlockPool's narrow tier interface (evictions, content keys, lookups, imports).
#ifndef PAGEDKV_CACHE_HOST_TIER_H_
#define PAGEDKV_CACHE_HOST_TIER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "pagedkv/block_pool.h"

namespace pagedkv::internal {

class HostTier {
 public:
  struct Pools {
    BlockPool& device;
    BlockPool& host;
    StepLedger& ledger;
  };
  struct Counters {
    int64_t host_hit_tokens = 0;  // prefix hit tokens found in the host tier
    int64_t blocks_demoted = 0;   // device -> host copies of cached blocks (demote, exchange)
    int64_t blocks_promoted = 0;  // host -> device copies of host hits (promote, exchange)
  };

  // Continues `seq`'s claimed device prefix (its blocks so far) into the host tier: the
  // verified host hits among its first `max_blocks` hashed blocks that follow, at most
  // `room` of them, are promoted into new device blocks appended to seq.blocks, which
  // enter the device index with the host blocks' content keys. The host blocks leave the
  // tier, except that a host block whose new device block held an evicted cached block
  // takes that block's contents in exchange: a promotion then costs the tier no block,
  // as in one LRU pool of both sizes.
  void promote_hits(Sequence& seq, int32_t max_blocks, int32_t room, const Pools& pools);

  // Demotes the cached blocks the device pool evicted since the last call (see
  // demote()). Cheap when there are none: call it after every device allocation.
  void demote_evicted(const Pools& pools) {
    if (!pools.device.has_evictions()) return;
    pools.device.take_evictions(evicted_);
    demote(pools);
  }

  const Counters& counters() const { return counters_; }

  // Promoted host blocks are out of the tier (its copy left with the promotion).
  absl::Status check_invariants(const BlockPool& host, const StepLedger& ledger) const;

 private:
  void demote(const Pools& pools);
  bool refresh_host_copy(const BlockPool::EvictedBlock& e, const Pools& pools);

  std::vector<BlockId> hits_;                     // scratch of promote_hits()
  std::vector<BlockPool::EvictedBlock> evicted_;  // the evictions being demoted
  Counters counters_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_HOST_TIER_H_
