// File: pagedkv/block_pool.h
//
// BlockPool: a fixed number of KV blocks with reference counts, a free queue that doubles
// as the LRU eviction order, and a verified hash index of full blocks (prefix caching).
//   - Free queue: blocks with ref count 0, least recently freed at the head. Allocation
//     takes from the head; a cached block taken that way is evicted (its hash leaves the
//     index and a BlockRemoved event fires). A prefix hit on a free block takes it out of
//     the queue (touch).
//   - Hash index: BlockHash -> block. A hit is verified against the stored tokens, extra
//     keys and parent block before it is returned, so a hash collision is never shared.
//   - Events and counters: BlockStored / BlockRemoved / AllBlocksCleared to an optional
//     sink; used, free, cached-free blocks and evictions in stats().
//
// BlockPool is pure bookkeeping: it never touches KV bytes. Like a standard container it
// has no internal locks; one thread owns it. Most engines use it through KvCacheManager.
//
// Example:
//   auto pool = BlockPool::create({.num_blocks = 1024, .block_size = 16});
//   BlockId blocks[4];
//   if (absl::Status s = pool->allocate(blocks); !s.ok()) { /* ResourceExhausted */ }
//   ...
//   BlockId reversed[4] = {blocks[3], blocks[2], blocks[1], blocks[0]};
//   pool->free(reversed);  // tail first: the prompt's last block is evicted first
#ifndef PAGEDKV_BLOCK_POOL_H_
#define PAGEDKV_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/kv_events.h"
#include "pagedkv/types.h"

namespace pagedkv {
namespace internal {
class FreeQueue;
class HashIndex;
}  // namespace internal

class BlockPool {
 public:
  struct Options {
    int32_t num_blocks = 0;             // blocks in the pool, >= 0
    int32_t block_size = 16;            // tokens per block, > 0
    bool enable_caching = true;         // false: cache_full_block() registers nothing
    KvEventSink* event_sink = nullptr;  // optional, not owned; must outlive the pool
  };

  struct Stats {
    int32_t num_blocks = 0;
    int32_t used_blocks = 0;         // ref count > 0
    int32_t free_blocks = 0;         // ref count 0 (clean + cached)
    int32_t cached_free_blocks = 0;  // ref count 0 and hashed: reusable until evicted
    int32_t cached_blocks = 0;       // hashed blocks, in use or free
    int64_t evictions = 0;           // cached blocks whose hash was dropped to reuse them
  };

  // Returns InvalidArgument for a negative num_blocks or a non-positive block_size.
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
  // Requires a valid id (checked in debug builds).
  void touch(BlockId block);

  // BlockPool::free()
  //
  // Drops one reference from each block, in order; blocks that reach ref count 0 join the
  // tail of the free queue, so the first block given is evicted first. Hashed blocks stay
  // cached until evicted. Requires ref count > 0 (checked in debug builds).
  void free(std::span<const BlockId> blocks_in_eviction_order);

  // BlockPool::find_cached()
  //
  // Returns the block indexed under `hash` if it really holds `tokens` (block_size of them)
  // with `extra_keys`, after the block `parent` (kNoBlock for the first block) as it is
  // now; kNoBlock otherwise. Does not take a reference: call touch() to share it.
  BlockId find_cached(const BlockHash& hash, BlockId parent, std::span<const TokenId> tokens,
                      std::span<const uint64_t> extra_keys) const;

  // BlockPool::cache_full_block()
  //
  // Enters an in-use, full `block` into the hash index under `hash`, storing its tokens,
  // extra keys and parent for verification, and emits BlockStored. Returns false (and
  // registers nothing) when caching is off, the block is already hashed, or another block
  // already holds `hash`.
  // NOTE: an identical block computed twice is not de-duplicated, so block tables stay
  // append-only; the second copy is simply not shareable.
  bool cache_full_block(BlockId block, const BlockHash& hash, BlockId parent,
                        const BlockHash* parent_hash, std::span<const TokenId> tokens,
                        std::span<const uint64_t> extra_keys);

  // BlockPool::cache_full_blocks()
  //
  // cache_full_block() for a run of consecutive blocks of one sequence: blocks[i] under
  // hashes[i] with tokens [i * block_size, (i + 1) * block_size) of `tokens`; the parent
  // of blocks[0] is `parent` (hash `parent_hash`), that of blocks[i] is blocks[i - 1].
  // Emits one BlockStored covering the blocks it enters, as vLLM does per call; a block
  // it skips splits the event in two. Returns the number of blocks entered.
  int32_t cache_full_blocks(std::span<const BlockId> blocks, std::span<const BlockHash> hashes,
                            BlockId parent, const BlockHash* parent_hash,
                            std::span<const TokenId> tokens, std::span<const uint64_t> extra_keys);

  // BlockPool::uncache()
  //
  // Takes `block` out of the hash index (emitting BlockRemoved) if it is there: its
  // contents will not be what its hash says. The block keeps its references.
  void uncache(BlockId block);

  // BlockPool::reset_prefix_cache()
  //
  // Empties the hash index: cached free blocks become clean, in-use blocks stop being
  // shareable (their contents stay valid for their sequences). Emits AllBlocksCleared.
  void reset_prefix_cache();

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const;
  int32_t ref_count(BlockId block) const { return ref_count_[block]; }
  // True when `block` is in the hash index; `hash` then says under which hash.
  bool is_cached(BlockId block) const;
  BlockHash cached_hash(BlockId block) const;
  Stats stats() const;

  // Free queue from head (next allocated) to tail. O(num_free_blocks); for tests.
  std::vector<BlockId> free_queue_order() const;

  // Checks, clause by clause, that every id is in exactly one of in use / free-clean /
  // free-cached, ref count 0 <=> in the free queue, the queue's links agree and it holds
  // no more than num_blocks ids, and every index entry points at a block holding that
  // hash. Returns Internal naming the first broken clause and its values.
  [[nodiscard]] absl::Status check_invariants() const;

 private:
  explicit BlockPool(const Options& options);

  // Invariants (checked by check_invariants()):
  //   used_blocks_ + free_clean + cached_free_blocks_ == num_blocks_
  //   ref_count_[b] == 0  <=>  b is in free_queue_
  int32_t num_blocks_ = 0;
  int32_t block_size_ = 0;
  bool enable_caching_ = true;
  KvEventSink* event_sink_ = nullptr;
  std::vector<int32_t> ref_count_;  // per block; written by allocate/touch/free
  int32_t used_blocks_ = 0;         // blocks with ref count > 0
  int32_t cached_free_blocks_ = 0;  // blocks with ref count 0 in the hash index
  int64_t evictions_ = 0;
  std::unique_ptr<internal::FreeQueue> free_queue_;
  std::unique_ptr<internal::HashIndex> hash_index_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_BLOCK_POOL_H_
