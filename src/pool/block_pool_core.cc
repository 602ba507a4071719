// BlockPoolCore: construct, allocate, touch, free, cache, evict, reset, queries.
#include "pool/block_pool_core.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "pool/adaptive_eviction.h"
#include "pool/free_queue.h"
#include "pool/hash_index.h"

namespace pagedkv::internal {

// --- construct ---------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<BlockPoolCore>> BlockPoolCore::create(
    const BlockPool::Options& options, const PoolRoles& roles) {
  if (options.num_blocks < 0 || options.num_blocks > BlockPool::kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: num_blocks ", options.num_blocks,
                                                   " must be in [0, ", BlockPool::kMaxBlocks, "]"));
  }
  if (options.block_size <= 0 || options.block_size > BlockPool::kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: block_size ", options.block_size,
                                                   " must be in [1, ", BlockPool::kMaxBlockSize,
                                                   "]"));
  }
  const int64_t slots = int64_t{options.num_blocks} * options.block_size;
  if (slots > BlockPool::kMaxTokenSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BlockPool: num_blocks ", options.num_blocks, " x block_size ", options.block_size, " = ",
        slots, " token slots, more than the limit ", BlockPool::kMaxTokenSlots));
  }
  if (options.eviction_policy != EvictionPolicy::kLru &&
      options.eviction_policy != EvictionPolicy::kAdaptive) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: eviction_policy ",
                                                   static_cast<int>(options.eviction_policy),
                                                   " is neither kLru (0) nor kAdaptive (1)"));
  }
  PAGEDKV_DCHECK(roles.first_content_key > 0);  // 0 means no parent
  try {
    return std::make_unique<BlockPoolCore>(options, roles);
  } catch (const std::bad_alloc&) {  // no exception leaves the library
    return absl::ResourceExhaustedError(absl::StrCat(
        "BlockPool: cannot allocate the host bookkeeping for ", options.num_blocks, " blocks"));
  }
}

BlockPoolCore::BlockPoolCore(const BlockPool::Options& options, const PoolRoles& roles)
    : num_blocks_(options.num_blocks),
      block_size_(options.block_size),
      enable_caching_(options.enable_caching),
      event_sink_(options.event_sink),
      medium_(options.medium),
      event_group_(options.event_group),
      key_spaces_(roles.key_spaces),
      space_of_(roles.key_spaces.empty() ? 0 : options.num_blocks, 0),
      clock_(options.clock),
      ref_count_(options.num_blocks, 0),
      stale_(options.num_blocks, 0),
      priority_(options.num_blocks, kNoPriority),
      log_evictions_(roles.log_evictions),
      log_dead_contents_(roles.log_dead_contents),
      replace_stale_(roles.index_children),
      revive_(roles.index_children && roles.revive_contents),
      free_queue_(std::make_unique<FreeQueue>(options.num_blocks)),
      hash_index_(std::make_unique<HashIndex>(options.num_blocks, options.block_size)),
      adaptive_(options.eviction_policy == EvictionPolicy::kAdaptive
                    ? std::make_unique<AdaptiveEviction>(options.num_blocks)
                    : nullptr) {
  hash_index_->start_content_keys_at(roles.first_content_key);
  if (log_evictions_) hash_index_->keep_parent_hashes();  // announced with demoted copies
  if (roles.index_partial_prefixes) hash_index_->index_partial_prefixes();
  if (roles.index_children) hash_index_->index_children();
}

BlockPoolCore::~BlockPoolCore() = default;

absl::Status BlockPoolCore::id_error(BlockId block, const char* caller) const {
  return absl::InvalidArgumentError(
      absl::StrCat("BlockPool::", caller, ": block ", block, " outside [0, ", num_blocks_, ")"));
}

// --- allocate ------------------------------------------------------------------------

absl::Status BlockPoolCore::allocate(std::span<BlockId> out) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  const auto n = static_cast<int64_t>(out.size());
  if (n > num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("BlockPool::allocate: need ", n, " blocks, ",
                                                     num_free_blocks(), " free of ", num_blocks_));
  }
  allocate_unchecked(out);
  return absl::OkStatus();
}

