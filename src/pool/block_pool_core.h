// Internal: the block pool itself. BlockPool (pagedkv/block_pool.h) is its public face and
// forwards every call here; the manager's parts (src/cache) hold the core and use, besides
// those calls, the unchecked ones and the interfaces of the host tier and of the layer
// groups that verify along another group's chain. Their preconditions are the checked
// calls' (ids in range, blocks in use where those need it), asserted in debug builds only:
// the manager validates its arguments and holds only ids of its own pools.
//
//   allocate / touch / free            ref counts and the free queue (free_queue.h)
//   cache_full_blocks / find_cached    the verified hash index (hash_index.h)
//   set_retention, eviction policy     the free queue's lists (retention.cc,
//                                      adaptive_eviction.h)
//   evictions, content keys, imports   the host tier (src/cache/host_tier.h)
//   dead contents, children            windowed and state groups (src/cache)
#ifndef PAGEDKV_POOL_BLOCK_POOL_CORE_H_
#define PAGEDKV_POOL_BLOCK_POOL_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/block_pool.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/retention.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

class AdaptiveEviction;
class FreeQueue;
class HashIndex;

// What the cache layer asks of a pool beyond BlockPool::Options.
struct PoolRoles {
  // A device pool with a host tier: allocation logs the cached blocks it evicts
  // (take_evictions()), and the index keeps parent hashes for their demoted copies.
  bool log_evictions = false;
  // Content keys are drawn from here on (> 0). Two pools whose blocks are copied into each
  // other draw from disjoint ranges, so that different contents never share a key.
  uint64_t first_content_key = 1;
  // Indexed blocks are also found by their first tokens (longest_partial_match()): a
  // hash-map entry per indexed block, for partial-block reuse.
  bool index_partial_prefixes = false;
  // The anchor group of a hybrid model: the content keys whose last cached copy left the
  // index (evicted or uncached, no standby left) are logged (take_dead_contents()).
  bool log_dead_contents = false;
  // A group that verifies along the anchor's chain: cached blocks are also found by their
  // parent content key (uncache_children()), and a block whose hash, tokens and extra keys
  // an indexed block holds after other parent contents replaces that stale copy (and its
  // standbys, which become uncached) instead of being refused.
  bool index_children = false;
  // With index_children: a content that leaves the index while blocks cached after it are
  // still cached is remembered (its key, parent key, tokens and extra keys) for as long as
  // they are, and a block cached later with the very same contents takes its content key
  // back, so that they verify again. vLLM's pool finds such blocks by hash once the block
  // before them is computed again; a pool the groups share does the same.
  bool revive_contents = false;
  // A device pool that the layer groups of a hybrid model share
  // (KvCacheManager::Options::shared_block_pool): one key space per group, whose entry is
  // the group its events name. A group's hashes are keys of its own space (the same hash
  // in two groups names two blocks, and a hit is only ever found in the space it was
  // cached in); the calls that take a hash name the space (0 for a pool of one). Empty:
  // one space, whose events name BlockPool::Options::event_group.
  std::vector<EventGroup> key_spaces = {};
};

class BlockPoolCore {
 public:
  static constexpr uint8_t kNoPriority = 0xff;  // no retention set: the default applies

  // A cached block that allocation evicted and whose hash left the index (logged only
  // with PoolRoles::log_evictions): the host tier demotes it. Its contents stay readable
  // (cached_contents()) until the block is cached again.
  struct EvictedBlock {
    BlockId block = kNoBlock;
    BlockHash hash;
    uint64_t content_key = 0;
    uint8_t priority = kNoPriority;  // its retention, for the copy
    int64_t duration_ms = 0;
  };
  // What verifies a cached (or evicted, see EvictedBlock) block: the content key of its
  // parent, its tokens and extra keys, and its parent's hash (with log_evictions only).
  struct CachedContents {
    uint64_t parent_key = 0;
    std::span<const TokenId> tokens;
    std::span<const uint64_t> extra_keys;
    std::optional<BlockHash> parent_hash;
  };
  // A content key whose last cached copy left the index (PoolRoles::log_dead_contents).
  struct DeadContent {
    BlockHash hash;
    uint64_t content_key = 0;
  };

