// Internal: the prefix-cache index of a BlockPool and the data that verifies a hit.
//
//   lookup flow:  hash --index_--> candidate block --verify--> share (BlockPool::touch)
//                                      |
//                   stored tokens == tokens, stored extra keys == extra keys,
//                   stored parent key == content key of the parent block now
//
// A hash hit alone is never trusted: with an injected weak hash (tests, fuzzers) or a real
// collision, verification rejects the candidate. The parent is checked by content key:
// every (re)allocation gives a block a fresh key, that is whenever its contents may
// change, so a child can only match after the very contents it was cached after, never
// after a later refill of the same block id.
//
// Standby duplicates: a block whose hash is already indexed by another block (a
// block-aligned prompt recomputes its last block, which was cached) is not indexed but,
// when its tokens, extra keys and parent key equal the indexed block's, kept as a standby
// of that block with the same content key. When the indexed block leaves (evicted,
// uncached), its oldest standby takes its place, so the content stays cached while
// a copy is resident, and the children cached after the original still verify.
//
//   index_: hash -> indexed block P       standby chain: P -> s2 -> s1   (Entry::next/prev)
//
// A block holding a hash, indexed or standby, "is cached": it goes to the tail of the free
// queue when freed and counts as free-cached.
//
// Tiers: a block copied to another pool (demoted to the host tier, promoted back) takes
// its content key with it (set_content_key()), so a child verifies after the copy of its
// parent in either pool; content keys then name contents across the two pools.
#ifndef PAGEDKV_POOL_HASH_INDEX_H_
#define PAGEDKV_POOL_HASH_INDEX_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "pagedkv/types.h"
#include "pool/keyed_block_lists.h"

namespace pagedkv::internal {

class HashIndex {
 public:
  enum class Role : uint8_t { kNone, kIndexed, kStandby };
  enum class Insert { kIndexed, kStandby, kRefused };

  HashIndex(int32_t num_blocks, int32_t block_size)
      : block_size_(block_size),
        role_(num_blocks, Role::kNone),
        entries_(num_blocks),
        extra_keys_(num_blocks),
        // Left uninitialized: large pools of large blocks only touch the pages they cache.
        tokens_(std::make_unique_for_overwrite<TokenId[]>(static_cast<size_t>(num_blocks) *
                                                          block_size)) {}

  // Indexed entries (hashes); standby blocks are not counted.
  int32_t size() const { return static_cast<int32_t>(index_.size()); }
  int32_t num_standby() const { return num_standby_; }
  bool is_cached(BlockId b) const { return role_[b] != Role::kNone; }
  Role role(BlockId b) const { return role_[b]; }
  const BlockHash& hash(BlockId b) const { return entries_[b].hash; }

  // The block indexed under `hash`, or kNoBlock. Unverified.
  BlockId find(const BlockHash& hash) const {
    const auto it = index_.find(hash);
    return it == index_.end() ? kNoBlock : it->second;
  }

  // Whether `b` holds `tokens` and `extra_keys` after the contents `parent_key` names.
  bool verify(BlockId b, uint64_t parent_key, std::span<const TokenId> tokens,
              std::span<const uint64_t> extra_keys) const {
    if (entries_[b].parent_key != parent_key) return false;
    return same_contents(b, tokens, extra_keys);
  }

