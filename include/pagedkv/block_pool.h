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

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/retention.h"
#include "pagedkv/types.h"

namespace pagedkv {
namespace internal {
class BlockPoolCore;
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
  // Wraps a pool that the library's own parts built (src/pool/block_pool_core.h): the
  // manager drives the core and hands engines this face of it (device_pool()).
  explicit BlockPool(std::unique_ptr<internal::BlockPoolCore> core);

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

  int32_t num_blocks() const;
  int32_t block_size() const;
  int32_t num_free_blocks() const;
  // Per-block queries. Errors: InvalidArgument for an id outside [0, num_blocks);
  // cached_hash(): NotFound when the block holds no hash.
  [[nodiscard]] absl::StatusOr<int32_t> ref_count(BlockId block) const;
  [[nodiscard]] absl::StatusOr<bool> is_cached(BlockId block) const;
  [[nodiscard]] absl::StatusOr<BlockHash> cached_hash(BlockId block) const;
  // The retention priority the block's place in the free queue follows now.
  [[nodiscard]] absl::StatusOr<int32_t> retention_priority(BlockId block) const;
  // The block indexed under `hash`, or kNoBlock: a lookup by hash alone, unverified, for
  // what mirrors the cache (the remote tier reads such a block's K/V to publish it). A
  // prefix hit is find_cached()'s, which verifies the block before it is shared.
  BlockId indexed_block(const BlockHash& hash) const;
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

 private:
  std::unique_ptr<internal::BlockPoolCore> core_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_BLOCK_POOL_H_
