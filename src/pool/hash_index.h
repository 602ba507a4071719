// Internal: the prefix-cache index of a BlockPool and the data that verifies a hit.
//
//   lookup flow:  hash --index_--> candidate block --verify--> share (BlockPool::touch)
//                                      |
//                   stored tokens == tokens, stored extra keys == extra keys,
//                   stored parent == parent block, stored parent generation ==
//                   generation of that block now
//
// A hash hit alone is never trusted: with an injected weak hash (tests, fuzzers) or a real
// collision, verification rejects the candidate. The parent is checked by block id and
// generation: a block's generation changes whenever it is (re)allocated, that is whenever
// its contents may change, so a child can only match after the very contents it was
// cached after, never after a later refill of the same block id.
#ifndef PAGEDKV_POOL_HASH_INDEX_H_
#define PAGEDKV_POOL_HASH_INDEX_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class HashIndex {
 public:
  HashIndex(int32_t num_blocks, int32_t block_size)
      : block_size_(block_size),
        cached_(num_blocks, 0),
        hash_(num_blocks),
        parent_(num_blocks, kNoBlock),
        parent_generation_(num_blocks, 0),
        generation_(num_blocks, 0),
        extra_keys_(num_blocks),
        // Left uninitialized: large pools of large blocks only touch the pages they cache.
        tokens_(std::make_unique_for_overwrite<TokenId[]>(static_cast<size_t>(num_blocks) *
                                                          block_size)) {}

  int32_t size() const { return static_cast<int32_t>(index_.size()); }
  bool is_cached(BlockId b) const { return cached_[b] != 0; }
  const BlockHash& hash(BlockId b) const { return hash_[b]; }
  uint32_t generation(BlockId b) const { return generation_[b]; }

  // The block indexed under `hash`, or kNoBlock. Unverified.
  BlockId find(const BlockHash& hash) const {
    const auto it = index_.find(hash);
    return it == index_.end() ? kNoBlock : it->second;
  }

  bool verify(BlockId b, BlockId parent, std::span<const TokenId> tokens,
              std::span<const uint64_t> extra_keys) const {
    if (parent_[b] != parent) return false;
    if (parent != kNoBlock && parent_generation_[b] != generation_[parent]) return false;
    const auto& keys = extra_keys_[b];
    if (!std::equal(keys.begin(), keys.end(), extra_keys.begin(), extra_keys.end())) return false;
    const TokenId* stored = block_tokens(b);
    return std::equal(stored, stored + block_size_, tokens.begin(), tokens.end());
  }

  // Indexes `b` under `hash` unless the hash is taken; returns whether it did.
  bool insert(BlockId b, const BlockHash& hash, BlockId parent, std::span<const TokenId> tokens,
              std::span<const uint64_t> extra_keys) {
    if (!index_.try_emplace(hash, b).second) return false;
    cached_[b] = 1;
    hash_[b] = hash;
    parent_[b] = parent;
    parent_generation_[b] = parent == kNoBlock ? 0 : generation_[parent];
    extra_keys_[b].assign(extra_keys.begin(), extra_keys.end());
    std::copy(tokens.begin(), tokens.end(), block_tokens(b));
    return true;
  }

  // Removes `b` from the index.
  void erase(BlockId b) {
    index_.erase(hash_[b]);
    cached_[b] = 0;
  }

  // Marks that `b` is about to receive new contents.
  void renew(BlockId b) { ++generation_[b]; }

  // Calls fn(hash, block) for every entry.
  template <typename Fn>
  void for_each(Fn fn) const {
    for (const auto& [hash, block] : index_) fn(hash, block);
  }

 private:
  TokenId* block_tokens(BlockId b) const {
    return tokens_.get() + static_cast<size_t>(b) * block_size_;
  }

  int32_t block_size_;
  absl::flat_hash_map<BlockHash, BlockId> index_;
  // Per block; meaningful while cached_[b] (parent_generation_: generation_[parent_[b]]
  // when b was indexed).
  std::vector<uint8_t> cached_;
  std::vector<BlockHash> hash_;
  std::vector<BlockId> parent_;
  std::vector<uint32_t> parent_generation_;
  std::vector<uint32_t> generation_;
  std::vector<absl::InlinedVector<uint64_t, 2>> extra_keys_;
  std::unique_ptr<TokenId[]> tokens_;  // [num_blocks, block_size]
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_HASH_INDEX_H_
