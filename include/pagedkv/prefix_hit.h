// File: pagedkv/prefix_hit.h
//
// PrefixHit: what KvCacheManager::peek_prefix() reports of a waiting sequence's prefix hit
// without claiming it: the tokens match_prefix() would claim now, and per layer group the
// blocks the claim would hold and how many blocks it would take out of the group's free
// blocks. A scheduler that admits only what fits (vLLM's, say) decides the fit with it
// before claiming, so that a lookup that does not admit changes nothing: no references,
// no eviction order, no counters.
//
// A scheduler admits waiting sequence 7 only when its hit and its prompt's new blocks fit.
// Example (in a function returning a Status):
//   const absl::StatusOr<PrefixHit> hit = manager.peek_prefix(7);
//   if (!hit.ok()) return hit.status();
//   const int32_t bs = manager.options().block_size;
//   const auto len = static_cast<int32_t>(prompt.size());
//   const int32_t new_blocks = (len + bs - 1) / bs - hit->num_tokens / bs;
//   if (new_blocks + hit->groups[0].blocks_taken() > manager.stats().free_blocks) {
//     return absl::OkStatus();  // it waits: nothing was claimed, nothing changed
//   }
//   const int32_t cached = *manager.match_prefix(7);  // == hit->num_tokens
//   return manager.allocate_slots(7, len - cached).status();
#ifndef PAGEDKV_PREFIX_HIT_H_
#define PAGEDKV_PREFIX_HIT_H_

#include <cstdint>
#include <vector>

#include "pagedkv/types.h"

namespace pagedkv {

struct PrefixHit {
  // Tokens match_prefix() would claim now (and count as computed): the full-block hit,
  // plus num_partial_tokens. 0 with prefix caching off.
  int32_t num_tokens = 0;
  // Of those, the first tokens of a cached block reused by partial-block reuse
  // (KvCacheManager::Options::enable_partial_block_reuse), after the full-block hit.
  int32_t num_partial_tokens = 0;

  // One layer group's part of the hit.
  struct Group {
    // An attention group: entry i of the full-block hit (i < num_tokens / block_size,
    // rounded down past the partial tokens), the device block a claim would share;
    // kNoBlock where the claim promotes a host-tier hit into a new device block, and
    // before the window a windowed group needs (those entries are not held). A state
    // group: one entry, the device checkpoint a claim restores, kNoBlock for one restored
    // from the host tier or for no hit.
    std::vector<BlockId> blocks;
    // Blocks the claim takes out of the free queue as they are (reference count 0 -> 1,
    // contents kept): device hits, a partial block's source, a checkpoint.
    int32_t num_free_hits = 0;
    // Free blocks the claim allocates: host-tier promotions, a partial block's copy, a
    // state slot.
    int32_t num_new_blocks = 0;

    // How many fewer free device blocks the group has after the claim (until the step
    // ends: a partial block's source and a checkpoint stay held until take_step_ops()).
    int32_t blocks_taken() const { return num_free_hits + num_new_blocks; }
  };
  std::vector<Group> groups;  // one per layer group, in the manager's order
};

}  // namespace pagedkv

#endif  // PAGEDKV_PREFIX_HIT_H_
