// Internal: the ghost list of a host tier with HostAdmission::kReused.
//
// The hashes of the cached blocks that most recently left both tiers of a layer group (an
// eviction not demoted, a host-tier block dropped), at most `capacity` of them: a block
// computed again while its hash is a ghost was reused, though it left the cache in between
// (the adaptive eviction policy's ghost lists serve the same purpose; here they only
// decide admission). One list of pool/ghost_lists.h, bounded.
#ifndef PAGEDKV_CACHE_GHOST_LIST_H_
#define PAGEDKV_CACHE_GHOST_LIST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/types.h"
#include "pool/ghost_lists.h"

namespace pagedkv::internal {

class GhostList {
 public:
  // capacity 0: a list that keeps nothing (the tier admits every block).
  explicit GhostList(int32_t capacity) : capacity_(capacity) {}

  // Makes `hash` the most recent ghost; the oldest leaves when there are more than capacity.
  void add(const BlockHash& hash) {
    if (capacity_ == 0) return;
    list_.add(hash, 0);
    if (list_.size(0) > capacity_) list_.pop_oldest(0);
  }

  // Removes `hash`; whether it was a ghost.
  bool take(const BlockHash& hash) { return list_.take(hash).has_value(); }

  // At most capacity ghosts, each with one live entry in the order.
  absl::Status check_invariants() const {
    if (list_.size(0) > capacity_) {
      return absl::InternalError(absl::StrCat("GhostList invariant: ", list_.size(0),
                                              " ghosts, more than the capacity ", capacity_));
    }
    return list_.check_invariants();
  }

 private:
  int32_t capacity_;
  GhostLists<BlockHash, 1> list_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_GHOST_LIST_H_