  // Indexes `b` under `hash` unless the hash is taken; a block equal to the indexed one
  // (tokens, extra keys, parent) becomes its standby instead. Returns what happened.
  // Inlined: once per block an allocation evicts or a decode step fills, and BlockPool
  // calls both from two places only.
  [[gnu::always_inline]] Insert insert(BlockId b, const BlockHash& hash, uint64_t parent_key,
                                       const BlockHash* parent_hash,
                                       std::span<const TokenId> tokens,
                                       std::span<const uint64_t> extra_keys) {
    const auto [it, inserted] = index_.try_emplace(hash, b);
    if (!inserted) {
      const BlockId indexed = it->second;
      if (entries_[indexed].parent_key != parent_key ||
          !same_contents(indexed, tokens, extra_keys)) {
        return Insert::kRefused;
      }
      // Same contents: children verify after b too.
      entries_[b].content_key = entries_[indexed].content_key;
      link_standby(indexed, b);
    }
    role_[b] = inserted ? Role::kIndexed : Role::kStandby;
    entries_[b].hash = hash;
    entries_[b].parent_key = parent_key;
    if (keeps_extras_) [[unlikely]] {
      insert_extras(b, inserted, parent_key, parent_hash, tokens[0]);
    }
    if (entries_[b].has_extra_keys || !extra_keys.empty()) [[unlikely]] {
      extra_keys_[b].assign(extra_keys.begin(), extra_keys.end());
      entries_[b].has_extra_keys = !extra_keys.empty();
    }
    std::copy(tokens.begin(), tokens.end(), block_tokens(b));
    return inserted ? Insert::kIndexed : Insert::kStandby;
  }

  // Takes `b` out of the index or its standby chain. Returns true when its hash left the
  // index (no standby took its place).
  [[gnu::always_inline]] bool erase(BlockId b) {
    const Role role = role_[b];
    role_[b] = Role::kNone;
    const BlockId newest = role == Role::kIndexed ? entries_[b].next : kNoBlock;
    const BlockId successor = newest == kNoBlock ? kNoBlock : oldest_standby(newest);
    if (keeps_extras_) [[unlikely]] {
      erase_extras(b, role, successor);
    }
    if (role == Role::kStandby) {
      unlink_standby(b);
      return false;
    }
    entries_[b].next = kNoBlock;
    if (successor == kNoBlock) {
      index_.erase(entries_[b].hash);
      return true;
    }
    // The oldest standby becomes the indexed block, ahead of the rest of the chain: vLLM's
    // pool, too, serves the oldest copy of a hash that is left.
    if (successor != newest) {
      entries_[entries_[successor].prev].next = kNoBlock;
      entries_[successor].next = newest;
      entries_[newest].prev = successor;
    }
    entries_[successor].prev = kNoBlock;
    role_[successor] = Role::kIndexed;
    --num_standby_;
    index_[entries_[b].hash] = successor;
    return false;
  }

  // Forgets every entry and standby.
  void clear() {
    index_.clear();
    if (partial_) partial_->clear();
    if (children_) children_->clear();
    std::fill(role_.begin(), role_.end(), Role::kNone);
    for (Entry& e : entries_) e.next = e.prev = kNoBlock;
    num_standby_ = 0;
  }

  // Starts loading what erase(b) and renew(b) will touch: `b`'s entry and, when it is
  // cached, its hash's slot in the index.
  void prefetch_erase(BlockId b) const {
    __builtin_prefetch(&entries_[b]);
    if (is_cached(b)) index_.prefetch(entries_[b].hash);
  }

  // Marks that `b` is about to receive new contents.
  void renew(BlockId b) { entries_[b].content_key = next_content_key_++; }
  // `b` receives a copy of the contents `key` names (a block of the other tier).
  void set_content_key(BlockId b, uint64_t key) { entries_[b].content_key = key; }
  // Draws this index's content keys from `first` on, so that two pools whose blocks are
  // copied into each other never give different contents the same key.
  void start_content_keys_at(uint64_t first) { next_content_key_ = first; }

  // 0 stands for "no parent"; content keys start at 1.
  uint64_t key_of(BlockId parent) const {
    return parent == kNoBlock ? 0 : entries_[parent].content_key;
  }
  uint64_t content_key(BlockId b) const { return entries_[b].content_key; }
  // What a cached block was entered with; still readable after erase() until `b` is
  // cached again (an evicted block's copy is entered into the other tier from it).
  uint64_t parent_key(BlockId b) const { return entries_[b].parent_key; }
  // Parent hashes are kept only after keep_parent_hashes() (the device index of a pool with
  // a host tier, whose demoted copies announce them); nullopt otherwise.
  void keep_parent_hashes() {
    parent_hash_.resize(entries_.size());
    keeps_extras_ = true;
  }
  std::optional<BlockHash> parent_hash(BlockId b) const {
    return parent_hash_.empty() ? std::nullopt : parent_hash_[b];
  }
  std::span<const TokenId> tokens(BlockId b) const {
    return {block_tokens(b), size_t(block_size_)};
  }
  std::span<const uint64_t> extra_keys(BlockId b) const { return extra_keys_[b]; }