void BlockPoolCore::allocate_unchecked(std::span<BlockId> out) {
  PAGEDKV_DCHECK(std::ssize(out) <= num_free_blocks());
  if (!out.empty()) expire_retention();
  if (adaptive_) [[unlikely]] {
    take_free_blocks<true>(out);
  } else {
    take_free_blocks<false>(out);
  }
  used_blocks_ += static_cast<int32_t>(out.size());
}

// One loop per policy, so that LRU's stays as it was.
template <bool kAdaptive>
void BlockPoolCore::take_free_blocks(std::span<BlockId> out) {
  for (BlockId& b : out) {
    b = kAdaptive ? adaptive_->take_victim(*free_queue_, *hash_index_) : free_queue_->pop_front();
    if (hash_index_->is_cached(b)) {
      // One event per evicted block, as vLLM emits them; none when a standby takes over
      // the hash (its contents stay cached).
      const BlockHash hash = hash_index_->hash(b);
      const bool gone = hash_index_->erase(b);
      if (gone) {
        left_index(b, hash);
        if (log_evictions_) {
          evicted_.push_back(
              {b, plain_hash(b, hash), hash_index_->content_key(b), priority_[b], duration_of(b)});
        }
      }
      // After left_index(): a parent that b's remembered contents follow stays remembered.
      if (revive_) [[unlikely]] {
        forget_childless(hash_index_->parent_key(b));
      }
      if constexpr (kAdaptive) {
        requeue(adaptive_->on_uncached(b, gone ? &hash : nullptr, *free_queue_));
      }
      --cached_free_blocks_;
      ++evictions_;
    }
    hash_index_->renew(b);
    stale_[b] = 0;
    ref_count_[b] = 1;
    if (priority_[b] != kNoPriority) [[unlikely]] {
      clear_retention(b);
    }
  }
  if constexpr (!kAdaptive) prefetch_next_victim();
}

// The next allocation evicts the queue's front, a block far from this one (the decode
// step allocates one block per call): its entries load while the caller works.
void BlockPoolCore::prefetch_next_victim() const {
  const BlockId b = free_queue_->prefetch_front();
  if (b == kNoBlock) return;
  __builtin_prefetch(&ref_count_[b]);
  __builtin_prefetch(&stale_[b]);
  __builtin_prefetch(&priority_[b]);
  hash_index_->prefetch_erase(b);
}

// Builds the event only for a sink: an eviction without one allocates nothing.
void BlockPoolCore::emit_removed(const BlockHash& hash, int32_t space) {
  if (event_sink_ != nullptr) {
    event_sink_->on_event(BlockRemoved{{hash}, medium_, event_group(space)});
  }
}

// `block`'s key left the index with no copy to take its place: its contents are gone.
void BlockPoolCore::left_index(BlockId block, const BlockHash& key) {
  const int32_t space = space_of(block);
  const BlockHash hash = space_key(key, space);
  emit_removed(hash, space);
  if (revive_) remember_dead_parent(block, key);
  if (log_dead_contents_) dead_contents_.push_back({hash, hash_index_->content_key(block)});
}

// --- touch and free --------------------------------------------------------------------

absl::Status BlockPoolCore::touch(BlockId block) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "touch");
  }
  touch_unchecked(block);
  return absl::OkStatus();
}

void BlockPoolCore::touch_unchecked(BlockId block) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_);
  if (ref_count_[block]++ == 0) {
    free_queue_->remove(block);
    ++used_blocks_;
    cached_free_blocks_ -= hash_index_->is_cached(block);
    if (priority_[block] != kNoPriority) [[unlikely]] {
      clear_retention(block);
    }
  } else {
    ++share_epoch_;
  }
  if (adaptive_ && hash_index_->is_cached(block)) [[unlikely]] {
    adaptive_->on_use(block, *free_queue_);
  }
}

