// Internal: the ghost list of a host tier with HostAdmission::kReused.
//
// The hashes of the cached blocks that most recently left both tiers of a layer group (an
// eviction not demoted, a host-tier block dropped), at most `capacity` of them: a block
// computed again while its hash is a ghost was reused, though it left the cache in between
// (ARC's ghost lists serve the same purpose; here they only decide admission).
//
// IMPLEMENTATION DETAILS
//   live_ maps each ghost to the sequence number of its latest add(); order_ holds the adds
//   oldest first. An entry of order_ whose number is not its hash's in live_ is stale (the
//   hash was taken or added again since): skipped when it reaches the front, and dropped
//   whenever order_ grows past twice the capacity, so each add() is O(1) amortized.
#ifndef PAGEDKV_CACHE_GHOST_LIST_H_
#define PAGEDKV_CACHE_GHOST_LIST_H_

#include <cstdint>
#include <deque>
#include <iterator>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class GhostList {
 public:
  // capacity 0: a list that keeps nothing (the tier admits every block).
  explicit GhostList(int32_t capacity) : capacity_(capacity) {}

  // Makes `hash` the most recent ghost; the oldest leaves when there are more than capacity.
  void add(const BlockHash& hash) {
    if (capacity_ == 0) return;
    live_[hash] = next_seq_;
    order_.push_back({hash, next_seq_++});
    while (std::ssize(live_) > capacity_) pop_oldest();
    if (std::ssize(order_) > 2 * int64_t{capacity_}) drop_stale();
  }

  // Removes `hash`; whether it was a ghost.
  bool take(const BlockHash& hash) { return capacity_ != 0 && live_.erase(hash) == 1; }

  // At most capacity ghosts, each with one live entry in the order.
  absl::Status check_invariants() const {
    if (std::ssize(live_) > capacity_) {
      return absl::InternalError(absl::StrCat("GhostList invariant: ", live_.size(),
                                              " ghosts, more than the capacity ", capacity_));
    }
    int64_t live_entries = 0;
    for (const Entry& e : order_) live_entries += is_live(e);
    if (live_entries != std::ssize(live_)) {
      return absl::InternalError(absl::StrCat("GhostList invariant: ", live_entries,
                                              " live entries in the order for ", live_.size(),
                                              " ghosts"));
    }
    return absl::OkStatus();
  }

 private:
  struct Entry {
    BlockHash hash;
    uint64_t seq = 0;
  };

  bool is_live(const Entry& e) const {
    const auto it = live_.find(e.hash);
    return it != live_.end() && it->second == e.seq;
  }
  // Removes the oldest ghost (and the stale entries before it).
  void pop_oldest() {
    while (!is_live(order_.front())) order_.pop_front();
    live_.erase(order_.front().hash);
    order_.pop_front();
  }
  void drop_stale() {
    std::erase_if(order_, [this](const Entry& e) { return !is_live(e); });
  }

  int32_t capacity_;
  uint64_t next_seq_ = 0;
  std::deque<Entry> order_;                        // adds, oldest first
  absl::flat_hash_map<BlockHash, uint64_t> live_;  // ghost -> its latest add
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_GHOST_LIST_H_