  // Keeps indexed blocks findable by their first tokens (longest_partial_match()).
  void index_partial_prefixes() {
    partial_.emplace(static_cast<int32_t>(entries_.size()));
    keeps_extras_ = true;
  }
  bool indexes_partial_prefixes() const { return partial_.has_value(); }

  // The indexed block cached after the contents `parent_key` names, with `extra_keys`,
  // whose first tokens equal the longest prefix of `tokens` (at most block_size - 1 of
  // them); *matched is that prefix's length (0 and kNoBlock when none). Needs
  // index_partial_prefixes().
  BlockId longest_partial_match(uint64_t parent_key, std::span<const TokenId> tokens,
                                std::span<const uint64_t> extra_keys, int32_t* matched) const {
    BlockId best = kNoBlock;
    *matched = 0;
    if (tokens.empty()) return best;
    const size_t limit = std::min(tokens.size(), static_cast<size_t>(block_size_ - 1));
    partial_->for_each({parent_key, tokens[0]}, [&](BlockId b) {
      const auto& keys = extra_keys_[b];
      if (!std::equal(keys.begin(), keys.end(), extra_keys.begin(), extra_keys.end())) return;
      const TokenId* stored = block_tokens(b);
      const auto n = static_cast<int32_t>(
          std::mismatch(tokens.begin(), tokens.begin() + limit, stored).first - tokens.begin());
      if (n > *matched) {
        *matched = n;
        best = b;
      }
    });
    return best;
  }

  // Whether the partial-prefix index holds exactly the indexed blocks, each under its
  // parent key and first token (for check_invariants()).
  bool partial_prefixes_consistent() const {
    if (!partial_) return true;
    size_t entries = 0;
    bool consistent = true;
    partial_->for_each_entry([&](const PrefixStart& key, BlockId b) {
      ++entries;
      consistent &= role_[b] == Role::kIndexed && entries_[b].parent_key == key.parent_key &&
                    block_tokens(b)[0] == key.first_token;
    });
    return consistent && entries == index_.size();
  }

  // Keeps every cached block (indexed or standby) findable by its parent content key
  // (for_each_child()).
  void index_children() {
    children_.emplace(static_cast<int32_t>(entries_.size()));
    keeps_extras_ = true;
  }
  // Calls fn(block) for each cached block entered after the contents `parent_key` names;
  // fn must not change the index.
  template <typename Fn>
  void for_each_child(uint64_t parent_key, Fn fn) const {
    children_->for_each(parent_key, fn);
  }
  // Whether a cached block was entered after the contents `parent_key` names.
  bool has_children(uint64_t parent_key) const { return children_->contains(parent_key); }
  // Whether the children index holds exactly the cached blocks, each under its parent key.
  bool children_consistent() const {
    if (!children_) return true;
    int64_t entries = 0;
    bool consistent = true;
    children_->for_each_entry([&](uint64_t parent_key, BlockId b) {
      ++entries;
      consistent &= role_[b] != Role::kNone && entries_[b].parent_key == parent_key;
    });
    return consistent && entries == std::ssize(index_) + num_standby_;
  }

  // Whether `b` holds `tokens` and `extra_keys`, whatever it was cached after.
  bool holds_tokens(BlockId b, std::span<const TokenId> tokens,
                    std::span<const uint64_t> extra_keys) const {
    return same_contents(b, tokens, extra_keys);
  }

  // Calls fn(hash, block) for every indexed entry.
  template <typename Fn>
  void for_each(Fn fn) const {
    for (const auto& [hash, block] : index_) fn(hash, block);
  }

  // The standby chain link before `b` (kNoBlock for the indexed block), for
  // check_invariants().
  BlockId prev_standby(BlockId b) const { return entries_[b].prev; }