// A block whose ref count reached 0: hashed ones join the tail of their priority's list,
// clean ones the head, after the clean blocks this call queued before (`last_clean`).
// Returns whether it is cached; the caller counts it in used_blocks_ and
// cached_free_blocks_ (a loop can keep the counts in registers: the queue's link stores
// could alias the members, so updating them here costs a load and a store per block).
inline bool BlockPoolCore::enqueue_freed(BlockId b, BlockId& last_clean) {
  if (hash_index_->is_cached(b)) {
    if (priority_[b] == kNoPriority && !adaptive_) [[likely]] {
      free_queue_->push_back(b, FreeQueue::priority_list(kDefaultRetentionPriority));
    } else {
      free_queue_->push_back(b, list_for(b));
      if (priority_[b] != kNoPriority) schedule_expiry(b);
    }
    return true;
  }
  free_queue_->insert_clean_after(last_clean, b);
  last_clean = b;
  return false;
}

absl::Status BlockPoolCore::free(std::span<const BlockId> blocks_in_eviction_order) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
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
    if (--ref_count_[b] == 0) {
      --used_blocks_;
      cached_free_blocks_ += enqueue_freed(b, last_clean);
    }
  }
  return absl::OkStatus();
}

// Restores the references `freed` dropped, last entry first. The blocks they queued were
// not queued before, so taking them out restores the queue exactly.
void BlockPoolCore::undo_free(std::span<const BlockId> freed) {
  for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
    if (ref_count_[*it]++ == 0) {
      free_queue_->remove(*it);
      ++used_blocks_;
      cached_free_blocks_ -= hash_index_->is_cached(*it);
    } else {
      ++share_epoch_;
    }
  }
}

// Releases the blocks from `first` to `last` as one free. Most are cached ones with no
// retention under LRU, bound for the tail of the default list (enqueue_freed()'s common
// case): they go through an appender, and any other block closes it first. The policy is
// read once: a helper shared with enqueue_freed() had the compiler reload adaptive_ after
// each node store, 11 % more instructions in this loop under callgrind.
template <typename BlockIt>
void BlockPoolCore::free_in_order(BlockIt first, BlockIt last) {
  const bool lru = adaptive_ == nullptr;
  const int32_t lru_list = FreeQueue::priority_list(kDefaultRetentionPriority);
  BlockId last_clean = kNoBlock;
  int32_t freed = 0;
  int32_t cached = 0;
  while (first != last) {
    {
      FreeQueue::Appender default_list(*free_queue_, lru_list);
      for (; first != last; ++first) {
        const BlockId b = *first;
        PAGEDKV_DCHECK(b >= 0 && b < num_blocks_ && ref_count_[b] > 0);
        if (--ref_count_[b] != 0) continue;
        ++freed;
        if (!lru || priority_[b] != kNoPriority || !hash_index_->is_cached(b)) break;
        default_list.push(b);
        ++cached;
      }
    }
    if (first == last) break;
    cached += enqueue_freed(*first++, last_clean);
  }
  used_blocks_ -= freed;
  cached_free_blocks_ += cached;
}

void BlockPoolCore::free_unchecked(std::span<const BlockId> blocks_in_eviction_order) {
  free_in_order(blocks_in_eviction_order.begin(), blocks_in_eviction_order.end());
}

void BlockPoolCore::free_tail_first_unchecked(std::span<const BlockId> table) {
  free_in_order(table.rbegin(), table.rend());
}

void BlockPoolCore::release_unchecked(BlockId block, BlockId& last_clean) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_ && ref_count_[block] > 0);
  if (--ref_count_[block] == 0) {
    --used_blocks_;
    cached_free_blocks_ += enqueue_freed(block, last_clean);
  }
}

// --- prefix cache ------------------------------------------------------------------------

