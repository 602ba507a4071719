// Internal: the indexed blocks of a HashIndex by what they start with, for partial-block
// reuse (KvCacheManager::Options::enable_partial_block_reuse).
//
// A prompt that continues past its last full-block hit into the first k < block_size
// tokens of a cached block can reuse those k tokens' K/V through a copy of that block.
// The chained hash cannot find such a block (it names whole blocks), so this index keys
// every indexed block by (its parent's content key, its first token):
//
//   heads_: (parent key, first token) -> block B1      list: B1 -> B2 -> ...  (next_/prev_)
//
// The caller scans the few blocks of one key and compares tokens (verified token by
// token, extra keys included). Insertion and removal are O(1).
#ifndef PAGEDKV_POOL_PARTIAL_PREFIX_INDEX_H_
#define PAGEDKV_POOL_PARTIAL_PREFIX_INDEX_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class PartialPrefixIndex {
 public:
  explicit PartialPrefixIndex(int32_t num_blocks)
      : next_(num_blocks, kNoBlock), prev_(num_blocks, kNoBlock) {}

  void add(BlockId b, uint64_t parent_key, TokenId first) {
    auto [it, inserted] = heads_.try_emplace(Key{parent_key, first}, b);
    if (inserted) return;
    next_[b] = it->second;
    prev_[it->second] = b;
    it->second = b;
  }

  void remove(BlockId b, uint64_t parent_key, TokenId first) {
    if (prev_[b] != kNoBlock) {
      next_[prev_[b]] = next_[b];
    } else if (next_[b] == kNoBlock) {
      heads_.erase(Key{parent_key, first});
    } else {
      heads_[Key{parent_key, first}] = next_[b];
    }
    if (next_[b] != kNoBlock) prev_[next_[b]] = prev_[b];
    next_[b] = kNoBlock;
    prev_[b] = kNoBlock;
  }

  void clear() {
    heads_.clear();
    std::fill(next_.begin(), next_.end(), kNoBlock);
    std::fill(prev_.begin(), prev_.end(), kNoBlock);
  }

  // Calls fn(block) for each block entered under (parent_key, first).
  template <typename Fn>
  void for_each(uint64_t parent_key, TokenId first, Fn fn) const {
    const auto it = heads_.find(Key{parent_key, first});
    if (it == heads_.end()) return;
    for (BlockId b = it->second; b != kNoBlock; b = next_[b]) fn(b);
  }

  // Entries, for check_invariants(): calls fn(parent_key, first, block) for each.
  template <typename Fn>
  void for_each_entry(Fn fn) const {
    for (const auto& [key, head] : heads_) {
      for (BlockId b = head; b != kNoBlock; b = next_[b]) fn(key.parent, key.first, b);
    }
  }

 private:
  struct Key {
    uint64_t parent = 0;
    TokenId first = 0;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H state, const Key& key) {
      return H::combine(std::move(state), key.parent, key.first);
    }
  };
  absl::flat_hash_map<Key, BlockId> heads_;
  std::vector<BlockId> next_;
  std::vector<BlockId> prev_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_PARTIAL_PREFIX_INDEX_H_
