// BlockPool: construct, allocate, touch, free, cache, evict, reset, checks.
#include "pagedkv/block_pool.h"

#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "pool/free_queue.h"
#include "pool/hash_index.h"

namespace pagedkv {

using internal::FreeQueue;
using internal::HashIndex;

// --- construct ---------------------------------------------------------------------

absl::StatusOr<BlockPool> BlockPool::create(const Options& options) {
  if (options.num_blocks < 0 || options.num_blocks > kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: num_blocks ", options.num_blocks,
                                                   " must be in [0, ", kMaxBlocks, "]"));
  }
  if (options.block_size <= 0 || options.block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: block_size ", options.block_size,
                                                   " must be in [1, ", kMaxBlockSize, "]"));
  }
  const int64_t slots = int64_t{options.num_blocks} * options.block_size;
  if (slots > kMaxTokenSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BlockPool: num_blocks ", options.num_blocks, " x block_size ", options.block_size, " = ",
        slots, " token slots, more than the limit ", kMaxTokenSlots));
  }
  try {
    return BlockPool(options);
  } catch (const std::bad_alloc&) {  // no exception leaves the library
    return absl::ResourceExhaustedError(absl::StrCat(
        "BlockPool: cannot allocate the host bookkeeping for ", options.num_blocks, " blocks"));
  }
}

BlockPool::BlockPool(const Options& options)
    : num_blocks_(options.num_blocks),
      block_size_(options.block_size),
      enable_caching_(options.enable_caching),
      event_sink_(options.event_sink),
      ref_count_(options.num_blocks, 0),
      stale_(options.num_blocks, 0),
      free_queue_(std::make_unique<FreeQueue>(options.num_blocks)),
      hash_index_(std::make_unique<HashIndex>(options.num_blocks, options.block_size)) {}

BlockPool::BlockPool(BlockPool&&) noexcept = default;
BlockPool& BlockPool::operator=(BlockPool&&) noexcept = default;
BlockPool::~BlockPool() = default;

absl::Status BlockPool::id_error(BlockId block, const char* caller) const {
  return absl::InvalidArgumentError(
      absl::StrCat("BlockPool::", caller, ": block ", block, " outside [0, ", num_blocks_, ")"));
}

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
      // One event per evicted block, as vLLM emits them; none when a standby takes over
      // the hash.
      const BlockHash hash = hash_index_->hash(b);
      if (hash_index_->erase(b) && event_sink_ != nullptr) {
        event_sink_->on_event(BlockRemoved{{hash}});
      }
      --cached_free_blocks_;
      ++evictions_;
    }
    hash_index_->renew(b);
    stale_[b] = 0;
    ref_count_[b] = 1;
  }
  used_blocks_ += static_cast<int32_t>(n);
  return absl::OkStatus();
}

// --- touch and free --------------------------------------------------------------------

void BlockPool::touch_unchecked(BlockId block) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_);
  if (ref_count_[block]++ == 0) {
    free_queue_->remove(block);
    ++used_blocks_;
    cached_free_blocks_ -= hash_index_->is_cached(block);
  }
}

// A block whose ref count reached 0: hashed ones join the tail, clean ones the head, after
// the clean blocks this call queued before (`last_clean`).
inline void BlockPool::enqueue_freed(BlockId b, BlockId& last_clean) {
  --used_blocks_;
  if (hash_index_->is_cached(b)) {
    free_queue_->push_back(b);
    ++cached_free_blocks_;
  } else {
    free_queue_->insert_after(last_clean, b);
    last_clean = b;
  }
}

absl::Status BlockPool::free(std::span<const BlockId> blocks_in_eviction_order) {
  // One pass, as free_unchecked(); a bad entry undoes the entries before it.
  BlockId last_clean = kNoBlock;
  for (size_t i = 0; i < blocks_in_eviction_order.size(); ++i) {
    const BlockId b = blocks_in_eviction_order[i];
    if (!valid_id(b) || ref_count_[b] == 0) [[unlikely]] {
      undo_free(blocks_in_eviction_order.first(i));
      if (!valid_id(b)) return id_error(b, "free");
      return absl::FailedPreconditionError(absl::StrCat("BlockPool::free: block ", b, " (entry ", i,
                                                        ") has ref_count 0: a double free"));
    }
    if (--ref_count_[b] == 0) enqueue_freed(b, last_clean);
  }
  return absl::OkStatus();
}

// Restores the references `freed` dropped, last entry first. The blocks they queued were
// not queued before, so taking them out restores the queue exactly.
void BlockPool::undo_free(std::span<const BlockId> freed) {
  for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
    if (ref_count_[*it]++ == 0) {
      free_queue_->remove(*it);
      ++used_blocks_;
      cached_free_blocks_ -= hash_index_->is_cached(*it);
    }
  }
}

