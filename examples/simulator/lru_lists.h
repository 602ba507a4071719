// File: examples/simulator/lru_lists.h
//
// Intrusive doubly linked lists over dense ids (0 .. num_ids - 1), each id in at most one
// list at a time: the O(1) recency lists of the eviction replays (eviction.cc,
// adaptive_eviction.cc).
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_LRU_LISTS_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_LRU_LISTS_H_

#include <cstdint>
#include <vector>

namespace pagedkv::sim {

// Front = least recently used. Node i < num_ids is an id; node num_ids + l is list l's
// sentinel.
class LruLists {
 public:
  LruLists(int32_t num_ids, int32_t num_lists)
      : num_ids_(num_ids),
        prev_(num_ids + num_lists),
        next_(num_ids + num_lists),
        size_(num_lists, 0) {
    for (int32_t l = 0; l < num_lists; ++l) prev_[num_ids + l] = next_[num_ids + l] = num_ids + l;
  }
  int32_t size(int32_t list) const { return size_[list]; }
  // The least recently used id of a non-empty list.
  int32_t front(int32_t list) const { return next_[num_ids_ + list]; }
  // Most recently used end.
  void push_back(int32_t list, int32_t id) { insert_after(list, prev_[num_ids_ + list], id); }
  // Least recently used end.
  void push_front(int32_t list, int32_t id) { insert_after(list, num_ids_ + list, id); }
  void remove(int32_t list, int32_t id) {
    next_[prev_[id]] = next_[id];
    prev_[next_[id]] = prev_[id];
    --size_[list];
  }

 private:
  void insert_after(int32_t list, int32_t node, int32_t id) {
    const int32_t after = next_[node];
    prev_[id] = node;
    next_[id] = after;
    next_[node] = id;
    prev_[after] = id;
    ++size_[list];
  }

  int32_t num_ids_;
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  std::vector<int32_t> size_;
};

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_LRU_LISTS_H_
