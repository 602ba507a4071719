// BlockPool: construct, allocate, touch, free, cache, evict, reset, checks.
#include "pagedkv/block_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "pool/free_queue.h"
#include "pool/hash_index.h"

namespace pagedkv {

using internal::FreeQueue;
using internal::HashIndex;

// --- construct ---------------------------------------------------------------------

absl::StatusOr<BlockPool> BlockPool::create(const Options& options) {
  if (options.num_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPool: num_blocks ", options.num_blocks, " must be >= 0"));
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPool: block_size ", options.block_size, " must be > 0"));
  }
  return BlockPool(options);
}

BlockPool::BlockPool(const Options& options)
    : num_blocks_(options.num_blocks),
      block_size_(options.block_size),
      enable_caching_(options.enable_caching),
      event_sink_(options.event_sink),
      ref_count_(options.num_blocks, 0),
      free_queue_(std::make_unique<FreeQueue>(options.num_blocks)),
      hash_index_(std::make_unique<HashIndex>(options.num_blocks, options.block_size)) {}

BlockPool::BlockPool(BlockPool&&) noexcept = default;
BlockPool& BlockPool::operator=(BlockPool&&) noexcept = default;
BlockPool::~BlockPool() = default;

// --- allocate ------------------------------------------------------------------------

absl::Status BlockPool::allocate(std::span<BlockId> out) {
  const auto n = static_cast<int64_t>(out.size());
  if (n > free_queue_->size()) {
    return absl::ResourceExhaustedError(absl::StrCat("BlockPool::allocate: need ", n, " blocks, ",
                                                     free_queue_->size(), " free of ",
                                                     num_blocks_));
  }
  for (BlockId& b : out) {
    b = free_queue_->pop_front();
    if (hash_index_->is_cached(b)) {
      // One event per evicted block, as vLLM emits them.
      if (event_sink_ != nullptr) event_sink_->on_event(BlockRemoved{{hash_index_->hash(b)}});
      hash_index_->erase(b);
      --cached_free_blocks_;
      ++evictions_;
    }
    hash_index_->renew(b);
    ref_count_[b] = 1;
  }
  used_blocks_ += static_cast<int32_t>(n);
  return absl::OkStatus();
}

// --- touch and free --------------------------------------------------------------------

void BlockPool::touch(BlockId block) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_);
  if (ref_count_[block]++ == 0) {
    free_queue_->remove(block);
    ++used_blocks_;
    cached_free_blocks_ -= hash_index_->is_cached(block);
  }
}

void BlockPool::free(std::span<const BlockId> blocks_in_eviction_order) {
  for (const BlockId b : blocks_in_eviction_order) {
    PAGEDKV_DCHECK(b >= 0 && b < num_blocks_ && ref_count_[b] > 0);
    if (--ref_count_[b] == 0) {
      free_queue_->push_back(b);
      --used_blocks_;
      cached_free_blocks_ += hash_index_->is_cached(b);
    }
  }
}

// --- prefix cache ------------------------------------------------------------------------

BlockId BlockPool::find_cached(const BlockHash& hash, BlockId parent,
                               std::span<const TokenId> tokens,
                               std::span<const uint64_t> extra_keys) const {
  const BlockId candidate = hash_index_->find(hash);
  if (candidate == kNoBlock) return kNoBlock;
  return hash_index_->verify(candidate, parent, tokens, extra_keys) ? candidate : kNoBlock;
}

bool BlockPool::cache_full_block(BlockId block, const BlockHash& hash, BlockId parent,
                                 const BlockHash* parent_hash, std::span<const TokenId> tokens,
                                 std::span<const uint64_t> extra_keys) {
  return cache_full_blocks({&block, 1}, {&hash, 1}, parent, parent_hash, tokens, extra_keys) == 1;
}

int32_t BlockPool::cache_full_blocks(std::span<const BlockId> blocks,
                                     std::span<const BlockHash> hashes, BlockId parent,
                                     const BlockHash* parent_hash, std::span<const TokenId> tokens,
                                     std::span<const uint64_t> extra_keys) {
  PAGEDKV_DCHECK(hashes.size() == blocks.size());
  PAGEDKV_DCHECK(tokens.size() == blocks.size() * static_cast<size_t>(block_size_));
  if (!enable_caching_) return 0;
  int32_t entered = 0;
  BlockStored stored;  // the run of consecutive blocks entered so far
  auto emit_run = [&] {
    if (event_sink_ == nullptr || stored.block_hashes.empty()) return;
    stored.block_size = block_size_;
    stored.extra_keys.assign(extra_keys.begin(), extra_keys.end());
    event_sink_->on_event(std::exchange(stored, {}));
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId block = blocks[i];
    PAGEDKV_DCHECK(block >= 0 && block < num_blocks_ && ref_count_[block] > 0);
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const BlockId block_parent = i == 0 ? parent : blocks[i - 1];
    if (hash_index_->is_cached(block) ||
        !hash_index_->insert(block, hashes[i], block_parent, block_tokens, extra_keys)) {
      emit_run();  // a skipped block splits the event: the next run names its own parent
      continue;
    }
    ++entered;
    if (event_sink_ == nullptr) continue;
    if (stored.block_hashes.empty()) {
      const BlockHash* run_parent = i == 0 ? parent_hash : &hashes[i - 1];
      if (run_parent != nullptr) stored.parent_hash = *run_parent;
    }
    stored.block_hashes.push_back(hashes[i]);
    stored.token_ids.insert(stored.token_ids.end(), block_tokens.begin(), block_tokens.end());
  }
  emit_run();
  return entered;
}

