// File: pagedkv/block_pool.h
//
// BlockPool: a fixed number of KV blocks with reference counts, a free queue that is
// also the eviction order, and a verified hash index of full blocks (prefix caching).
//   - Free queue: blocks with ref count 0. Allocation takes from the head; a cached block
//     taken that way is evicted (its hash leaves the index and a BlockRemoved event
//     fires). Freed blocks without a hash go to the head (they can never hit, so they are
//     reused first); cached blocks go to the tail, so the cached part is in LRU order. A
//     prefix hit on a free block takes it out of the queue (touch).
//   - Retention priorities (set_retention()): cached blocks of a lower priority are
//     evicted before those of a higher one, LRU within a priority, in O(1). A priority
//     with a duration expires that long (on the pool's clock) after the block is freed;
//     the block then takes the default priority at the place its last use gives it.
//     Expiries are applied when allocate() next runs. Without set_retention() every
//     block has the default priority: plain LRU.
//   - Eviction policy (Options::eviction_policy): LRU within a priority, or kAdaptive
//     (retention.h): recency against frequency, never a parent before its cached children.
//     Either is O(1) amortized per call.
//   - Hash index: BlockHash -> block. A hit is verified against the stored tokens, extra
//     keys and parent block before it is returned, so a hash collision is never shared.
//     An identical block computed twice is kept as a standby of the indexed one and takes
//     its place when it leaves.
//   - Events and counters: BlockStored / BlockRemoved / AllBlocksCleared to an optional
//     sink; used, free, cached-free blocks and evictions in stats().
//
// BlockPool is pure bookkeeping: it never touches KV bytes. Like a standard container it
// has no internal locks; one thread owns it. Most engines use it through KvCacheManager.
// Every public call validates its arguments (ids in range, ref counts, token counts) and
// returns a Status naming the value and the limit, changing nothing on error.
//
// Example (in a function returning a Status; tests/doc_examples_test.cc runs it):
//   absl::StatusOr<BlockPool> pool = BlockPool::create({.num_blocks = 1024, .block_size = 16});
//   if (!pool.ok()) return pool.status();
//   BlockId blocks[4];
//   if (absl::Status s = pool->allocate(blocks); !s.ok()) return s;  // ResourceExhausted
//   // ... the engine writes the blocks' K/V ...
//   BlockId reversed[4] = {blocks[3], blocks[2], blocks[1], blocks[0]};
//   return pool->free(reversed);  // tail first: the prompt's last block is evicted first
#ifndef PAGEDKV_BLOCK_POOL_H_
#define PAGEDKV_BLOCK_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/retention.h"
#include "pagedkv/types.h"

namespace pagedkv {
namespace internal {
class AdaptiveEviction;
class FreeQueue;
class HashIndex;
}  // namespace internal

class BlockPool {
 public:
  // Largest pools and blocks create() accepts: the bookkeeping stays in int32 ids and
  // a few hundred MiB of host memory, and a pool holds at most 2^31 token slots.
  static constexpr int32_t kMaxBlocks = 1 << 24;
  static constexpr int32_t kMaxBlockSize = 1 << 16;
  static constexpr int64_t kMaxTokenSlots = int64_t{1} << 31;

  struct Options {
    int32_t num_blocks = 0;             // blocks in the pool, in [0, kMaxBlocks]
    int32_t block_size = 16;            // tokens per block, in [1, kMaxBlockSize]
    bool enable_caching = true;         // false: cache_full_block() registers nothing
    KvEventSink* event_sink = nullptr;  // optional, not owned; must outlive the pool
    Medium medium = Medium::kDevice;    // what the pool's events say it is
    // The layer group the pool's events name (BlockStored::group, BlockRemoved::group);
    // KvCacheManager sets it for managers with more than one group. Unset: none.
    std::optional<EventGroup> event_group = std::nullopt;
    // Milliseconds for retention durations; empty: std::chrono::steady_clock.
    std::function<int64_t()> clock = nullptr;
    // For a device pool with a host tier: allocation logs the cached blocks it evicts
    // (take_evictions()), and the index keeps parent hashes for their demoted copies.
    bool log_evictions = false;
    // Content keys are drawn from here on (> 0). Two pools whose blocks are copied into
    // each other draw from disjoint ranges, so that different contents never share a key.
    uint64_t first_content_key = 1;
    // Indexed blocks are also found by their first tokens (longest_partial_match()): a
    // hash-map entry per indexed block, for partial-block reuse.
    bool index_partial_prefixes = false;
    // For the anchor group of a hybrid model: the content keys whose last cached copy left
    // the index (evicted or uncached, no standby left) are logged (take_dead_contents()).
    bool log_dead_contents = false;
    // For a windowed layer group: cached blocks are also found by their parent content
    // key (uncache_children()), and a block whose hash, tokens and extra keys an indexed
    // block holds after other parent contents replaces that stale copy (and its standbys,
    // which become uncached) instead of being refused.
    bool index_children = false;
    // The order cached free blocks of one retention priority are evicted in.
    EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  };