void BlockPool::free_unchecked(std::span<const BlockId> blocks_in_eviction_order) {
  BlockId last_clean = kNoBlock;
  for (const BlockId b : blocks_in_eviction_order) release_unchecked(b, last_clean);
}

void BlockPool::release_unchecked(BlockId block, BlockId& last_clean) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_ && ref_count_[block] > 0);
  if (--ref_count_[block] == 0) enqueue_freed(block, last_clean);
}

// --- prefix cache ------------------------------------------------------------------------

absl::StatusOr<BlockId> BlockPool::find_cached(const BlockHash& hash, BlockId parent,
                                               std::span<const TokenId> tokens,
                                               std::span<const uint64_t> extra_keys) const {
  if (parent != kNoBlock && !valid_id(parent)) [[unlikely]] {
    return id_error(parent, "find_cached");
  }
  if (std::ssize(tokens) != block_size_) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool::find_cached: ", tokens.size(),
                                                   " tokens, block_size is ", block_size_));
  }
  return find_cached_unchecked(hash, parent, tokens, extra_keys);
}

BlockId BlockPool::find_cached_unchecked(const BlockHash& hash, BlockId parent,
                                         std::span<const TokenId> tokens,
                                         std::span<const uint64_t> extra_keys) const {
  const BlockId candidate = hash_index_->find(hash);
  if (candidate == kNoBlock) return kNoBlock;
  return hash_index_->verify(candidate, parent, tokens, extra_keys) ? candidate : kNoBlock;
}

absl::StatusOr<bool> BlockPool::cache_full_block(BlockId block, const BlockHash& hash,
                                                 BlockId parent, const BlockHash* parent_hash,
                                                 std::span<const TokenId> tokens,
                                                 std::span<const uint64_t> extra_keys) {
  PAGEDKV_RETURN_IF_ERROR(check_cache_request({&block, 1}, 1, parent, tokens, "cache_full_block"));
  return cache_full_blocks_unchecked({&block, 1}, {&hash, 1}, parent, parent_hash, tokens,
                                     extra_keys) == 1;
}

absl::StatusOr<int32_t> BlockPool::cache_full_blocks(std::span<const BlockId> blocks,
                                                     std::span<const BlockHash> hashes,
                                                     BlockId parent, const BlockHash* parent_hash,
                                                     std::span<const TokenId> tokens,
                                                     std::span<const uint64_t> extra_keys) {
  PAGEDKV_RETURN_IF_ERROR(
      check_cache_request(blocks, hashes.size(), parent, tokens, "cache_full_blocks"));
  return cache_full_blocks_unchecked(blocks, hashes, parent, parent_hash, tokens, extra_keys);
}

// The arguments of cache_full_block(s): ids in range, block_size tokens per block, one hash
// per block, every block in use.
absl::Status BlockPool::check_cache_request(std::span<const BlockId> blocks, size_t num_hashes,
                                            BlockId parent, std::span<const TokenId> tokens,
                                            const char* caller) const {
  if (num_hashes != blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool::", caller, ": ", num_hashes,
                                                   " hashes for ", blocks.size(), " blocks"));
  }
  for (const BlockId block : blocks) {
    if (!valid_id(block)) [[unlikely]] {
      return id_error(block, caller);
    }
  }
  if (parent != kNoBlock && !valid_id(parent)) [[unlikely]] {
    return id_error(parent, caller);
  }
  if (tokens.size() != blocks.size() * static_cast<size_t>(block_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockPool::", caller, ": ", tokens.size(), " tokens",
                     blocks.size() == 1 ? "" : absl::StrCat(" for ", blocks.size(), " blocks"),
                     ", block_size is ", block_size_));
  }
  for (const BlockId block : blocks) {
    if (ref_count_[block] == 0) {
      return absl::FailedPreconditionError(absl::StrCat("BlockPool::", caller, ": block ", block,
                                                        " is free (ref_count 0); cache it in use"));
    }
  }
  return absl::OkStatus();
}

int32_t BlockPool::cache_full_blocks_unchecked(std::span<const BlockId> blocks,
                                               std::span<const BlockHash> hashes, BlockId parent,
                                               const BlockHash* parent_hash,
                                               std::span<const TokenId> tokens,
                                               std::span<const uint64_t> extra_keys) {
  PAGEDKV_DCHECK(hashes.size() == blocks.size());
  PAGEDKV_DCHECK(tokens.size() == blocks.size() * static_cast<size_t>(block_size_));
  if (!enable_caching_) return 0;
  int32_t entered = 0;  // indexed or standby
  BlockStored stored;   // the run of consecutive blocks indexed so far
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
    // A block hashed already, stale, or a standby is not announced and splits the event:
    // the next run names its own parent.
    if (hash_index_->is_cached(block) || marks_stale(block, block_parent)) {
      emit_run();
      continue;
    }
    const HashIndex::Insert inserted =
        hash_index_->insert(block, hashes[i], block_parent, block_tokens, extra_keys);
    entered += inserted != HashIndex::Insert::kRefused;
    if (inserted != HashIndex::Insert::kIndexed) {
      emit_run();
      continue;
    }
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

// Whether `block` holds K/V computed before the last reset_prefix_cache(): its own, or
// after such a parent's (then it is marked stale too).
bool BlockPool::marks_stale(BlockId block, BlockId parent) {
  if (stale_[block] || (parent != kNoBlock && stale_[parent])) {
    stale_[block] = 1;
    return true;
  }
  return false;
}

absl::Status BlockPool::uncache(BlockId block) {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "uncache");
  }
  uncache_unchecked(block);
  return absl::OkStatus();
}

