// The adaptive eviction policy: victims, ghost hits, the frequent flags, the checks.
#include "pool/adaptive_eviction.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

BlockId AdaptiveEviction::take_victim(FreeQueue& queue, const HashIndex& index) {
  while (true) {
    const int32_t first = queue.first_list();
    int32_t from = first;
    // The lowest priority's recent list comes first (interleaved lists); ARC's REPLACE
    // takes from T1 only while T1 is over its target.
    if (first != FreeQueue::kCleanList && first != FreeQueue::kParkedList &&
        !FreeQueue::is_frequent_list(first) && !queue.list_empty(first + 1) &&
        capacity_ - cached_[1] <= target_) {
      from = first + 1;
    }
    const BlockId b = queue.front(from);
    if (from != FreeQueue::kParkedList && index.is_cached(b) && children_[b] > 0) {
      queue.park(b);
      ++stats_.parked;
      continue;
    }
    queue.remove(b);
    return b;
  }
}

void AdaptiveEviction::on_cached(BlockId block, const BlockHash& hash, BlockId parent,
                                 FreeQueue& queue, const HashIndex& index) {
  const std::optional<int> ghost = ghosts_.take(hash.lo);
  const bool recent_ghost = ghost == kRecent;
  const bool frequent_ghost = ghost == kFrequent;
  const double b1 = std::max(1, ghosts_.size(kRecent));
  const double b2 = std::max(1, ghosts_.size(kFrequent));
  if (recent_ghost) {
    ++stats_.recent_ghost_hits;
    target_ = std::min<double>(capacity_, target_ + std::max(1.0, b2 / b1));
  } else if (frequent_ghost) {
    ++stats_.frequent_ghost_hits;
    target_ = std::max(0.0, target_ - std::max(1.0, b1 / b2));
  }
  frequent_[block] = 0;
  ++cached_[0];
  if (parent != kNoBlock && index.is_cached(parent)) {
    parent_[block] = parent;
    parent_generation_[block] = generation_[parent];
    ++children_[parent];
  }
  if (recent_ghost || frequent_ghost) make_frequent(block, queue);
}

// Walks up while the ancestors are recent: each block turns frequent once per caching, so
// the walks are O(1) amortized. A queued ancestor moves to its priority's frequent list.
void AdaptiveEviction::make_frequent(BlockId block, FreeQueue& queue) {
  for (BlockId b = block; !frequent_[b];) {
    frequent_[b] = 1;
    --cached_[0];
    ++cached_[1];
    if (queue.is_queued(b) && queue.list_of(b) != FreeQueue::kParkedList) {
      queue.move_by_stamp(b, queue.list_of(b) + 1);
    }
    if (!linked(b)) return;
    b = parent_[b];
  }
}

BlockId AdaptiveEviction::on_uncached(BlockId block, const BlockHash* evicted_hash,
                                      const FreeQueue& queue) {
  const bool was_frequent = frequent_[block] != 0;
  --cached_[was_frequent];
  frequent_[block] = 0;
  ++generation_[block];  // its children's links lapse
  children_[block] = 0;
  if (evicted_hash != nullptr) {
    // A recent block becomes a ghost only where B1 has room (|B1| <= |T2|): in a scan of
    // one-off blocks it has none, and no hash is filed.
    if (was_frequent || cached_[1] > 0)
      ghosts_.add(evicted_hash->lo, was_frequent ? kFrequent : kRecent);
  }
  trim_ghosts();
  BlockId requeue = kNoBlock;
  if (linked(block)) {
    const BlockId parent = parent_[block];
    if (--children_[parent] == 0 && queue.is_queued(parent) &&
        queue.list_of(parent) == FreeQueue::kParkedList) {
      requeue = parent;
    }
  }
  parent_[block] = kNoBlock;
  return requeue;
}

void AdaptiveEviction::on_reset(FreeQueue& queue) {
  for (BlockId b = queue.front(FreeQueue::kParkedList); b != kNoBlock;
       b = queue.front(FreeQueue::kParkedList)) {
    queue.remove(b);
    queue.insert_clean_after(kNoBlock, b);
  }
  std::fill(frequent_.begin(), frequent_.end(), 0);
  std::fill(parent_.begin(), parent_.end(), kNoBlock);
  std::fill(children_.begin(), children_.end(), 0);
  for (uint32_t& g : generation_) ++g;
  cached_[0] = cached_[1] = 0;
  ghosts_.clear();  // their hashes name contents from before the reset
}

// ARC's directory bounds, |T1| + |B1| <= C and T1, T2, B1, B2 together <= 2C, with
// |T1| = C - |T2|: |B1| <= |T2| and |B1| + |B2| <= C.
void AdaptiveEviction::trim_ghosts() {
  while (ghosts_.size(kRecent) > cached_[1]) ghosts_.pop_oldest(kRecent);
  while (ghosts_.size(kRecent) + ghosts_.size(kFrequent) > capacity_) {
    ghosts_.pop_oldest(ghosts_.size(kFrequent) > 0 ? kFrequent : kRecent);
  }
}

absl::Status AdaptiveEviction::check_invariants(const FreeQueue& queue,
                                                const HashIndex& index) const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("AdaptiveEviction invariant: ", parts...));
  };
  const auto n = static_cast<BlockId>(frequent_.size());
  std::vector<int32_t> children(n, 0);
  int32_t cached[2] = {0, 0};
  for (BlockId b = 0; b < n; ++b) {
    if (!index.is_cached(b)) {
      if (frequent_[b]) return broken("block ", b, " is frequent but not cached");
      continue;
    }
    ++cached[frequent_[b]];
    if (!linked(b)) continue;
    ++children[parent_[b]];
    if (!index.is_cached(parent_[b])) {
      return broken("block ", b, " is linked to its parent ", parent_[b], ", which is not cached");
    }
    if (frequent_[b] && !frequent_[parent_[b]]) {
      return broken("block ", b, " is frequent but its parent ", parent_[b], " is recent");
    }
  }
  if (cached[0] != cached_[0] || cached[1] != cached_[1]) {
    return broken("|T1|, |T2| counted ", cached_[0], ", ", cached_[1], " but hold ", cached[0],
                  ", ", cached[1]);
  }
  for (BlockId b = 0; b < n; ++b) {
    if (children[b] != children_[b]) {
      return broken("block ", b, " counts ", children_[b], " cached children, has ", children[b]);
    }
    if (!queue.is_queued(b)) continue;
    const int32_t list = queue.list_of(b);
    if (list == FreeQueue::kParkedList && (!index.is_cached(b) || children_[b] == 0)) {
      return broken("parked block ", b, " is not a cached parent");
    }
    if (index.is_cached(b) && list != FreeQueue::kParkedList &&
        FreeQueue::is_frequent_list(list) != frequent(b)) {
      return broken("cached block ", b, " in list ", list, " but frequent is ", frequent(b));
    }
  }
  if (target_ < 0 || target_ > capacity_) {
    return broken("target ", target_, " outside [0, ", capacity_, "]");
  }
  // The ghosts: counted right, one live entry each in their list's order, within ARC's
  // bounds.
  if (absl::Status s = ghosts_.check_invariants(); !s.ok()) return broken(s.message());
  if (ghosts_.size(kRecent) > cached_[1]) {
    return broken("|B1| = ", ghosts_.size(kRecent), " > |T2| = ", cached_[1]);
  }
  if (ghosts_.size(kRecent) + ghosts_.size(kFrequent) > capacity_) {
    return broken("|B1| + |B2| = ", ghosts_.size(kRecent) + ghosts_.size(kFrequent),
                  " > C = ", capacity_);
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