  struct Stats {
    int32_t num_blocks = 0;
    int32_t used_blocks = 0;         // ref count > 0
    int32_t free_blocks = 0;         // ref count 0 (clean + cached)
    int32_t cached_free_blocks = 0;  // ref count 0 and hashed: reusable until evicted
    int32_t cached_blocks = 0;       // hashed blocks (indexed or standby), in use or free
    int64_t evictions = 0;           // cached blocks whose hash was dropped to reuse them
    // EvictionPolicy::kAdaptive: blocks cached while their hash was a ghost of a block
    // evicted once-used (the policy favours recency more) or reused (frequency more).
    int64_t recent_ghost_hits = 0;
    int64_t frequent_ghost_hits = 0;
  };

  // Returns InvalidArgument for num_blocks outside [0, kMaxBlocks], block_size outside
  // [1, kMaxBlockSize] or more than kMaxTokenSlots slots; ResourceExhausted when the host
  // memory for the bookkeeping cannot be allocated.
  [[nodiscard]] static absl::StatusOr<BlockPool> create(const Options& options);

  BlockPool(BlockPool&&) noexcept;
  BlockPool& operator=(BlockPool&&) noexcept;
  ~BlockPool();

  // BlockPool::allocate()
  //
  // Takes `out.size()` blocks from the head of the free queue, sets their ref count to 1
  // and writes their ids to `out`. Cached blocks taken this way are evicted, one
  // BlockRemoved event each. All or
  // nothing: on ResourceExhausted ("need N blocks, M free of T") nothing changes.
  [[nodiscard]] absl::Status allocate(std::span<BlockId> out);

  // BlockPool::touch()
  //
  // Adds a reference to `block` (a prefix hit). A free block leaves the free queue.
  // Errors: InvalidArgument for an id outside [0, num_blocks).
  [[nodiscard]] absl::Status touch(BlockId block);

  // BlockPool::free()
  //
  // Drops one reference per entry (a block listed twice loses two). Blocks that reach ref
  // count 0 join the free queue, in the given order: hashed ones at the tail (the first
  // given is evicted first), the others at the head (the first given is reused first).
  // Hashed blocks stay cached until evicted.
  // Errors: InvalidArgument for an id out of range, FailedPrecondition when a block would
  // drop below ref count 0 (a double free); nothing changes then.
  [[nodiscard]] absl::Status free(std::span<const BlockId> blocks_in_eviction_order);

  // BlockPool::find_cached()
  //
  // Returns the block indexed under `hash` if it really holds `tokens` (block_size of them)
  // with `extra_keys`, after the block `parent` (kNoBlock for the first block) as it is
  // now; kNoBlock otherwise. Does not take a reference: call touch() to share it.
  // Errors: InvalidArgument for a parent id out of range or tokens.size() != block_size.
  [[nodiscard]] absl::StatusOr<BlockId> find_cached(const BlockHash& hash, BlockId parent,
                                                    std::span<const TokenId> tokens,
                                                    std::span<const uint64_t> extra_keys) const;

  // BlockPool::cache_full_block()
  //
  // Enters an in-use, full `block` into the hash index under `hash`, storing its tokens,
  // extra keys and parent for verification, and emits BlockStored. Returns true when the
  // block now holds `hash`: indexed, or kept as a standby because an identical block
  // (same tokens, extra keys and parent contents) already holds it (no event then; the
  // standby takes the indexed block's place when that one leaves). Returns false, and
  // registers nothing, when caching is off, the block is already hashed, another block
  // with other contents holds `hash` (a collision), or the block or its parent holds K/V
  // from before the last reset_prefix_cache().
  // Errors: InvalidArgument for an id out of range or tokens.size() != block_size;
  // FailedPrecondition when `block` is free (ref count 0).
  [[nodiscard]] absl::StatusOr<bool> cache_full_block(BlockId block, const BlockHash& hash,
                                                      BlockId parent, const BlockHash* parent_hash,
                                                      std::span<const TokenId> tokens,
                                                      std::span<const uint64_t> extra_keys);