void BlockPool::uncache_unchecked(BlockId block) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_);
  if (!hash_index_->is_cached(block)) return;
  const BlockHash hash = hash_index_->hash(block);
  const bool left_index = hash_index_->erase(block);
  cached_free_blocks_ -= ref_count_[block] == 0;
  if (left_index && event_sink_ != nullptr) event_sink_->on_event(BlockRemoved{{hash}});
}

void BlockPool::reset_prefix_cache() {
  hash_index_->clear();
  cached_free_blocks_ = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) stale_[b] = ref_count_[b] > 0;
  if (event_sink_ != nullptr) {
    // A named event: GCC 12 at -O3 misreads the temporary variant as uninitialized.
    const KvEvent cleared{std::in_place_type<AllBlocksCleared>};
    event_sink_->on_event(cleared);
  }
}

// --- queries -----------------------------------------------------------------------------

int32_t BlockPool::num_free_blocks() const { return free_queue_->size(); }

absl::StatusOr<int32_t> BlockPool::ref_count(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "ref_count");
  }
  return ref_count_[block];
}

absl::StatusOr<bool> BlockPool::is_cached(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "is_cached");
  }
  return hash_index_->is_cached(block);
}

absl::StatusOr<BlockHash> BlockPool::cached_hash(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "cached_hash");
  }
  if (!hash_index_->is_cached(block)) {
    return absl::NotFoundError(
        absl::StrCat("BlockPool::cached_hash: block ", block, " holds no hash"));
  }
  return hash_index_->hash(block);
}

BlockPool::Stats BlockPool::stats() const {
  Stats s;
  s.num_blocks = num_blocks_;
  s.used_blocks = used_blocks_;
  s.free_blocks = free_queue_->size();
  s.cached_blocks = hash_index_->size() + hash_index_->num_standby();
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
  // The index: every entry points at an indexed block that holds that hash; every
  // standby sits in the chain of the indexed block of its hash.
  absl::Status status;
  int32_t entries = 0;
  hash_index_->for_each([&](const BlockHash& hash, BlockId b) {
    ++entries;
    if (!status.ok()) return;
    if (b < 0 || b >= num_blocks_) {
      status = broken("index entry points at invalid id ", b);
    } else if (hash_index_->role(b) != HashIndex::Role::kIndexed ||
               !(hash_index_->hash(b) == hash)) {
      status = broken("index entry for block ", b, " does not match the block's hash");
    } else if (hash_index_->prev_standby(b) != kNoBlock) {
      status = broken("indexed block ", b, " has a standby link before it");
    }
  });
  if (!status.ok()) return status;
  int32_t indexed = 0;
  int32_t standby = 0;
  int32_t cached_free = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) {
    const HashIndex::Role role = hash_index_->role(b);
    indexed += role == HashIndex::Role::kIndexed;
    cached_free += role != HashIndex::Role::kNone && ref_count_[b] == 0;
    if (role != HashIndex::Role::kStandby) continue;
    ++standby;
    // Walk back to the indexed block, at most num_blocks steps.
    BlockId head = b;
    for (int32_t steps = 0; hash_index_->prev_standby(head) != kNoBlock; ++steps) {
      if (steps > num_blocks_) return broken("standby chain of block ", b, " loops");
      head = hash_index_->prev_standby(head);
    }
    if (hash_index_->role(head) != HashIndex::Role::kIndexed ||
        !(hash_index_->hash(head) == hash_index_->hash(b)) ||
        hash_index_->find(hash_index_->hash(b)) != head) {
      return broken("standby block ", b, " is not in the chain of the block indexed by its hash");
    }
  }
  if (indexed != entries)
    return broken(indexed, " blocks marked indexed but ", entries, " entries");
  if (standby != hash_index_->num_standby()) {
    return broken("num_standby ", hash_index_->num_standby(), " but ", standby, " counted");
  }
  if (cached_free != cached_free_blocks_) {
    return broken("cached_free_blocks ", cached_free_blocks_, " but ", cached_free, " counted");
  }
  if (!enable_caching_ && indexed + standby != 0) {
    return broken("caching off but ", indexed + standby, " blocks hashed");
  }
  return absl::OkStatus();
}

}  // namespace pagedkv