absl::StatusOr<BlockId> BlockPoolCore::find_cached(const BlockHash& hash, BlockId parent,
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

BlockId BlockPoolCore::find_cached_unchecked(const BlockHash& hash, BlockId parent,
                                             std::span<const TokenId> tokens,
                                             std::span<const uint64_t> extra_keys) const {
  const BlockId candidate = hash_index_->find(hash);
  if (candidate == kNoBlock) return kNoBlock;
  return hash_index_->verify(candidate, hash_index_->key_of(parent), tokens, extra_keys) ? candidate
                                                                                         : kNoBlock;
}

absl::StatusOr<bool> BlockPoolCore::cache_full_block(BlockId block, const BlockHash& hash,
                                                     BlockId parent, const BlockHash* parent_hash,
                                                     std::span<const TokenId> tokens,
                                                     std::span<const uint64_t> extra_keys) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_RETURN_IF_ERROR(check_cache_request({&block, 1}, 1, parent, tokens, "cache_full_block"));
  return cache_full_blocks_unchecked({&block, 1}, {&hash, 1}, parent, parent_hash, tokens,
                                     extra_keys) == 1;
}

absl::StatusOr<int32_t> BlockPoolCore::cache_full_blocks(std::span<const BlockId> blocks,
                                                         std::span<const BlockHash> hashes,
                                                         BlockId parent,
                                                         const BlockHash* parent_hash,
                                                         std::span<const TokenId> tokens,
                                                         std::span<const uint64_t> extra_keys) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_RETURN_IF_ERROR(
      check_cache_request(blocks, hashes.size(), parent, tokens, "cache_full_blocks"));
  return cache_full_blocks_unchecked(blocks, hashes, parent, parent_hash, tokens, extra_keys);
}

// The arguments of cache_full_block(s): ids in range, block_size tokens per block, one hash
// per block, every block in use.
absl::Status BlockPoolCore::check_cache_request(std::span<const BlockId> blocks, size_t num_hashes,
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

int32_t BlockPoolCore::cache_full_blocks_unchecked(
    std::span<const BlockId> blocks, std::span<const BlockHash> hashes, BlockId parent,
    const BlockHash* parent_hash, std::span<const TokenId> tokens,
    std::span<const uint64_t> extra_keys, std::span<const uint64_t> parent_keys, int32_t space) {
  PAGEDKV_DCHECK(hashes.size() == blocks.size());
  PAGEDKV_DCHECK(space == 0 || space < std::ssize(key_spaces_));
  PAGEDKV_DCHECK(parent_keys.empty() || parent_keys.size() == blocks.size());
  PAGEDKV_DCHECK(tokens.size() == blocks.size() * static_cast<size_t>(block_size_));
  if (!enable_caching_) return 0;
  int32_t entered = 0;  // indexed or standby
  BlockStored stored;   // the run of consecutive blocks indexed so far
  auto emit_run = [&] {
    if (event_sink_ == nullptr || stored.block_hashes.empty()) return;
    stored.block_size = block_size_;
    stored.extra_keys.assign(extra_keys.begin(), extra_keys.end());
    stored.medium = medium_;
    stored.group = event_group(space);
    event_sink_->on_event(std::exchange(stored, {}));
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId block = blocks[i];
    PAGEDKV_DCHECK(block >= 0 && block < num_blocks_ && ref_count_[block] > 0);
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const BlockId block_parent = parent_keys.empty() ? (i == 0 ? parent : blocks[i - 1]) : kNoBlock;
    // A block hashed already, stale, or a standby is not announced and splits the event:
    // the next run names its own parent.
    if (hash_index_->is_cached(block) || marks_stale(block, block_parent)) {
      emit_run();
      continue;
    }
    const BlockHash* block_parent_hash = i == 0 ? parent_hash : &hashes[i - 1];
    const uint64_t parent_key =
        parent_keys.empty() ? hash_index_->key_of(block_parent) : parent_keys[i];
    const BlockHash key = space_key(hashes[i], space);
    if (!space_of_.empty()) space_of_[block] = space;
    if (revive_ && !dead_parent_keys_.empty()) [[unlikely]] {
      revive_content_key(block, key, parent_key, block_tokens, extra_keys);
    }
    if (replace_stale_) replace_stale_copies(key, parent_key, block_tokens, extra_keys);
    const HashIndex::Insert inserted =
        hash_index_->insert(block, key, parent_key, block_parent_hash, block_tokens, extra_keys);
    entered += inserted != HashIndex::Insert::kRefused;
    if (adaptive_ && inserted != HashIndex::Insert::kRefused) {
      adaptive_->on_cached(block, key, block_parent, *free_queue_, *hash_index_);
    }
    if (inserted != HashIndex::Insert::kIndexed) {
      emit_run();
      continue;
    }
    if (event_sink_ == nullptr) continue;
    if (stored.block_hashes.empty() && block_parent_hash != nullptr) {
      stored.parent_hash = *block_parent_hash;
    }
    stored.block_hashes.push_back(hashes[i]);
    stored.token_ids.insert(stored.token_ids.end(), block_tokens.begin(), block_tokens.end());
  }
  emit_run();
  return entered;
}

// Whether `block` holds K/V computed before the last reset_prefix_cache(): its own, or
// after such a parent's (then it is marked stale too).
bool BlockPoolCore::marks_stale(BlockId block, BlockId parent) {
  if (stale_[block] || (parent != kNoBlock && stale_[parent])) {
    stale_[block] = 1;
    return true;
  }
  return false;
}

absl::Status BlockPoolCore::uncache(BlockId block) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "uncache");
  }
  uncache_unchecked(block);
  return absl::OkStatus();
}

