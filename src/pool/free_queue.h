// Internal: the free queue of a BlockPool.
//
// An intrusive doubly linked list over block ids, so that insertion at either end or
// after a given block, pop_front and remove from the middle (a prefix hit on a free
// block) are O(1) with no allocation; a deque cannot remove from the middle. The queue is
// also the eviction order: allocation takes the head. BlockPool puts freed blocks that
// hold no hash at the head (they can never hit, so they are reused first) and cached
// blocks at the tail, so the cached part is in LRU order from its head side.
//
// IMPLEMENTATION DETAILS
//   prev_, next_: int32 arrays of num_blocks + 2 entries. Entries [0, num_blocks) are the
//   links of the blocks; entry kHead = num_blocks and kTail = num_blocks + 1 are sentinels,
//   so that insertion and removal need no branches for the ends.
//
//     kHead <-> b3 <-> b0 <-> b7 <-> kTail       prev_[b] == kDetached: b not queued
//               clean  clean  cached
//
// Links are written only by FreeQueue.
#ifndef PAGEDKV_POOL_FREE_QUEUE_H_
#define PAGEDKV_POOL_FREE_QUEUE_H_

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class FreeQueue {
 public:
  // A queue holding every block, in id order.
  explicit FreeQueue(int32_t num_blocks)
      : head_(num_blocks), tail_(num_blocks + 1), prev_(num_blocks + 2), next_(num_blocks + 2) {
    prev_[head_] = kDetached;
    next_[tail_] = kDetached;
    BlockId last = head_;
    for (BlockId b = 0; b < num_blocks; ++b) {
      next_[last] = b;
      prev_[b] = last;
      last = b;
    }
    next_[last] = tail_;
    prev_[tail_] = last;
    size_ = num_blocks;
  }

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // O(1) membership from the links; check_invariants() cross-checks it with a walk.
  bool is_queued(BlockId b) const { return prev_[b] != kDetached; }

  void push_back(BlockId b) { link_after(prev_[tail_], b); }

  // Inserts b right after the queued block `pos`, or at the head when pos is kNoBlock.
  void insert_after(BlockId pos, BlockId b) {
    PAGEDKV_DCHECK(pos == kNoBlock || is_queued(pos));
    link_after(pos == kNoBlock ? head_ : pos, b);
  }

  BlockId pop_front() {
    PAGEDKV_DCHECK(size_ > 0);
    const BlockId b = next_[head_];
    remove(b);
    return b;
  }

  void remove(BlockId b) {
    PAGEDKV_DCHECK(is_queued(b));
    next_[prev_[b]] = next_[b];
    prev_[next_[b]] = prev_[b];
    prev_[b] = kDetached;
    next_[b] = kDetached;
    --size_;
  }

  // Iteration from head to tail: first(), then next(b) until it returns kNoBlock.
  BlockId first() const { return next_[head_] == tail_ ? kNoBlock : next_[head_]; }
  BlockId next(BlockId b) const { return next_[b] == tail_ ? kNoBlock : next_[b]; }
  // The link before b, for the link-agreement check; kNoBlock at the head.
  BlockId prev(BlockId b) const { return prev_[b] == head_ ? kNoBlock : prev_[b]; }

 private:
  static constexpr BlockId kDetached = -2;

  // `node` is a queued block or the head sentinel.
  void link_after(BlockId node, BlockId b) {
    PAGEDKV_DCHECK(!is_queued(b));
    const BlockId after = next_[node];
    next_[node] = b;
    prev_[b] = node;
    next_[b] = after;
    prev_[after] = b;
    ++size_;
  }

  BlockId head_;
  BlockId tail_;
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  int32_t size_ = 0;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_FREE_QUEUE_H_