  // BlockPool::cache_full_blocks()
  //
  // cache_full_block() for a run of consecutive blocks of one sequence: blocks[i] under
  // hashes[i] with tokens [i * block_size, (i + 1) * block_size) of `tokens`; the parent
  // of blocks[0] is `parent` (hash `parent_hash`), that of blocks[i] is blocks[i - 1].
  // Emits one BlockStored covering the blocks it indexes, as vLLM does per call; a block
  // it does not index (hashed already, a standby, a collision, stale) splits the event in
  // two. Returns the number of blocks that now hold their hash (indexed or standby).
  // Errors: those of cache_full_block() for any block, and InvalidArgument when
  // hashes.size() != blocks.size() or tokens.size() != blocks.size() * block_size; nothing
  // changes then.
  [[nodiscard]] absl::StatusOr<int32_t> cache_full_blocks(std::span<const BlockId> blocks,
                                                          std::span<const BlockHash> hashes,
                                                          BlockId parent,
                                                          const BlockHash* parent_hash,
                                                          std::span<const TokenId> tokens,
                                                          std::span<const uint64_t> extra_keys);

  // BlockPool::uncache()
  //
  // Takes `block` out of the hash index (emitting BlockRemoved when no standby takes its
  // place) if it is there: its contents will not be what its hash says. The block keeps
  // its references. Errors: InvalidArgument for an id out of range.
  [[nodiscard]] absl::Status uncache(BlockId block);

  // BlockPool::set_retention()
  //
  // Gives the in-use `block` retention `priority` (in [kMinRetentionPriority,
  // kMaxRetentionPriority]) for `duration_ms` after it is freed (0: no expiry), unless a
  // higher priority was set since it left the free queue; of equal priorities the longer
  // duration wins (0 is the longest). The priority applies while the block is cached in
  // the free queue; a block given none has kDefaultRetentionPriority, and every block
  // returns to that when it leaves the free queue.
  // Errors: InvalidArgument for an id out of range, a priority outside the range or a
  // negative duration; FailedPrecondition when `block` is free.
  [[nodiscard]] absl::Status set_retention(BlockId block, int32_t priority, int64_t duration_ms);

  // BlockPool::reset_prefix_cache()
  //
  // Empties the hash index: cached free blocks become clean, in-use blocks stop being
  // shareable (their contents stay valid for their holders) and are never indexed again,
  // nor are blocks cached after them: no K/V computed before the reset is shared after
  // it. Emits AllBlocksCleared.
  void reset_prefix_cache();

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return num_blocks_ - used_blocks_; }
  // Per-block queries. Errors: InvalidArgument for an id outside [0, num_blocks);
  // cached_hash(): NotFound when the block holds no hash.
  [[nodiscard]] absl::StatusOr<int32_t> ref_count(BlockId block) const;
  [[nodiscard]] absl::StatusOr<bool> is_cached(BlockId block) const;
  [[nodiscard]] absl::StatusOr<BlockHash> cached_hash(BlockId block) const;
  // The retention priority the block's place in the free queue follows now.
  [[nodiscard]] absl::StatusOr<int32_t> retention_priority(BlockId block) const;
  Stats stats() const;

  // Free queue from head (next allocated) to tail. O(num_free_blocks); for tests.
  std::vector<BlockId> free_queue_order() const;

  // Checks, clause by clause, that every id is in exactly one of in use / free-clean /
  // free-cached, ref count 0 <=> in the free queue, the queue's links agree and it holds
  // no more than num_blocks ids, cached free blocks sit in their retention priority's
  // list in LRU order, every index entry points at a block holding that hash, and every
  // standby sits in the chain of the indexed block of its hash. Returns Internal naming
  // the first broken clause and its values.
  [[nodiscard]] absl::Status check_invariants() const;

