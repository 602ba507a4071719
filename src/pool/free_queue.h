// Internal: the free queue of a BlockPool.
//
// Intrusive doubly linked lists over block ids, so that insertion at either end or after a
// given block, pop_front and remove from the middle (a prefix hit on a free block) are
// O(1) with no allocation; a deque cannot remove from the middle. The queue is also the
// eviction order: allocation takes the head. It is a chain of lists, one for clean blocks
// and one per retention priority, taken in that order:
//
//     clean list     | priority 0   | ...  | priority 35 (default) | ... | priority 100
//     b3 <-> b0      |              |      | b7 <-> b2 <-> b9      |     | b5
//     ^ head: allocated next                                                  tail ^
//
// BlockPool puts freed blocks that hold no hash in the clean list (they can never hit, so
// they are reused first) and cached blocks at the tail of their priority's list, so each
// priority's list is in LRU order from its head. A bitmap of non-empty lists finds the
// head in O(1). Every block pushed to a priority's list gets a stamp from a counter, so a
// list is in stamp order, and a block can move to another list at the place its stamp
// gives it (a retention that expired).
//
// IMPLEMENTATION DETAILS
//   prev_, next_: int32 arrays of num_blocks + 2 * kLists entries. Entries [0, num_blocks)
//   are the links of the blocks; list l has sentinels head = num_blocks + 2l and
//   tail = num_blocks + 2l + 1, so that insertion and removal need no branches for the ends.
//   prev_[b] == kDetached: b is not queued. Links are written only by FreeQueue.
#ifndef PAGEDKV_POOL_FREE_QUEUE_H_
#define PAGEDKV_POOL_FREE_QUEUE_H_

#include <bit>
#include <cstdint>
#include <vector>

#include "common/check.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class FreeQueue {
 public:
  static constexpr int32_t kPriorities = 101;  // retention priorities [0, 100]
  static constexpr int32_t kLists = 1 + kPriorities;
  static constexpr int32_t kCleanList = 0;

  // A queue holding every block in the clean list, in id order.
  explicit FreeQueue(int32_t num_blocks)
      : num_blocks_(num_blocks),
        prev_(num_blocks + 2 * kLists),
        next_(num_blocks + 2 * kLists),
        list_(num_blocks, kCleanList),
        stamp_(num_blocks, 0) {
    for (int32_t l = 0; l < kLists; ++l) {
      next_[head(l)] = tail(l);
      prev_[tail(l)] = head(l);
      prev_[head(l)] = kDetached;
      next_[tail(l)] = kDetached;
    }
    for (BlockId b = 0; b < num_blocks; ++b) prev_[b] = kDetached;
    for (BlockId b = 0; b < num_blocks; ++b) link_after(prev_[tail(kCleanList)], b, kCleanList);
  }

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // O(1) membership from the links; check_invariants() cross-checks it with a walk.
  bool is_queued(BlockId b) const { return prev_[b] != kDetached; }
  // The list a queued block is in: kCleanList, or 1 + its priority.
  int32_t list_of(BlockId b) const { return list_[b]; }
  static int32_t priority_list(int32_t priority) { return 1 + priority; }
  uint64_t stamp(BlockId b) const { return stamp_[b]; }

  // Appends b to the tail of priority `priority`'s list (most recently used).
  void push_back(BlockId b, int32_t priority) {
    const int32_t l = priority_list(priority);
    stamp_[b] = ++last_stamp_;
    // The tail sentinel is known: reading it from the last block's link would make every
    // push wait for the previous push's store (BM_FreeSequence 1.5x slower).
    link_between(prev_[tail(l)], tail(l), b, l);
  }

  // Inserts b into the clean list right after the queued clean block `pos`, or at the
  // head when pos is kNoBlock.
  void insert_clean_after(BlockId pos, BlockId b) {
    PAGEDKV_DCHECK(pos == kNoBlock || (is_queued(pos) && list_[pos] == kCleanList));
    link_after(pos == kNoBlock ? head(kCleanList) : pos, b, kCleanList);
  }

  // Moves the queued block b into priority `priority`'s list at the place its stamp gives
  // it. Searches from both ends at once: O(distance to the nearer end).
  void move_by_stamp(BlockId b, int32_t priority) {
    remove(b);
    const int32_t l = priority_list(priority);
    BlockId from_head = next_[head(l)];
    BlockId from_tail = prev_[tail(l)];
    while (true) {
      // Before the first block from the head side stamped later than b...
      if (from_head == tail(l) || stamp_[from_head] > stamp_[b]) {
        link_after(prev_[from_head], b, l);
        return;
      }
      // ... or after the first block from the tail side stamped earlier.
      if (from_tail < num_blocks_ && stamp_[from_tail] < stamp_[b]) {
        link_after(from_tail, b, l);
        return;
      }
      from_head = next_[from_head];
      from_tail = prev_[from_tail];
    }
  }

  BlockId pop_front() {
    PAGEDKV_DCHECK(size_ > 0);
    const BlockId b = next_[head(first_list())];
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
    const int32_t l = list_[b];
    if (next_[head(l)] == tail(l)) nonempty_[l / 64] &= ~(uint64_t{1} << (l % 64));
  }

  // Iteration from head to tail across the lists: first(), then next(b) until it returns
  // kNoBlock.
  BlockId first() const { return size_ == 0 ? kNoBlock : next_[head(first_list())]; }
  BlockId next(BlockId b) const {
    if (next_[b] < num_blocks_) return next_[b];
    const int32_t l = next_list(list_[b] + 1);
    return l == kLists ? kNoBlock : next_[head(l)];
  }
  // The link before b within its list, for the link-agreement check; kNoBlock at the
  // head of the list.
  BlockId prev_in_list(BlockId b) const { return prev_[b] < num_blocks_ ? prev_[b] : kNoBlock; }

 private:
  static constexpr BlockId kDetached = -2;
  static constexpr int32_t kWords = (kLists + 63) / 64;

  int32_t head(int32_t l) const { return num_blocks_ + 2 * l; }
  int32_t tail(int32_t l) const { return num_blocks_ + 2 * l + 1; }

  // The first non-empty list at or after l, or kLists.
  int32_t next_list(int32_t l) const {
    for (int32_t w = l / 64; w < kWords; ++w) {
      uint64_t bits = nonempty_[w];
      if (w == l / 64) bits &= ~uint64_t{0} << (l % 64);
      if (bits != 0) return w * 64 + std::countr_zero(bits);
    }
    return kLists;
  }
  int32_t first_list() const { return next_list(0); }

  // `node` is a queued block of list l or l's head sentinel.
  void link_after(BlockId node, BlockId b, int32_t l) { link_between(node, next_[node], b, l); }

  // Links b between the adjacent nodes `before` and `after` of list l.
  void link_between(BlockId before, BlockId after, BlockId b, int32_t l) {
    PAGEDKV_DCHECK(!is_queued(b) && next_[before] == after);
    next_[before] = b;
    prev_[b] = before;
    next_[b] = after;
    prev_[after] = b;
    ++size_;
    list_[b] = static_cast<uint8_t>(l);
    nonempty_[l / 64] |= uint64_t{1} << (l % 64);
  }

  int32_t num_blocks_;
  std::vector<BlockId> prev_;
  std::vector<BlockId> next_;
  std::vector<uint8_t> list_;    // per block: the list it is (or was last) in
  std::vector<uint64_t> stamp_;  // per block: when it was last pushed to a priority list
  uint64_t last_stamp_ = 0;
  int32_t size_ = 0;
  uint64_t nonempty_[kWords] = {};  // bit l: list l holds a block
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_FREE_QUEUE_H_
