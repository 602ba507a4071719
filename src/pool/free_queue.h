// Internal: the free queue of a BlockPool.
//
// An intrusive doubly linked list over block ids, so that push_back, pop_front and
// remove from the middle (a prefix hit on a free block) are O(1) with no allocation; a
// deque cannot remove from the middle. The queue is also the LRU order: the head is the
// least recently freed block and is allocated (evicted) first. Callers free a sequence's
// blocks tail first so that its later blocks are evicted before its shared beginning.
//
// IMPLEMENTATION DETAILS
//   prev_, next_: int32 arrays of num_blocks + 2 entries. Entries [0, num_blocks) are the
//   links of the blocks; entry kHead = num_blocks and kTail = num_blocks + 1 are sentinels,
//   so that insertion and removal need no branches for the ends.
//
//     kHead <-> b3 <-> b0 <-> b7 <-> kTail       prev_[b] == kDetached: b not queued
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

  void push_back(BlockId b) {
    PAGEDKV_DCHECK(!is_queued(b));
    const BlockId last = prev_[tail_];
    next_[last] = b;
    prev_[b] = last;
    next_[b] = tail_;
    prev_[tail_] = b;
    ++size_;
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
  BlockId head_;
  BlockId tail_;
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  int32_t size_ = 0;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_FREE_QUEUE_H_
