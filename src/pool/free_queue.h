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
// Under EvictionPolicy::kAdaptive each priority has two lists, recent then frequent (ARC's
// T1 and T2: blocks used once since they were cached, and more often), and a last list
// holds the parked blocks (cached ones with cached children, taken off their list's LRU end
// until their last child leaves; not in stamp order). The policy, not pop_front(), chooses
// which list to evict from (src/pool/adaptive_eviction.h); with kLru every cached block is
// in a recent list and the frequent and parked lists stay empty.
//
// IMPLEMENTATION DETAILS
//   nodes_: num_blocks + 2 * kLists nodes of 16 bytes. Nodes [0, num_blocks) are the
//   blocks'; list l has sentinels head = num_blocks + 2l and tail = num_blocks + 2l + 1, so
//   that insertion and removal need no branches for the ends. A block's links, list and
//   stamp share its node, so a free or an eviction touches one cache line per block, not
//   four (separate arrays made BM_FreeSequence 1.3x slower than the two links alone).
//   prev == kDetached: the block is not queued. Nodes are written only by FreeQueue.
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
  static constexpr int32_t kCleanList = 0;
  static constexpr int32_t kParkedList = 1 + 2 * kPriorities;
  static constexpr int32_t kLists = kParkedList + 1;

  // A queue holding every block in the clean list, in id order.
  explicit FreeQueue(int32_t num_blocks)
      : num_blocks_(num_blocks), nodes_(num_blocks + 2 * kLists) {
    for (int32_t l = 0; l < kLists; ++l) {
      nodes_[head(l)] = {.prev = kDetached, .next = tail(l)};
      nodes_[tail(l)] = {.prev = head(l), .next = kDetached};
    }
    for (BlockId b = 0; b < num_blocks; ++b) nodes_[b].prev = kDetached;
    for (BlockId b = 0; b < num_blocks; ++b) {
      link_between(nodes_[tail(kCleanList)].prev, tail(kCleanList), b, kCleanList, 0);
    }
  }

  // No size: it is the owner's count of free blocks (counting here would cost every
  // push and removal a load and a store).
  bool empty() const { return first_list() == kLists; }
  // O(1) membership from the links; check_invariants() cross-checks it with a walk.
  bool is_queued(BlockId b) const { return nodes_[b].prev != kDetached; }
  // The list a queued block is in: kCleanList, kParkedList, or priority_list(its priority,
  // whether it is frequent).
  int32_t list_of(BlockId b) const { return static_cast<int32_t>(nodes_[b].stamp_and_list & 0xff); }
  static int32_t priority_list(int32_t priority, bool frequent = false) {
    return 1 + 2 * priority + static_cast<int32_t>(frequent);
  }
  static bool is_frequent_list(int32_t l) {
    return l != kCleanList && l % 2 == 0 && l < kParkedList;
  }
  uint64_t stamp(BlockId b) const { return nodes_[b].stamp_and_list >> 8; }
  bool list_empty(int32_t l) const { return nodes_[head(l)].next == tail(l); }
  BlockId front(int32_t l) const { return list_empty(l) ? kNoBlock : nodes_[head(l)].next; }
  // The first non-empty list, or kLists when the queue is empty.
  int32_t first_list() const { return next_list(0); }

  // Appends b to the tail of list `l` (most recently used), a new stamp.
  void push_back(BlockId b, int32_t l) {
    // The tail sentinel is known: reading it from the last block's link would make every
    // push wait for the previous push's store (BM_FreeSequence 1.5x slower).
    link_between(nodes_[tail(l)].prev, tail(l), b, l, ++last_stamp_);
  }

  // Appends blocks to the tail of list l as push_back() would, for a loop that pushes a
  // run of blocks with no other change to the queue in between (the free of a block table).
  // It keeps the list's last block, the stamp counter and the list's bit in registers:
  // through push_back() each is a load and a store per block, since a node store may
  // alias them. The queue is whole again when the appender is destroyed.
  class Appender;

  // Inserts b into the clean list right after the queued clean block `pos`, or at the
  // head when pos is kNoBlock.
  void insert_clean_after(BlockId pos, BlockId b) {
    PAGEDKV_DCHECK(pos == kNoBlock || (is_queued(pos) && list_of(pos) == kCleanList));
    const BlockId before = pos == kNoBlock ? head(kCleanList) : pos;
    link_between(before, nodes_[before].next, b, kCleanList, stamp(b));
  }

  // Moves the queued block b into list l at the place its stamp gives it. Searches from
  // both ends at once: O(distance to the nearer end).
  void move_by_stamp(BlockId b, int32_t l) {
    remove(b);
    const uint64_t b_stamp = stamp(b);
    BlockId from_head = nodes_[head(l)].next;
    BlockId from_tail = nodes_[tail(l)].prev;
    while (true) {
      // Before the first block from the head side stamped later than b...
      if (from_head == tail(l) || stamp(from_head) > b_stamp) {
        link_between(nodes_[from_head].prev, from_head, b, l, b_stamp);
        return;
      }
      // ... or after the first block from the tail side stamped earlier.
      if (from_tail < num_blocks_ && stamp(from_tail) < b_stamp) {
        link_between(from_tail, nodes_[from_tail].next, b, l, b_stamp);
        return;
      }
      from_head = nodes_[from_head].next;
      from_tail = nodes_[from_tail].prev;
    }
  }

  // Moves the queued block b to the tail of the parked list, keeping its stamp.
  void park(BlockId b) {
    const uint64_t b_stamp = stamp(b);
    remove(b);
    link_between(nodes_[tail(kParkedList)].prev, tail(kParkedList), b, kParkedList, b_stamp);
  }

  // The block pop_front() would return (kNoBlock when empty); starts loading the node of
  // the one after it, which pop_front() relinks.
  BlockId prefetch_front() const {
    const BlockId b = first();
    if (b != kNoBlock) __builtin_prefetch(&nodes_[nodes_[b].next]);
    return b;
  }

  BlockId pop_front() {
    PAGEDKV_DCHECK(!empty());
    const BlockId b = nodes_[head(first_list())].next;
    remove(b);
    return b;
  }

  void remove(BlockId b) {
    PAGEDKV_DCHECK(is_queued(b));
    Node& node = nodes_[b];
    nodes_[node.prev].next = node.next;
    nodes_[node.next].prev = node.prev;
    node.prev = node.next = kDetached;
    const int32_t l = list_of(b);
    if (list_empty(l)) nonempty_[l / 64] &= ~(uint64_t{1} << (l % 64));
  }

  // Iteration from head to tail across the lists: first(), then next(b) until it returns
  // kNoBlock.
  BlockId first() const { return empty() ? kNoBlock : nodes_[head(first_list())].next; }
  BlockId next(BlockId b) const {
    if (nodes_[b].next < num_blocks_) return nodes_[b].next;
    const int32_t l = next_list(list_of(b) + 1);
    return l == kLists ? kNoBlock : nodes_[head(l)].next;
  }
  // The link before b within its list, for the link-agreement check; kNoBlock at the
  // head of the list.
  BlockId prev_in_list(BlockId b) const {
    return nodes_[b].prev < num_blocks_ ? nodes_[b].prev : kNoBlock;
  }

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

  // A block's (or sentinel's) links, and the list it is (or was last) in with the stamp
  // of its last push to a priority list: stamp << 8 | list.
  struct Node {
    BlockId prev = kDetached;
    BlockId next = kDetached;
    uint64_t stamp_and_list = kCleanList;
  };
  static_assert(kLists <= 0xff + 1 && sizeof(Node) == 16);

  // Links b, stamped `stamp`, between the adjacent nodes `before` and `after` of list l.
  void link_between(BlockId before, BlockId after, BlockId b, int32_t l, uint64_t stamp) {
    PAGEDKV_DCHECK(!is_queued(b) && nodes_[before].next == after);
    nodes_[before].next = b;
    nodes_[b] = {
        .prev = before, .next = after, .stamp_and_list = stamp << 8 | static_cast<uint64_t>(l)};
    nodes_[after].prev = b;
    nonempty_[l / 64] |= uint64_t{1} << (l % 64);
  }

  int32_t num_blocks_;
  std::vector<Node> nodes_;
  uint64_t last_stamp_ = 0;         // below 2^56 for 2^56 pushes: years at one per nanosecond
  uint64_t nonempty_[kWords] = {};  // bit l: list l holds a block
};

class FreeQueue::Appender {
 public:
  Appender(FreeQueue& queue, int32_t l)
      : queue_(queue),
        nodes_(queue.nodes_.data()),
        list_(static_cast<uint64_t>(l)),
        tail_(queue.tail(l)),
        last_(nodes_[tail_].prev),
        stamp_(queue.last_stamp_) {}
  Appender(const Appender&) = delete;
  Appender& operator=(const Appender&) = delete;
  ~Appender() {
    if (stamp_ == queue_.last_stamp_) return;  // nothing pushed
    nodes_[tail_].prev = last_;
    queue_.last_stamp_ = stamp_;
    queue_.nonempty_[list_ / 64] |= uint64_t{1} << (list_ % 64);
  }

  void push(BlockId b) {
    PAGEDKV_DCHECK(!queue_.is_queued(b));
    nodes_[last_].next = b;
    nodes_[b] = {.prev = last_, .next = tail_, .stamp_and_list = ++stamp_ << 8 | list_};
    last_ = b;
  }

 private:
  FreeQueue& queue_;
  Node* const nodes_;
  const uint64_t list_;
  const BlockId tail_;
  BlockId last_;
  uint64_t stamp_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_FREE_QUEUE_H_
