// Internal: the order in which a BlockPool with EvictionPolicy::kAdaptive evicts cached
// free blocks. ARC (Megiddo and Modha, FAST '03) over cached blocks, made to respect the
// prefix tree; docs/results.md ("Eviction beyond LRU") measures it against LRU and Belady.
//
//   - A cached block is *recent* (ARC's T1) until it is used again (a prefix hit, a fork:
//     BlockPool::touch), then *frequent* (T2). Within each retention priority the free
//     queue keeps a recent and a frequent list, each in LRU order (free_queue.h).
//   - Two ghost lists hold the hashes of blocks recently evicted from T1 (B1) and T2 (B2).
//     A block cached while its hash is in B1 means T1 was too small: the target size p of
//     T1 grows by max(1, |B2| / |B1|); in B2, p shrinks by max(1, |B1| / |B2|). Either way
//     the block is cached as frequent. |T1| + |B1| <= C and all four <= 2C (C: the pool),
//     where |T1| = C - |T2|: a miss's block is in T1 from its allocation on, as ARC
//     admits a page at its miss. So |B1| <= |T2|, and a scan of one-off blocks through a
//     pool with nothing reused files no ghost.
//   - Allocation evicts from the lowest priority holding cached free blocks: from its
//     recent list when |T1| > p (or its frequent list is empty), else from its frequent
//     list, the least recently used *leaf*: a block with a cached child is worth at least
//     what the child is worth (every hit on the child hits it), so it is never evicted
//     before it. A non-leaf at a list's LRU end is parked until its last cached child
//     leaves the cache, then goes back to its list at the place its last use gives it. A
//     block is parked at most once per use: eviction is O(1) amortized.
//   - A block that becomes frequent makes its cached ancestors frequent (the same argument),
//     so no parent is recent while a child is frequent.
// p starts at 0 and adapts at run time; nothing else is a parameter.
//
// IMPLEMENTATION DETAILS
//   Per block: frequent_ (T2 rather than T1, cached blocks only), parent_ (the cached block
//   it was cached after in this pool, kNoBlock when unknown), children_ (its cached
//   children) and generation_, which grows each time the block leaves the cache. A parent
//   link holds while the parent's generation is the one the child saw, so a parent that
//   left the cache, even one cached again with the same contents (a host-tier promotion),
//   never counts children it no longer has. cached_ counts cached blocks by flag, in use
//   or free (|T2| is cached_[1]).
//   Ghosts: pool/ghost_lists.h, one hash map for B1 and B2, so a block being cached costs
//   one lookup.
#ifndef PAGEDKV_POOL_ADAPTIVE_EVICTION_H_
#define PAGEDKV_POOL_ADAPTIVE_EVICTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "pagedkv/types.h"
#include "pool/free_queue.h"
#include "pool/ghost_lists.h"
#include "pool/hash_index.h"

namespace pagedkv::internal {

class AdaptiveEviction {
 public:
  struct Stats {
    int64_t recent_ghost_hits = 0;    // blocks cached while their hash was in B1 (p grew)
    int64_t frequent_ghost_hits = 0;  // ... in B2 (p shrank)
    int64_t parked = 0;               // non-leaves taken off a list's LRU end
  };

  explicit AdaptiveEviction(int32_t num_blocks)
      : capacity_(num_blocks),
        frequent_(num_blocks, 0),
        parent_(num_blocks, kNoBlock),
        parent_generation_(num_blocks, 0),
        children_(num_blocks, 0),
        generation_(num_blocks, 0) {}

  bool frequent(BlockId b) const { return frequent_[b] != 0; }

  // Dequeues the block allocation takes next: a clean block, else the victim the policy
  // chooses (parking the non-leaves it meets), else a parked block (only when every block
  // left in the queue is a parked parent of blocks in use).
  BlockId take_victim(FreeQueue& queue, const HashIndex& index);

  // `block` now holds `hash` (indexed or standby), cached after `parent` (kNoBlock: none
  // in this pool, or one not cached). A ghost hit adapts p and caches it frequent.
  void on_cached(BlockId block, const BlockHash& hash, BlockId parent, FreeQueue& queue,
                 const HashIndex& index);
  // A use of the cached `block` (touched): it and its ancestors become frequent.
  void on_use(BlockId block, FreeQueue& queue) {
    if (!frequent_[block]) make_frequent(block, queue);
  }
  // The cached `block` left the cache; `evicted_hash`: its hash left with it by eviction
  // and becomes a ghost. Returns the parked parent whose last cached child this was, for
  // the pool to requeue, or kNoBlock.
  BlockId on_uncached(BlockId block, const BlockHash* evicted_hash, const FreeQueue& queue);
  // reset_prefix_cache(): every block is uncached; parked ones go to the clean list's head.
  void on_reset(FreeQueue& queue);

  const Stats& stats() const { return stats_; }
  double target() const { return target_; }

  // Flags only on cached blocks, |T1| and |T2| counted right, children counted right,
  // parked blocks cached non-leaves, cached queued blocks in the list their flag gives,
  // p in [0, C], the ghost bounds.
  absl::Status check_invariants(const FreeQueue& queue, const HashIndex& index) const;

 private:
  // Whether `child`'s parent link holds (see IMPLEMENTATION DETAILS).
  bool linked(BlockId child) const {
    return parent_[child] != kNoBlock && generation_[parent_[child]] == parent_generation_[child];
  }
  void make_frequent(BlockId block, FreeQueue& queue);

  // The ghost lists (kRecent: B1, kFrequent: B2). A ghost is keyed by 64 bits of its
  // block hash: a collision can only mislead the target, never share a block.
  enum GhostListId : uint8_t { kRecent, kFrequent };
  void trim_ghosts();

  int32_t capacity_;
  double target_ = 0;  // p: the size T1 aims at, in blocks
  std::vector<uint8_t> frequent_;
  std::vector<BlockId> parent_;
  std::vector<uint32_t> parent_generation_;  // the parent's generation_ when linked
  std::vector<int32_t> children_;
  std::vector<uint32_t> generation_;
  int32_t cached_[2] = {0, 0};  // cached blocks that are recent (T1), frequent (T2)
  GhostLists<uint64_t, 2> ghosts_;
  Stats stats_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_ADAPTIVE_EVICTION_H_