// --- the host tier's interface ----------------------------------------------------------

BlockId BlockPoolCore::indexed_block(const BlockHash& hash, int32_t space) const {
  const BlockId b = hash_index_->find(space_key(hash, space));
  // Keys of two spaces never meet short of a 128-bit collision; a hit never crosses them.
  return b == kNoBlock || space_of(b) == space ? b : kNoBlock;
}

bool BlockPoolCore::holds_contents(BlockId block, uint64_t parent_key,
                                   std::span<const TokenId> tokens,
                                   std::span<const uint64_t> extra_keys) const {
  return hash_index_->verify(block, parent_key, tokens, extra_keys);
}

BlockPoolCore::CachedContents BlockPoolCore::cached_contents(BlockId block) const {
  return {hash_index_->parent_key(block), hash_index_->tokens(block),
          hash_index_->extra_keys(block), hash_index_->parent_hash(block)};
}

uint64_t BlockPoolCore::content_key(BlockId block) const { return hash_index_->content_key(block); }

BlockId BlockPoolCore::longest_partial_match(uint64_t parent_key, std::span<const TokenId> tokens,
                                             std::span<const uint64_t> extra_keys,
                                             int32_t* matched) const {
  *matched = 0;
  if (!hash_index_->indexes_partial_prefixes()) return kNoBlock;
  return hash_index_->longest_partial_match(parent_key, tokens, extra_keys, matched);
}

void BlockPoolCore::set_content_key(BlockId block, uint64_t key) {
  hash_index_->set_content_key(block, key);
}

void BlockPoolCore::import_copy(BlockId block, const BlockPoolCore& source,
                                const EvictedBlock& from) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_ && ref_count_[block] > 0);
  PAGEDKV_DCHECK(enable_caching_ && !hash_index_->is_cached(block) && !stale_[block]);
  PAGEDKV_DCHECK(hash_index_->find(from.hash) == kNoBlock);
  const CachedContents c = source.cached_contents(from.block);
  hash_index_->set_content_key(block, from.content_key);
  hash_index_->insert(block, from.hash, c.parent_key, c.parent_hash ? &*c.parent_hash : nullptr,
                      c.tokens, c.extra_keys);
  if (adaptive_) adaptive_->on_cached(block, from.hash, kNoBlock, *free_queue_, *hash_index_);
  copy_retention(block, from);
  if (event_sink_ == nullptr) return;
  const BlockStored stored{.block_hashes = {from.hash},
                           .parent_hash = c.parent_hash,
                           .token_ids = {c.tokens.begin(), c.tokens.end()},
                           .block_size = block_size_,
                           .extra_keys = {c.extra_keys.begin(), c.extra_keys.end()},
                           .medium = medium_,
                           .group = event_group_};
  event_sink_->on_event(stored);
}