 private:
  // The optional indexes' and parent hashes' share of insert() and erase(), out of line so
  // that the common path of those two inlines into BlockPool's allocation and caching.
  [[gnu::noinline]] void insert_extras(BlockId b, bool indexed, uint64_t parent_key,
                                       const BlockHash* parent_hash, TokenId first_token) {
    if (indexed && partial_) partial_->add(b, {parent_key, first_token});
    if (children_) children_->add(b, parent_key);
    if (!parent_hash_.empty()) {
      parent_hash_[b] = parent_hash != nullptr ? std::optional(*parent_hash) : std::nullopt;
    }
  }
  // `b` leaves with `role`; `successor` is the standby that takes its place, if any.
  [[gnu::noinline]] void erase_extras(BlockId b, Role role, BlockId successor) {
    if (children_) children_->remove(b, entries_[b].parent_key);
    if (role != Role::kIndexed || !partial_) return;
    partial_->remove(b, {entries_[b].parent_key, block_tokens(b)[0]});
    if (successor != kNoBlock) {
      partial_->add(successor, {entries_[successor].parent_key, block_tokens(successor)[0]});
    }
  }

  bool same_contents(BlockId b, std::span<const TokenId> tokens,
                     std::span<const uint64_t> extra_keys) const {
    if (entries_[b].has_extra_keys || !extra_keys.empty()) [[unlikely]] {
      const auto& keys = extra_keys_[b];
      if (!std::equal(keys.begin(), keys.end(), extra_keys.begin(), extra_keys.end())) {
        return false;
      }
    }
    const TokenId* stored = block_tokens(b);
    return std::equal(stored, stored + block_size_, tokens.begin(), tokens.end());
  }

  void link_standby(BlockId indexed, BlockId b) {
    entries_[b].next = entries_[indexed].next;
    entries_[b].prev = indexed;
    if (entries_[indexed].next != kNoBlock) entries_[entries_[indexed].next].prev = b;
    entries_[indexed].next = b;
    ++num_standby_;
  }

  // The last of the standby chain from `b` on (standbys are linked newest first).
  BlockId oldest_standby(BlockId b) const {
    while (entries_[b].next != kNoBlock) b = entries_[b].next;
    return b;
  }

  void unlink_standby(BlockId b) {
    entries_[entries_[b].prev].next = entries_[b].next;
    if (entries_[b].next != kNoBlock) entries_[entries_[b].next].prev = entries_[b].prev;
    entries_[b].next = kNoBlock;
    entries_[b].prev = kNoBlock;
    --num_standby_;
  }

  TokenId* block_tokens(BlockId b) const {
    return tokens_.get() + static_cast<size_t>(b) * block_size_;
  }

  int32_t block_size_;
  absl::flat_hash_map<BlockHash, BlockId> index_;
  int32_t num_standby_ = 0;
  uint64_t next_content_key_ = 1;
  // Per block: a block's hash, parent key, extra keys and tokens are meaningful while its
  // role is not kNone; its content key identifies its current contents. The roles are
  // dense, as freeing a table tests each of its blocks; the rest is one cache line per
  // block, as an eviction and a caching each touch all of it for a block far from the last.
  std::vector<Role> role_;
  struct alignas(64) Entry {
    BlockHash hash;
    uint64_t parent_key = 0;
    uint64_t content_key = 0;
    BlockId next = kNoBlock;  // standby chain
    BlockId prev = kNoBlock;
    bool has_extra_keys = false;  // extra_keys_[b] is not empty: only then is it read
  };
  std::vector<Entry> entries_;
  std::vector<std::optional<BlockHash>> parent_hash_;  // see keep_parent_hashes()
  std::vector<absl::InlinedVector<uint64_t, 2>> extra_keys_;
  std::unique_ptr<TokenId[]> tokens_;                    // [num_blocks, block_size]
  std::optional<KeyedBlockLists<PrefixStart>> partial_;  // see index_partial_prefixes()
  std::optional<KeyedBlockLists<uint64_t>> children_;    // see index_children()
  // Any of partial_, children_ and parent_hash_ in use: insert() and erase() call out.
  bool keeps_extras_ = false;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_HASH_INDEX_H_
