#include "shared_tier.h"

namespace pagedkv::sim {

SharedTier::SharedTier(int64_t capacity_blocks) : capacity_blocks_(capacity_blocks) {}

void SharedTier::store(std::span<const BlockHash> hashes) {
  for (const BlockHash& hash : hashes) {
    if (auto it = index_.find(hash); it != index_.end()) {
      touch(it->second);
      continue;
    }
    if (size() == capacity_blocks_) {
      index_.erase(lru_.front());
      lru_.pop_front();
      ++blocks_evicted_;
    }
    index_.emplace(hash, lru_.insert(lru_.end(), hash));
    ++blocks_written_;
  }
}

int32_t SharedTier::read_prefix(std::span<const BlockHash> hashes) {
  int32_t hits = 0;
  for (const BlockHash& hash : hashes) {
    auto it = index_.find(hash);
    if (it == index_.end()) break;
    touch(it->second);
    ++hits;
  }
  return hits;
}

}  // namespace pagedkv::sim