void BlockPoolCore::uncache_unchecked(BlockId block) {
  PAGEDKV_DCHECK(block >= 0 && block < num_blocks_);
  if (!hash_index_->is_cached(block)) return;
  const BlockHash hash = hash_index_->hash(block);
  const bool gone = hash_index_->erase(block);
  cached_free_blocks_ -= ref_count_[block] == 0;
  if (gone) left_index(block, hash);
  if (revive_) forget_childless(hash_index_->parent_key(block));
  if (adaptive_) requeue(adaptive_->on_uncached(block, nullptr, *free_queue_));
}

// Uncaches `block`; a free one leaves its retention list for the clean list's head.
void BlockPoolCore::drop_from_cache(BlockId block) {
  if (ref_count_[block] == 0) {
    free_queue_->remove(block);
    uncache_unchecked(block);
    free_queue_->insert_clean_after(kNoBlock, block);
    if (priority_[block] != kNoPriority) clear_retention(block);
  } else {
    uncache_unchecked(block);
  }
}

// Contents are remembered while a cached block, or remembered contents, follow them: a
// chain of contents that left the pool revives block by block when computed again.
bool BlockPoolCore::has_followers(uint64_t content_key) const {
  return hash_index_->has_children(content_key) || dead_followers_.contains(content_key);
}

void BlockPoolCore::remember_dead_parent(BlockId block, const BlockHash& key) {
  const uint64_t content_key = hash_index_->content_key(block);
  if (!has_followers(content_key)) return;
  const std::span<const TokenId> tokens = hash_index_->tokens(block);
  const std::span<const uint64_t> extra_keys = hash_index_->extra_keys(block);
  const uint64_t parent_key = hash_index_->parent_key(block);
  const auto [it, inserted] = dead_parents_.try_emplace(
      content_key, DeadParent{.key = key,
                              .space = space_of(block),
                              .parent_key = parent_key,
                              .tokens = {tokens.begin(), tokens.end()},
                              .extra_keys = {extra_keys.begin(), extra_keys.end()}});
  if (!inserted) return;  // a copy with the same key left before: remembered already
  if (parent_key != 0) ++dead_followers_[parent_key];
  dead_parent_keys_[key] = content_key;
}

void BlockPoolCore::erase_dead_parent(uint64_t content_key) {
  const auto dead = dead_parents_.find(content_key);
  const auto it = dead_parent_keys_.find(dead->second.key);
  if (it != dead_parent_keys_.end() && it->second == content_key) dead_parent_keys_.erase(it);
  const uint64_t parent_key = dead->second.parent_key;
  dead_parents_.erase(dead);
  if (parent_key == 0) return;
  const auto followers = dead_followers_.find(parent_key);
  if (--followers->second == 0) {
    dead_followers_.erase(followers);
    forget_childless(parent_key);
  }
}

void BlockPoolCore::revive_content_key(BlockId block, const BlockHash& key, uint64_t parent_key,
                                       std::span<const TokenId> tokens,
                                       std::span<const uint64_t> extra_keys) {
  const auto it = dead_parent_keys_.find(key);
  if (it == dead_parent_keys_.end()) return;
  // A copy indexed after the same contents makes `block` its standby; one indexed after
  // others is stale and gives way (replace_stale_copies()).
  const BlockId indexed = hash_index_->find(key);
  if (indexed != kNoBlock && hash_index_->parent_key(indexed) == parent_key) return;
  const auto dead = dead_parents_.find(it->second);
  PAGEDKV_DCHECK(dead != dead_parents_.end());
  const DeadParent& d = dead->second;
  if (d.parent_key != parent_key || d.space != space_of(block) ||
      !std::equal(tokens.begin(), tokens.end(), d.tokens.begin(), d.tokens.end()) ||
      !std::equal(extra_keys.begin(), extra_keys.end(), d.extra_keys.begin(), d.extra_keys.end())) {
    return;
  }
  hash_index_->set_content_key(block, dead->first);
  erase_dead_parent(dead->first);
}

