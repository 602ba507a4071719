// BlockPool: the public face of BlockPoolCore (pool/block_pool_core.h), which does the work.
#include "pagedkv/block_pool.h"

#include <utility>

#include "pool/block_pool_core.h"

namespace pagedkv {

using internal::BlockPoolCore;

absl::StatusOr<BlockPool> BlockPool::create(const Options& options) {
  absl::StatusOr<std::unique_ptr<BlockPoolCore>> core = BlockPoolCore::create(options);
  if (!core.ok()) return core.status();
  return BlockPool(*std::move(core));
}

BlockPool::BlockPool(std::unique_ptr<BlockPoolCore> core) : core_(std::move(core)) {}
BlockPool::BlockPool(BlockPool&&) noexcept = default;
BlockPool& BlockPool::operator=(BlockPool&&) noexcept = default;
BlockPool::~BlockPool() = default;

absl::Status BlockPool::allocate(std::span<BlockId> out) { return core_->allocate(out); }
absl::Status BlockPool::touch(BlockId block) { return core_->touch(block); }

absl::Status BlockPool::free(std::span<const BlockId> blocks_in_eviction_order) {
  return core_->free(blocks_in_eviction_order);
}

absl::StatusOr<BlockId> BlockPool::find_cached(const BlockHash& hash, BlockId parent,
                                               std::span<const TokenId> tokens,
                                               std::span<const uint64_t> extra_keys) const {
  return core_->find_cached(hash, parent, tokens, extra_keys);
}

absl::StatusOr<bool> BlockPool::cache_full_block(BlockId block, const BlockHash& hash,
                                                 BlockId parent, const BlockHash* parent_hash,
                                                 std::span<const TokenId> tokens,
                                                 std::span<const uint64_t> extra_keys) {
  return core_->cache_full_block(block, hash, parent, parent_hash, tokens, extra_keys);
}

absl::StatusOr<int32_t> BlockPool::cache_full_blocks(std::span<const BlockId> blocks,
                                                     std::span<const BlockHash> hashes,
                                                     BlockId parent, const BlockHash* parent_hash,
                                                     std::span<const TokenId> tokens,
                                                     std::span<const uint64_t> extra_keys) {
  return core_->cache_full_blocks(blocks, hashes, parent, parent_hash, tokens, extra_keys);
}

absl::Status BlockPool::uncache(BlockId block) { return core_->uncache(block); }

absl::Status BlockPool::set_retention(BlockId block, int32_t priority, int64_t duration_ms) {
  return core_->set_retention(block, priority, duration_ms);
}

void BlockPool::reset_prefix_cache() { core_->reset_prefix_cache(); }

int32_t BlockPool::num_blocks() const { return core_->num_blocks(); }
int32_t BlockPool::block_size() const { return core_->block_size(); }
int32_t BlockPool::num_free_blocks() const { return core_->num_free_blocks(); }

absl::StatusOr<int32_t> BlockPool::ref_count(BlockId block) const {
  return core_->ref_count(block);
}

absl::StatusOr<bool> BlockPool::is_cached(BlockId block) const { return core_->is_cached(block); }

absl::StatusOr<BlockHash> BlockPool::cached_hash(BlockId block) const {
  return core_->cached_hash(block);
}

absl::StatusOr<int32_t> BlockPool::retention_priority(BlockId block) const {
  return core_->retention_priority(block);
}

BlockId BlockPool::indexed_block(const BlockHash& hash) const { return core_->indexed_block(hash); }

BlockPool::Stats BlockPool::stats() const { return core_->stats(); }
std::vector<BlockId> BlockPool::free_queue_order() const { return core_->free_queue_order(); }
absl::Status BlockPool::check_invariants() const { return core_->check_invariants(); }

}  // namespace pagedkv