  // BlockPool::create()'s checks, and first_content_key > 0.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BlockPoolCore>> create(
      const BlockPool::Options& options, const PoolRoles& roles = {});
  BlockPoolCore(const BlockPool::Options& options, const PoolRoles& roles);
  BlockPoolCore(const BlockPoolCore&) = delete;
  BlockPoolCore& operator=(const BlockPoolCore&) = delete;
  ~BlockPoolCore();

  // --- BlockPool's calls (see pagedkv/block_pool.h) ----------------------------------------
  [[nodiscard]] absl::Status allocate(std::span<BlockId> out);
  [[nodiscard]] absl::Status touch(BlockId block);
  [[nodiscard]] absl::Status free(std::span<const BlockId> blocks_in_eviction_order);
  [[nodiscard]] absl::StatusOr<BlockId> find_cached(const BlockHash& hash, BlockId parent,
                                                    std::span<const TokenId> tokens,
                                                    std::span<const uint64_t> extra_keys) const;
  [[nodiscard]] absl::StatusOr<bool> cache_full_block(BlockId block, const BlockHash& hash,
                                                      BlockId parent, const BlockHash* parent_hash,
                                                      std::span<const TokenId> tokens,
                                                      std::span<const uint64_t> extra_keys);
  [[nodiscard]] absl::StatusOr<int32_t> cache_full_blocks(std::span<const BlockId> blocks,
                                                          std::span<const BlockHash> hashes,
                                                          BlockId parent,
                                                          const BlockHash* parent_hash,
                                                          std::span<const TokenId> tokens,
                                                          std::span<const uint64_t> extra_keys);
  [[nodiscard]] absl::Status uncache(BlockId block);
  [[nodiscard]] absl::Status set_retention(BlockId block, int32_t priority, int64_t duration_ms);
  // Emits AllBlocksCleared only when `emit_event` (one event for two tiers).
  void reset_prefix_cache(bool emit_event = true);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return num_blocks_ - used_blocks_; }
  [[nodiscard]] absl::StatusOr<int32_t> ref_count(BlockId block) const;
  [[nodiscard]] absl::StatusOr<bool> is_cached(BlockId block) const;
  [[nodiscard]] absl::StatusOr<BlockHash> cached_hash(BlockId block) const;
  [[nodiscard]] absl::StatusOr<int32_t> retention_priority(BlockId block) const;
  BlockPool::Stats stats() const;
  std::vector<BlockId> free_queue_order() const;
  [[nodiscard]] absl::Status check_invariants() const;

  // --- unchecked calls ---------------------------------------------------------------------
  void allocate_unchecked(std::span<BlockId> out);
  void touch_unchecked(BlockId block);
  void free_unchecked(std::span<const BlockId> blocks_in_eviction_order);
  // free_unchecked() of one block, for callers that release blocks one by one as a single
  // free: `last_clean` (kNoBlock at the start) carries where the next clean block goes.
  void release_unchecked(BlockId block, BlockId& last_clean);
  // free_unchecked() of a block table in reverse, as one free: its last block is evicted
  // first.
  void free_tail_first_unchecked(std::span<const BlockId> table);
  int32_t ref_count_unchecked(BlockId block) const { return ref_count_[block]; }
  // Grows whenever a block in use gains a reference (a touch of a held block, or a free
  // that undoes itself). A holder of `b` that saw ref_count(b) == 1 knows it still is
  // while share_epoch() has not moved: no other reference can appear without moving it.
  uint64_t share_epoch() const { return share_epoch_; }
  BlockId find_cached_unchecked(const BlockHash& hash, BlockId parent,
                                std::span<const TokenId> tokens,
                                std::span<const uint64_t> extra_keys) const;
  // With `parent_keys` (one per block), blocks[i] is cached after the contents
  // parent_keys[i] names instead of after its predecessor's: a windowed or state group's
  // blocks verify along another group's chain (its own parents may be released). The
  // blocks are cached in key space `space` (PoolRoles::key_spaces).
  int32_t cache_full_blocks_unchecked(std::span<const BlockId> blocks,
                                      std::span<const BlockHash> hashes, BlockId parent,
                                      const BlockHash* parent_hash, std::span<const TokenId> tokens,
                                      std::span<const uint64_t> extra_keys,
                                      std::span<const uint64_t> parent_keys = {},
                                      int32_t space = 0);
  void uncache_unchecked(BlockId block);
  void set_retention_unchecked(BlockId block, int32_t priority, int64_t duration_ms);

  // --- the groups that verify along the anchor's chain (PoolRoles::log_dead_contents,
  // index_children) -------------------------------------------------------------------------
  // Moves the contents logged as dead since the last call into `out` (cleared first).
  void take_dead_contents(std::vector<DeadContent>& out) {
    out.clear();
    out.swap(dead_contents_);
  }
  bool has_dead_contents() const { return !dead_contents_.empty(); }
  // Uncaches every cached block entered after the contents `parent_key` names: no hit can
  // verify it again. Free ones become clean (reused first).
  void uncache_children(uint64_t parent_key);

  // --- the host tier's: evictions, lookups by content key, imported copies ----------------
  bool has_evictions() const { return !evicted_.empty(); }
  // Moves the evictions logged since the last call into `out` (cleared first).
  void take_evictions(std::vector<EvictedBlock>& out) {
    out.clear();
    out.swap(evicted_);
  }
  // The block indexed under `hash` in key space `space`, or kNoBlock; unverified.
  BlockId indexed_block(const BlockHash& hash, int32_t space = 0) const;
  // With PoolRoles::index_partial_prefixes: the indexed block cached after the contents
  // `parent_key` names, with `extra_keys`, whose first tokens equal the longest prefix of
  // `tokens` (at most block_size - 1 of them, verified token by token); *matched is its
  // length. kNoBlock (and 0) when none matches a token, or without the role.
  BlockId longest_partial_match(uint64_t parent_key, std::span<const TokenId> tokens,
                                std::span<const uint64_t> extra_keys, int32_t* matched) const;
  // Whether the cached `block` holds `tokens` and `extra_keys` after the contents
  // `parent_key` names.
  bool holds_contents(BlockId block, uint64_t parent_key, std::span<const TokenId> tokens,
                      std::span<const uint64_t> extra_keys) const;
  CachedContents cached_contents(BlockId block) const;
  // The key naming `block`'s contents, in this pool and in a tier it is copied to.
  uint64_t content_key(BlockId block) const;
  void set_content_key(BlockId block, uint64_t key);
  // Indexes the in-use `block`, which receives a copy of `from`, a cached block of
  // `source` (the other tier), under from's hash, contents, content key and retention. The
  // hash must not be indexed here.
  void import_copy(BlockId block, const BlockPoolCore& source, const EvictedBlock& from);
  // Gives the in-use `block` the retention of the evicted block it copies, if any.
  void copy_retention(BlockId block, const EvictedBlock& from);

 private:
  struct Expiry {
    int64_t time_ms = 0;
    BlockId block = kNoBlock;
    uint64_t stamp = 0;  // the block's free-queue stamp when it was freed
    bool operator>(const Expiry& o) const { return time_ms > o.time_ms; }
  };

  bool valid_id(BlockId block) const { return block >= 0 && block < num_blocks_; }
  template <bool kAdaptive>
  void take_free_blocks(std::span<BlockId> out);
  void prefetch_next_victim() const;
  // The free-queue list a cached free block belongs in (its priority, and under the
  // adaptive policy whether it is frequent), and moving it there by its stamp.
  int32_t list_for(BlockId block) const;
  void requeue(BlockId block);
  absl::Status id_error(BlockId block, const char* caller) const;  // InvalidArgument
  bool enqueue_freed(BlockId block, BlockId& last_clean);
  template <typename BlockIt>
  void free_in_order(BlockIt first, BlockIt last);
  void undo_free(std::span<const BlockId> freed);
  absl::Status check_cache_request(std::span<const BlockId> blocks, size_t num_hashes,
                                   BlockId parent, std::span<const TokenId> tokens,
                                   const char* caller) const;
  bool marks_stale(BlockId block, BlockId parent);
  int32_t priority_of(BlockId block) const;
  int64_t duration_of(BlockId block) const;
  void clear_retention(BlockId block);
  void schedule_expiry(BlockId block);
  void expire_retention();
  int64_t now_ms() const;
  // The index's key of `hash` in key space `space`, and back (an involution): space 0
  // keeps the hash, so a pool of one space indexes the hashes themselves.
  static BlockHash space_key(const BlockHash& hash, int32_t space) {
    return {hash.lo, hash.hi ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(space))};
  }
  int32_t space_of(BlockId block) const { return space_of_.empty() ? 0 : space_of_[block]; }
  // The hash `block` was cached under, as its group's caller gave it.
  BlockHash plain_hash(BlockId block, const BlockHash& key) const {
    return space_key(key, space_of(block));
  }
  std::optional<EventGroup> event_group(int32_t space) const {
    return key_spaces_.empty() ? event_group_ : std::optional<EventGroup>(key_spaces_[space]);
  }
  void emit_removed(const BlockHash& hash, int32_t space);
  void left_index(BlockId block, const BlockHash& key);
  void drop_from_cache(BlockId block);
  void replace_stale_copies(const BlockHash& hash, uint64_t parent_key,
                            std::span<const TokenId> tokens, std::span<const uint64_t> extra_keys);
  // PoolRoles::revive_contents: remembers the contents of `block`, whose key just left the
  // index, while blocks cached after them (or remembered contents) are; gives `block`, about
  // to be cached under `key`, the content key of remembered identical contents; forgets
  // contents whose last follower left.
  void remember_dead_parent(BlockId block, const BlockHash& key);
  void revive_content_key(BlockId block, const BlockHash& key, uint64_t parent_key,
                          std::span<const TokenId> tokens, std::span<const uint64_t> extra_keys);
  void forget_childless(uint64_t parent_key);
  bool has_followers(uint64_t content_key) const;
  void erase_dead_parent(uint64_t content_key);

  // Invariants (checked by check_invariants()):
  //   used_blocks_ + free_clean + cached_free_blocks_ == num_blocks_
  //   ref_count_[b] == 0  <=>  b is in free_queue_
  int32_t num_blocks_ = 0;
  int32_t block_size_ = 0;
  bool enable_caching_ = true;
  KvEventSink* event_sink_ = nullptr;
  Medium medium_ = Medium::kDevice;
  std::optional<EventGroup> event_group_;  // BlockPool::Options::event_group
  std::vector<EventGroup> key_spaces_;     // PoolRoles::key_spaces
  std::vector<int32_t> space_of_;          // per block: its key space, with key_spaces_ only
  std::function<int64_t()> clock_;
  std::vector<int32_t> ref_count_;  // per block; written by allocate/touch/free
  uint64_t share_epoch_ = 1;
  // Per block: holds K/V from before the last reset_prefix_cache() (it was in use then, or
  // was cached after such a block); never indexed until reallocated.
  std::vector<uint8_t> stale_;
  int32_t used_blocks_ = 0;         // blocks with ref count > 0
  int32_t cached_free_blocks_ = 0;  // blocks with ref count 0 holding a hash
  int64_t evictions_ = 0;
  // Per block: the retention priority set since it left the free queue (kNoPriority: none,
  // the default applies), and, for the blocks given one, its duration.
  std::vector<uint8_t> priority_;
  absl::flat_hash_map<BlockId, int64_t> durations_ms_;
  std::vector<Expiry> expiries_;  // min-heap by time; entries of re-queued blocks are stale
  bool log_evictions_ = false;    // PoolRoles::log_evictions
  std::vector<EvictedBlock> evicted_;
  bool log_dead_contents_ = false;  // PoolRoles::log_dead_contents
  std::vector<DeadContent> dead_contents_;
  bool replace_stale_ = false;  // PoolRoles::index_children
  // PoolRoles::revive_contents: content key -> the contents that left the index while
  // blocks cached after them stayed, and index key -> the latest such content key.
  struct DeadParent {
    BlockHash key;
    int32_t space = 0;
    uint64_t parent_key = 0;
    std::vector<TokenId> tokens;
    std::vector<uint64_t> extra_keys;
  };
  bool revive_ = false;
  absl::flat_hash_map<uint64_t, DeadParent> dead_parents_;
  absl::flat_hash_map<BlockHash, uint64_t> dead_parent_keys_;
  absl::flat_hash_map<uint64_t, int32_t> dead_followers_;  // content key -> records after it
  std::vector<BlockId> scratch_children_;
  std::unique_ptr<FreeQueue> free_queue_;
  std::unique_ptr<HashIndex> hash_index_;
  std::unique_ptr<AdaptiveEviction> adaptive_;  // EvictionPolicy::kAdaptive only
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_POOL_BLOCK_POOL_CORE_H_