void BlockPoolCore::forget_childless(uint64_t parent_key) {
  if (parent_key == 0 || !dead_parents_.contains(parent_key) || has_followers(parent_key)) return;
  erase_dead_parent(parent_key);
}

void BlockPoolCore::uncache_children(uint64_t parent_key) {
  scratch_children_.clear();
  hash_index_->for_each_child(parent_key, [&](BlockId b) { scratch_children_.push_back(b); });
  for (const BlockId b : scratch_children_) drop_from_cache(b);
}

// In an index_children pool: the copy indexed under `hash` holds these tokens and extra keys
// after other parent contents, which were recomputed since (a real collision of the
// chained hash aside): it can never verify again, so it and its standbys give way.
void BlockPoolCore::replace_stale_copies(const BlockHash& hash, uint64_t parent_key,
                                         std::span<const TokenId> tokens,
                                         std::span<const uint64_t> extra_keys) {
  const BlockId indexed = hash_index_->find(hash);
  if (indexed == kNoBlock || hash_index_->parent_key(indexed) == parent_key ||
      !hash_index_->holds_tokens(indexed, tokens, extra_keys)) {
    return;
  }
  for (BlockId b = hash_index_->find(hash); b != kNoBlock; b = hash_index_->find(hash)) {
    drop_from_cache(b);
  }
}

void BlockPoolCore::reset_prefix_cache(bool emit_event) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  hash_index_->clear();
  dead_parents_.clear();
  dead_parent_keys_.clear();
  dead_followers_.clear();
  if (adaptive_) adaptive_->on_reset(*free_queue_);
  cached_free_blocks_ = 0;
  for (BlockId b = 0; b < num_blocks_; ++b) stale_[b] = ref_count_[b] > 0;
  if (emit_event && event_sink_ != nullptr) {
    // A named event: GCC 12 at -O3 misreads the temporary variant as uninitialized.
    const KvEvent cleared{std::in_place_type<AllBlocksCleared>};
    event_sink_->on_event(cleared);
  }
}

// --- queries -----------------------------------------------------------------------------

absl::StatusOr<int32_t> BlockPoolCore::ref_count(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "ref_count");
  }
  return ref_count_[block];
}

absl::StatusOr<bool> BlockPoolCore::is_cached(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "is_cached");
  }
  return hash_index_->is_cached(block);
}

absl::StatusOr<BlockHash> BlockPoolCore::cached_hash(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "cached_hash");
  }
  if (!hash_index_->is_cached(block)) {
    return absl::NotFoundError(
        absl::StrCat("BlockPool::cached_hash: block ", block, " holds no hash"));
  }
  return plain_hash(block, hash_index_->hash(block));
}

absl::StatusOr<int32_t> BlockPoolCore::retention_priority(BlockId block) const {
  if (!valid_id(block)) [[unlikely]] {
    return id_error(block, "retention_priority");
  }
  return priority_of(block);
}

BlockPool::Stats BlockPoolCore::stats() const {
  BlockPool::Stats s;
  s.num_blocks = num_blocks_;
  s.used_blocks = used_blocks_;
  s.free_blocks = num_free_blocks();
  s.cached_blocks = hash_index_->size() + hash_index_->num_standby();
  s.cached_free_blocks = cached_free_blocks_;
  s.evictions = evictions_;
  if (adaptive_) {
    s.recent_ghost_hits = adaptive_->stats().recent_ghost_hits;
    s.frequent_ghost_hits = adaptive_->stats().frequent_ghost_hits;
  }
  return s;
}

std::vector<BlockId> BlockPoolCore::free_queue_order() const {
  std::vector<BlockId> order;
  order.reserve(num_free_blocks());
  for (BlockId b = free_queue_->first(); b != kNoBlock; b = free_queue_->next(b)) {
    order.push_back(b);
  }
  return order;
}

}  // namespace pagedkv::internal
