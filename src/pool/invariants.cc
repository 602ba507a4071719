// BlockPoolCore::check_invariants(): the free queue, the ref counts and the hash index, one
// clause at a time.
#include "absl/strings/str_cat.h"
#include "pool/adaptive_eviction.h"
#include "pool/block_pool_core.h"
#include "pool/free_queue.h"
#include "pool/hash_index.h"

namespace pagedkv::internal {

absl::Status BlockPoolCore::check_invariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("BlockPool invariant: ", parts...));
  };
  // The queue: links agree both ways, at most num_blocks steps, only ref-0 blocks; a
  // cached block sits in its priority's list, and each priority's list is in LRU order.
  int32_t walked = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = free_queue_->first(); b != kNoBlock; b = free_queue_->next(b)) {
    if (b < 0 || b >= num_blocks_) return broken("free queue holds invalid id ", b);
    if (++walked > num_blocks_) return broken("free queue longer than ", num_blocks_, " blocks");
    const int32_t list = free_queue_->list_of(b);
    const bool same_list = prev != kNoBlock && free_queue_->list_of(prev) == list;
    if (free_queue_->prev_in_list(b) != (same_list ? prev : kNoBlock)) {
      return broken("block ", b, ": prev link ", free_queue_->prev_in_list(b), " but walked from ",
                    prev);
    }
    if (ref_count_[b] != 0)
      return broken("block ", b, ": in the free queue with ref_count ", ref_count_[b]);
    if (list != FreeQueue::kCleanList && list != FreeQueue::kParkedList &&
        (list - 1) / 2 != priority_of(b)) {
      return broken("block ", b, ": in list ", list, " but its priority is ", priority_of(b));
    }
    if (!adaptive_ && (FreeQueue::is_frequent_list(list) || list == FreeQueue::kParkedList)) {
      return broken("block ", b, ": in list ", list, " under LRU");
    }
    if (list == FreeQueue::kCleanList && hash_index_->is_cached(b)) {
      return broken("cached block ", b, " in the clean list");
    }
    if (same_list && list != FreeQueue::kCleanList && list != FreeQueue::kParkedList &&
        free_queue_->stamp(prev) >= free_queue_->stamp(b)) {
      return broken("block ", b, " after block ", prev, " out of LRU order in list ", list);
    }
    prev = b;
  }
  // Every id: ref count 0 <=> queued; counts partition the pool.
  int32_t used = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) {
    if (ref_count_[b] < 0) return broken("block ", b, ": ref_count ", ref_count_[b], " < 0");
    if ((ref_count_[b] == 0) != free_queue_->is_queued(b)) {
      return broken("block ", b, ": ref_count ", ref_count_[b],
                    free_queue_->is_queued(b) ? " but queued" : " but not in the free queue");
    }
    used += ref_count_[b] > 0;
  }
  if (used != used_blocks_) return broken("used_blocks ", used_blocks_, " but ", used, " counted");
  if (used + walked != num_blocks_) {
    return broken("used ", used, " + ", walked, " queued != num_blocks ", num_blocks_);
  }
  // The index: every entry points at an indexed block that holds that hash; every
  // standby sits in the chain of the indexed block of its hash.
  absl::Status status;
  int32_t entries = 0;
  hash_index_->for_each([&](const BlockHash& hash, BlockId b) {
    ++entries;
    if (!status.ok()) return;
    if (b < 0 || b >= num_blocks_) {
      status = broken("index entry points at invalid id ", b);
    } else if (hash_index_->role(b) != HashIndex::Role::kIndexed ||
               !(hash_index_->hash(b) == hash)) {
      status = broken("index entry for block ", b, " does not match the block's hash");
    } else if (hash_index_->prev_standby(b) != kNoBlock) {
      status = broken("indexed block ", b, " has a standby link before it");
    }
  });
  if (!status.ok()) return status;
  int32_t indexed = 0;
  int32_t standby = 0;
  int32_t cached_free = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) {
    const HashIndex::Role role = hash_index_->role(b);
    indexed += role == HashIndex::Role::kIndexed;
    cached_free += role != HashIndex::Role::kNone && ref_count_[b] == 0;
    if (role != HashIndex::Role::kNone && space_of(b) != 0 &&
        (space_of(b) < 0 || space_of(b) >= std::ssize(key_spaces_))) {
      return broken("cached block ", b, " in key space ", space_of(b), " of ", key_spaces_.size());
    }
    if (role != HashIndex::Role::kStandby) continue;
    ++standby;
    // Walk back to the indexed block, at most num_blocks steps.
    BlockId head = b;
    for (int32_t steps = 0; hash_index_->prev_standby(head) != kNoBlock; ++steps) {
      if (steps > num_blocks_) return broken("standby chain of block ", b, " loops");
      head = hash_index_->prev_standby(head);
    }
    if (hash_index_->role(head) != HashIndex::Role::kIndexed ||
        !(hash_index_->hash(head) == hash_index_->hash(b)) || space_of(head) != space_of(b) ||
        hash_index_->find(hash_index_->hash(b)) != head) {
      return broken("standby block ", b, " is not in the chain of the block indexed by its hash");
    }
  }
  if (indexed != entries)
    return broken(indexed, " blocks marked indexed but ", entries, " entries");
  if (standby != hash_index_->num_standby()) {
    return broken("num_standby ", hash_index_->num_standby(), " but ", standby, " counted");
  }
  if (cached_free != cached_free_blocks_) {
    return broken("cached_free_blocks ", cached_free_blocks_, " but ", cached_free, " counted");
  }
  if (!enable_caching_ && indexed + standby != 0) {
    return broken("caching off but ", indexed + standby, " blocks hashed");
  }
  if (!hash_index_->partial_prefixes_consistent()) {
    return broken("the partial-prefix index does not hold exactly the indexed blocks");
  }
  if (!hash_index_->children_consistent()) {
    return broken("the children index does not hold exactly the cached blocks");
  }
  // Remembered contents (PoolRoles::revive_contents) are those of blocks cached after them.
  absl::flat_hash_map<uint64_t, int32_t> followers;
  for (const auto& [content_key, dead] : dead_parents_) {
    if (!has_followers(content_key)) {
      return broken("remembered content ", content_key, " has nothing cached after it");
    }
    if (dead.parent_key != 0) ++followers[dead.parent_key];
  }
  if (followers != dead_followers_) {
    return broken("remembered contents counted after ", dead_followers_.size(),
                  " keys, found after ", followers.size());
  }
  for (const auto& [key, content_key] : dead_parent_keys_) {
    const auto it = dead_parents_.find(content_key);
    if (it == dead_parents_.end() || !(it->second.key == key)) {
      return broken("remembered key of content ", content_key, " names no such content");
    }
  }
  if (adaptive_) return adaptive_->check_invariants(*free_queue_, *hash_index_);
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
