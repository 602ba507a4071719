#include "shared_tier.h"

namespace pagedkv::sim {

SharedTier::SharedTier(int64_t capacity_blocks) : capacity_blocks_(capacity_blocks) {}

void SharedTier::stage(std::span<const BlockHash> hashes) {
  staged_.insert(staged_.end(), hashes.begin(), hashes.end());
}

void SharedTier::publish(double time_s) {
  for (const BlockHash& hash : staged_) {
    if (index_.contains(hash)) continue;
    if (size() == capacity_blocks_) {
      index_.erase(lru_.front().hash);
      lru_.pop_front();
      ++blocks_evicted_;
    }
    index_.emplace(hash, lru_.insert(lru_.end(), {.hash = hash, .readable_s = time_s}));
    ++blocks_written_;
  }
  staged_.clear();
}

int32_t SharedTier::read_prefix(std::span<const BlockHash> hashes, double time_s) {
  int32_t hits = 0;
  for (const BlockHash& hash : hashes) {
    auto it = index_.find(hash);
    if (it == index_.end() || it->second->readable_s > time_s) break;
    lru_.splice(lru_.end(), lru_, it->second);
    ++hits;
  }
  return hits;
}

}  // namespace pagedkv::sim
