// Internal: intrusive lists of blocks by a key, for the HashIndex's secondary indexes.
//
//   heads_: key -> block B1      list: B1 -> B2 -> ...  (next_/prev_, one pair per block)
//
// A block is in at most one list. Insertion and removal are O(1) with no allocation beyond
// the map's entry per key. Two indexes use it:
//   - partial prefixes: (parent content key, first token) -> indexed blocks, for
//     partial-block reuse (a prompt that continues into part of a cached block);
//   - children: parent content key -> cached blocks, so that a windowed layer group can
//     drop the blocks cached after contents that left the anchor's pools.
#ifndef PAGEDKV_POOL_KEYED_BLOCK_LISTS_H_
#define PAGEDKV_POOL_KEYED_BLOCK_LISTS_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

template <typename Key>
class KeyedBlockLists {
 public:
  explicit KeyedBlockLists(int32_t num_blocks)
      : next_(num_blocks, kNoBlock), prev_(num_blocks, kNoBlock) {}

  void add(BlockId b, const Key& key) {
    auto [it, inserted] = heads_.try_emplace(key, b);
    if (inserted) return;
    next_[b] = it->second;
    prev_[it->second] = b;
    it->second = b;
  }

  void remove(BlockId b, const Key& key) {
    if (prev_[b] != kNoBlock) {
      next_[prev_[b]] = next_[b];
    } else if (next_[b] == kNoBlock) {
      heads_.erase(key);
    } else {
      heads_[key] = next_[b];
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

  bool contains(const Key& key) const { return heads_.contains(key); }

  // Calls fn(block) for each block of `key`'s list; fn must not change the lists.
  template <typename Fn>
  void for_each(const Key& key, Fn fn) const {
    const auto it = heads_.find(key);
    if (it == heads_.end()) return;
    for (BlockId b = it->second; b != kNoBlock; b = next_[b]) fn(b);
  }

  // Calls fn(key, block) for every entry, for check_invariants().
  template <typename Fn>
  void for_each_entry(Fn fn) const {
    for (const auto& [key, head] : heads_) {
      for (BlockId b = head; b != kNoBlock; b = next_[b]) fn(key, b);
    }
  }

 private:
  absl::flat_hash_map<Key, BlockId> heads_;
  std::vector<BlockId> next_;
  std::vector<BlockId> prev_;
};

// The key of the partial-prefix index.
struct PrefixStart {
  uint64_t parent_key = 0;
  TokenId first_token = 0;
  bool operator==(const PrefixStart&) const = default;
  template <typename H>
  friend H AbslHashValue(H state, const PrefixStart& key) {
    return H::combine(std::move(state), key.parent_key, key.first_token);
  }
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_KEYED_BLOCK_LISTS_H_