  // --- For the allocator's own parts ------------------------------------------------
  // KvCacheManager and its parts validate their arguments and hold only ids of this pool,
  // so their hot paths use these unchecked calls. Preconditions are the checked calls'
  // (ids in range, blocks in use where those need it), asserted only in debug builds.

  static constexpr uint8_t kNoPriority = 0xff;  // no retention set: the default applies

  // A cached block that allocation evicted and whose hash left the index (logged only
  // with Options::log_evictions): the host tier demotes it. Its contents stay readable
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
  // parent_keys[i] names instead of after its predecessor's: a windowed layer group's
  // blocks verify along another group's chain (its own parents may be released).
  int32_t cache_full_blocks_unchecked(std::span<const BlockId> blocks,
                                      std::span<const BlockHash> hashes, BlockId parent,
                                      const BlockHash* parent_hash, std::span<const TokenId> tokens,
                                      std::span<const uint64_t> extra_keys,
                                      std::span<const uint64_t> parent_keys = {});
  void uncache_unchecked(BlockId block);
  void set_retention_unchecked(BlockId block, int32_t priority, int64_t duration_ms);
  // reset_prefix_cache(), emitting AllBlocksCleared only when `emit_event` (one event
  // for two tiers).
  void reset_prefix_cache(bool emit_event);

  // The windowed groups' interface (Options::log_dead_contents, index_children).
  struct DeadContent {
    BlockHash hash;
    uint64_t content_key = 0;
  };
  // Moves the contents logged as dead since the last call into `out` (cleared first).
  void take_dead_contents(std::vector<DeadContent>& out) {
    out.clear();
    out.swap(dead_contents_);
  }
  bool has_dead_contents() const { return !dead_contents_.empty(); }
  // Uncaches every cached block entered after the contents `parent_key` names: no hit
  // can verify it again. Free ones become clean (reused first).
  void uncache_children(uint64_t parent_key);

  // The host tier's interface: evictions, lookups by content key, imported copies.
  bool has_evictions() const { return !evicted_.empty(); }
  // Moves the evictions logged since the last call into `out` (cleared first).
  void take_evictions(std::vector<EvictedBlock>& out) {
    out.clear();
    out.swap(evicted_);
  }
  // The block indexed under `hash`, or kNoBlock; unverified.
  BlockId indexed_block(const BlockHash& hash) const;
  // With Options::index_partial_prefixes: the indexed block cached after the contents
  // `parent_key` names, with `extra_keys`, whose first tokens equal the longest prefix of
  // `tokens` (at most block_size - 1 of them, verified token by token); *matched is its
  // length. kNoBlock (and 0) when none matches a token, or without the option.
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
  void import_copy(BlockId block, const BlockPool& source, const EvictedBlock& from);
  // Gives the in-use `block` the retention of the evicted block it copies, if any.
  void copy_retention(BlockId block, const EvictedBlock& from);

 private:
  explicit BlockPool(const Options& options);

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
  void emit_removed(const BlockHash& hash);
  void left_index(BlockId block, const BlockHash& hash);
  void drop_from_cache(BlockId block);
  void replace_stale_copies(const BlockHash& hash, uint64_t parent_key,
                            std::span<const TokenId> tokens, std::span<const uint64_t> extra_keys);

  // Invariants (checked by check_invariants()):
  //   used_blocks_ + free_clean + cached_free_blocks_ == num_blocks_
  //   ref_count_[b] == 0  <=>  b is in free_queue_
  int32_t num_blocks_ = 0;
  int32_t block_size_ = 0;
  bool enable_caching_ = true;
  KvEventSink* event_sink_ = nullptr;
  Medium medium_ = Medium::kDevice;
  std::optional<EventGroup> event_group_;  // Options::event_group
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
  bool log_evictions_ = false;    // Options::log_evictions
  std::vector<EvictedBlock> evicted_;
  bool log_dead_contents_ = false;  // Options::log_dead_contents
  std::vector<DeadContent> dead_contents_;
  bool replace_stale_ = false;  // Options::index_children
  std::vector<BlockId> scratch_children_;
  std::unique_ptr<internal::FreeQueue> free_queue_;
  std::unique_ptr<internal::HashIndex> hash_index_;
  std::unique_ptr<internal::AdaptiveEviction> adaptive_;  // EvictionPolicy::kAdaptive only
};

}  // namespace pagedkv

#endif  // PAGEDKV_BLOCK_POOL_H_