void BlockPool::uncache(BlockId block) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_);
  if (!hash_index_->is_cached(block)) return;
  const BlockHash hash = hash_index_->hash(block);
  hash_index_->erase(block);
  cached_free_blocks_ -= ref_count_[block] == 0;
  if (event_sink_ != nullptr) event_sink_->on_event(BlockRemoved{{hash}});
}

void BlockPool::reset_prefix_cache() {
  std::vector<BlockId> cached;
  cached.reserve(hash_index_->size());
  hash_index_->for_each([&](const BlockHash&, BlockId b) { cached.push_back(b); });
  for (const BlockId b : cached) hash_index_->erase(b);
  cached_free_blocks_ = 0;
  if (event_sink_ != nullptr) {
    // A named event: GCC 12 at -O3 misreads the temporary variant as uninitialized.
    const KvEvent cleared{std::in_place_type<AllBlocksCleared>};
    event_sink_->on_event(cleared);
  }
}

// --- queries -----------------------------------------------------------------------------

int32_t BlockPool::num_free_blocks() const { return free_queue_->size(); }

bool BlockPool::is_cached(BlockId block) const { return hash_index_->is_cached(block); }

BlockHash BlockPool::cached_hash(BlockId block) const { return hash_index_->hash(block); }

BlockPool::Stats BlockPool::stats() const {
  Stats s;
  s.num_blocks = num_blocks_;
  s.used_blocks = used_blocks_;
  s.free_blocks = free_queue_->size();
  s.cached_blocks = hash_index_->size();
  s.cached_free_blocks = cached_free_blocks_;
  s.evictions = evictions_;
  return s;
}

std::vector<BlockId> BlockPool::free_queue_order() const {
  std::vector<BlockId> order;
  order.reserve(free_queue_->size());
  for (BlockId b = free_queue_->first(); b != kNoBlock; b = free_queue_->next(b)) {
    order.push_back(b);
  }
  return order;
}

// --- checks ------------------------------------------------------------------------------

absl::Status BlockPool::check_invariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("BlockPool invariant: ", parts...));
  };
  // The queue: links agree both ways, at most num_blocks steps, only ref-0 blocks.
  int32_t walked = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = free_queue_->first(); b != kNoBlock; b = free_queue_->next(b)) {
    if (b < 0 || b >= num_blocks_) return broken("free queue holds invalid id ", b);
    if (++walked > num_blocks_) return broken("free queue longer than ", num_blocks_, " blocks");
    if (free_queue_->prev(b) != prev) {
      return broken("block ", b, ": prev link ", free_queue_->prev(b), " but walked from ", prev);
    }
    if (ref_count_[b] != 0)
      return broken("block ", b, ": in the free queue with ref_count ", ref_count_[b]);
    prev = b;
  }
  if (walked != free_queue_->size()) {
    return broken("free queue size ", free_queue_->size(), " but ", walked, " blocks linked");
  }
  // Every id: ref count 0 <=> queued; counts partition the pool.
  int32_t used = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) {
    if (ref_count_[b] < 0) return broken("block ", b, ": ref_count ", ref_count_[b], " < 0");
    if ((ref_count_[b] == 0) != free_queue_->is_queued(b)) {
      return broken("block ", b, ": ref_count ", ref_count_[b],
                    free_queue_->is_queued(b) ? " but queued" : " but not in the free queue");
    }
    used += ref_count_[b] > 0;
  }
  if (used != used_blocks_) return broken("used_blocks ", used_blocks_, " but ", used, " counted");
  if (used + free_queue_->size() != num_blocks_) {
    return broken("used ", used, " + free ", free_queue_->size(), " != num_blocks ", num_blocks_);
  }
  // The index: every entry points at a block that holds that hash, and vice versa.
  absl::Status status;
  int32_t entries = 0;
  hash_index_->for_each([&](const BlockHash& hash, BlockId b) {
    ++entries;
    if (!status.ok()) return;
    if (b < 0 || b >= num_blocks_) {
      status = broken("index entry points at invalid id ", b);
    } else if (!hash_index_->is_cached(b) || !(hash_index_->hash(b) == hash)) {
      status = broken("index entry for block ", b, " does not match the block's hash");
    }
  });
  if (!status.ok()) return status;
  int32_t cached = 0;
  int32_t cached_free = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) {
    cached += hash_index_->is_cached(b);
    cached_free += hash_index_->is_cached(b) && ref_count_[b] == 0;
  }
  if (cached != entries) return broken(cached, " blocks marked cached but ", entries, " entries");
  if (cached_free != cached_free_blocks_) {
    return broken("cached_free_blocks ", cached_free_blocks_, " but ", cached_free, " counted");
  }
  if (!enable_caching_ && entries != 0) return broken("caching off but ", entries, " entries");
  return absl::OkStatus();
}

}  // namespace pagedkv
