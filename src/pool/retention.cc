// BlockPool's retention: priorities, durations and their expiry on the pool's clock.
#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "pool/adaptive_eviction.h"
#include "pool/block_pool_core.h"
#include "pool/free_queue.h"

namespace pagedkv::internal {

int32_t BlockPoolCore::list_for(BlockId b) const {
  return FreeQueue::priority_list(priority_of(b), adaptive_ && adaptive_->frequent(b));
}

// A parked block whose last cached child left goes back to its list (kNoBlock: none).
void BlockPoolCore::requeue(BlockId b) {
  if (b != kNoBlock) free_queue_->move_by_stamp(b, list_for(b));
}

// The priority the free queue files `b` under: kNoPriority counts as the default.
int32_t BlockPoolCore::priority_of(BlockId b) const {
  return priority_[b] == kNoPriority ? kDefaultRetentionPriority : priority_[b];
}

int64_t BlockPoolCore::duration_of(BlockId b) const {
  const auto it = durations_ms_.find(b);
  return it == durations_ms_.end() ? 0 : it->second;
}

void BlockPoolCore::clear_retention(BlockId b) {
  priority_[b] = kNoPriority;
  durations_ms_.erase(b);
}

// Out of line: enqueue_freed() stays small enough to inline into the release loops.
void BlockPoolCore::schedule_expiry(BlockId b) {
  const int64_t duration = duration_of(b);
  if (duration == 0) return;
  // Saturating: any clock value (negative, another epoch) and any duration give an end
  // at or after now, INT64_MAX at the latest.
  const int64_t now = now_ms();
  const int64_t end = now > 0 && duration > std::numeric_limits<int64_t>::max() - now
                          ? std::numeric_limits<int64_t>::max()
                          : now + duration;
  expiries_.push_back({end, b, free_queue_->stamp(b)});
  std::push_heap(expiries_.begin(), expiries_.end(), std::greater<>());
}

absl::Status BlockPoolCore::set_retention(BlockId block, int32_t priority, int64_t duration_ms) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "set_retention");
  }
  if (priority < kMinRetentionPriority || priority > kMaxRetentionPriority || duration_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BlockPool::set_retention: priority ", priority, " must be in [", kMinRetentionPriority,
        ", ", kMaxRetentionPriority, "] and duration_ms ", duration_ms, " >= 0"));
  }
  if (ref_count_[block] == 0) {
    return absl::FailedPreconditionError(absl::StrCat("BlockPool::set_retention: block ", block,
                                                      " is free (ref_count 0); set it in use"));
  }
  set_retention_unchecked(block, priority, duration_ms);
  return absl::OkStatus();
}

// The first holder to set a retention gives it; later ones raise it (holders that set
// none have no say).
void BlockPoolCore::set_retention_unchecked(BlockId block, int32_t priority, int64_t duration_ms) {
  PAGEDKV_DCHECK(ref_count_[block] > 0);
  if (priority_[block] != kNoPriority) {
    if (priority < priority_[block]) return;
    const int64_t current = duration_of(block);
    const bool longer = duration_ms == 0 || (current != 0 && duration_ms > current);
    if (priority == priority_[block] && !longer) return;
  }
  priority_[block] = static_cast<uint8_t>(priority);
  if (duration_ms > 0) {
    durations_ms_[block] = duration_ms;
  } else {
    durations_ms_.erase(block);
  }
}

void BlockPoolCore::copy_retention(BlockId block, const EvictedBlock& from) {
  if (from.priority != kNoPriority) set_retention_unchecked(block, from.priority, from.duration_ms);
}

// Returns free blocks whose retention expired to the default priority's list, at the
// place their stamps give them. Entries of blocks re-queued since are stale and dropped.
void BlockPoolCore::expire_retention() {
  if (expiries_.empty()) [[likely]] {
    return;
  }
  const int64_t now = now_ms();
  while (!expiries_.empty() && expiries_.front().time_ms <= now) {
    std::pop_heap(expiries_.begin(), expiries_.end(), std::greater<>());
    const Expiry e = expiries_.back();
    expiries_.pop_back();
    const BlockId b = e.block;
    if (!free_queue_->is_queued(b) || free_queue_->stamp(b) != e.stamp) continue;
    if (free_queue_->list_of(b) == FreeQueue::kParkedList) {
      clear_retention(b);  // requeued at the default priority when unparked
      continue;
    }
    if (free_queue_->list_of(b) != list_for(b)) continue;
    clear_retention(b);
    requeue(b);
  }
}

int64_t BlockPoolCore::now_ms() const {
  if (clock_) return clock_();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pagedkv::internal
