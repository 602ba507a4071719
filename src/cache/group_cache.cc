// GroupCache: what every kind of layer group does alike: its pools, releases, swaps and
// the checks of its pools.
#include "cache/group_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

GroupCache::GroupCache(GroupParts parts, SharedState& shared)
    : shared_(shared),
      spec_(parts.spec),
      index_(parts.index),
      watermark_blocks_(parts.watermark_blocks),
      pools_(std::move(parts.pools)),
      host_tier_(std::move(parts.host_tier)) {}

GroupCache::~GroupCache() = default;

KvCacheManager::GroupStats GroupCache::stats() const {
  const BlockPool::Stats d = device().stats();
  const BlockPool::Stats h = host().stats();
  KvCacheManager::GroupStats s = counters_;
  s.num_blocks = d.num_blocks;
  s.used_blocks = d.used_blocks;
  s.free_blocks = d.free_blocks;
  s.cached_free_blocks = d.cached_free_blocks;
  s.num_host_blocks = h.num_blocks;
  s.used_host_blocks = h.num_blocks - h.free_blocks;
  s.cached_host_blocks = h.cached_blocks;
  s.evictions = d.evictions;
  s.host_evictions = h.evictions;
  if (host_tier_ != nullptr) {
    s.blocks_demoted = host_tier_->counters().blocks_demoted;
    s.blocks_promoted = host_tier_->counters().blocks_promoted;
    s.blocks_not_admitted = host_tier_->counters().blocks_not_admitted;
    s.ghost_hits = host_tier_->counters().ghost_hits;
  }
  return s;
}

// --- releases and swaps --------------------------------------------------------------------

bool GroupCache::retains_on_release(const Sequence&) const { return false; }
void GroupCache::set_release_retention(const Sequence&, int32_t) {}

void GroupCache::release(Sequence& seq) {
  GroupTable& t = table(seq);
  // A swapped sequence's device tables are empty; first_held is kept for swap_in().
  const auto first = std::min(static_cast<size_t>(t.first_held), t.blocks.size());
  if (retains_on_release(seq)) [[unlikely]] {
    for (size_t i = first; i < t.blocks.size(); ++i) {
      set_release_retention(seq, static_cast<int32_t>(i));
    }
  }
  release_blocks(std::span<const BlockId>(t.blocks).subspan(first));
  t.blocks.clear();
  t.first_held = 0;
  release_draft_slots(t);
}

// Tail first, as one free: a prompt's later blocks are evicted before its shared beginning,
// and its clean blocks are reused in the same order.
void GroupCache::release_blocks(std::span<const BlockId> blocks) {
  StepLedger& ledger = shared_.ledger;
  if (!ledger.holds_any_device()) [[likely]] {
    device().free_tail_first_unchecked(blocks);
  } else {
    BlockId last_clean = kNoBlock;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      ledger.release(device(), Hold::kDevice, index_, *it, last_clean);
    }
  }
}

void GroupCache::release_unimported(Sequence&) {}

void GroupCache::release_draft_slots(GroupTable& t) {
  BlockId last_clean = kNoBlock;
  for (auto it = t.draft_slots.rbegin(); it != t.draft_slots.rend(); ++it) {
    shared_.ledger.release(device(), Hold::kDevice, index_, *it, last_clean);
  }
  t.draft_slots.clear();
}

void GroupCache::release_host(Sequence& seq) {
  std::vector<BlockId>& host_blocks = table(seq).host_blocks;
  BlockId last_clean = kNoBlock;
  for (auto it = host_blocks.rbegin(); it != host_blocks.rend(); ++it) {
    shared_.ledger.release(host(), Hold::kHost, index_, *it, last_clean);
  }
  host_blocks.clear();
}

void GroupCache::swap_out(Sequence& seq) {
  GroupTable& t = table(seq);
  t.host_blocks.resize(held_entries(seq));
  host().allocate_unchecked(t.host_blocks);
  const int32_t end = t.first_held + static_cast<int32_t>(t.host_blocks.size());
  for (int32_t i = t.first_held; i < end; ++i) {
    // The device source is released below on purpose: swap-out runs first in a step.
    shared_.ledger.record(
        kSwapOut, {t.blocks[i], t.host_blocks[i - t.first_held], entry_tokens(seq, i), index_});
  }
  shared_.counters.blocks_swapped_out += std::ssize(t.host_blocks);
  // release() forgets where the table started; swap_in() needs it.
  const int32_t first_held = t.first_held;
  release(seq);
  t.first_held = first_held;
}

void GroupCache::swap_in(Sequence& seq) {
  GroupTable& t = table(seq);
  const auto needed = static_cast<int32_t>(t.host_blocks.size());
  t.blocks.assign(t.first_held + needed, kNoBlock);
  allocate_device_blocks(std::span(t.blocks).subspan(t.first_held));
  for (int32_t j = 0; j < needed; ++j) {
    const int32_t i = t.first_held + j;
    shared_.ledger.record(kSwapIn, {t.host_blocks[j], t.blocks[i], entry_tokens(seq, i), index_});
    shared_.ledger.mark_filled_by_copy(index_, t.blocks[i]);
  }
  shared_.counters.blocks_swapped_in += needed;
}

bool GroupCache::holds_a_block_alone(const Sequence& seq) const {
  const GroupTable& t = table(seq);
  return std::any_of(t.blocks.begin() + t.first_held, t.blocks.end(),
                     [&](BlockId b) { return device().ref_count_unchecked(b) == 1; });
}

void GroupCache::forget_children(uint64_t content_key) {
  device().uncache_children(content_key);
  host().uncache_children(content_key);
}

// --- helpers of the kinds ------------------------------------------------------------------

void GroupCache::allocate_device_blocks(std::span<BlockId> out) {
  device().allocate_unchecked(out);
  if (host_tier_ != nullptr) host_tier_->demote_evicted(tier_pools());
}

int32_t GroupCache::room(int32_t free_hits) const {
  const int32_t reserve = shared_.num_running > 0 ? watermark_blocks_ : 0;
  return std::max(0, device().num_free_blocks() - free_hits - reserve);
}

std::string GroupCache::in_group() const {
  return shared_.num_groups > 1 ? absl::StrCat(" in group ", index_) : std::string();
}

// --- checks --------------------------------------------------------------------------------

namespace {

template <typename... Parts>
absl::Status broken(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("KvCacheManager invariant: ", parts...));
}

}  // namespace

absl::Status GroupCache::check_pool_balance(std::span<const Sequence* const> sequences,
                                            bool on_host,
                                            std::span<const GroupCache* const> sharers) const {
  const BlockPoolCore& pool = on_host ? host() : device();
  std::vector<int32_t> holders(pool.num_blocks(), 0);
  const std::string pool_name = absl::StrCat(
      on_host ? "host" : "device", sharers.size() > 1       ? " (shared)"
                                   : shared_.num_groups > 1 ? absl::StrCat(" group ", index_)
                                                            : "");
  std::vector<int64_t> seen(pool.num_blocks(), -1);  // last sequence (by visit) holding it
  std::vector<int32_t> owner(sharers.size() > 1 ? pool.num_blocks() : 0, -1);
  int64_t visit = 0;
  for (const Sequence* s : sequences) {
    ++visit;
    for (const GroupCache* g : sharers) {
      const GroupTable& t = g->table(*s);
      std::vector<BlockId> held;
      if (on_host) {
        held = t.host_blocks;
      } else {
        const auto first =
            std::min<size_t>(static_cast<size_t>(std::max(t.first_held, 0)), t.blocks.size());
        held.assign(t.blocks.begin() + static_cast<int64_t>(first), t.blocks.end());
        held.insert(held.end(), t.draft_slots.begin(), t.draft_slots.end());
      }
      for (const BlockId b : held) {
        if (b < 0 || b >= pool.num_blocks()) {
          return broken("seq ", s->id, " holds invalid ", pool_name, " block ", b);
        }
        if (seen[b] == visit) {
          return broken("seq ", s->id, " holds ", pool_name, " block ", b, " twice");
        }
        seen[b] = visit;
        ++holders[b];
        // A block of a shared pool holds one group's K/V: no other group may hold it.
        if (!owner.empty()) {
          if (owner[b] >= 0 && owner[b] != g->index()) {
            return broken(pool_name, " block ", b, " held by group ", owner[b], " and group ",
                          g->index(), " (seq ", s->id, ")");
          }
          owner[b] = g->index();
        }
      }
    }
  }
  const StepLedger& ledger = shared_.ledger;
  for (const GroupCache* g : sharers) {
    for (const StepLedger::Parked& p :
         on_host ? ledger.deferred_host() : ledger.deferred_device()) {
      if (p.group == g->index()) ++holders[p.block];
    }
    // Exports pin device blocks: each pin is a reference, so a pinned block is never
    // evicted.
    for (const auto& [seq, groups] : shared_.pins) {
      for (const BlockId b : on_host ? std::span<const BlockId>() : groups[g->index()].blocks) {
        if (b < 0 || b >= pool.num_blocks()) {
          return broken("export of seq ", seq, " pins invalid ", pool_name, " block ", b);
        }
        ++holders[b];
      }
    }
  }
  for (BlockId b = 0; b < pool.num_blocks(); ++b) {
    if (pool.ref_count_unchecked(b) != holders[b]) {
      return broken(pool_name, " block ", b, ": ref_count ", pool.ref_count_unchecked(b),
                    " but held by ", holders[b], " tables, pending copies or exports");
    }
  }
  return absl::OkStatus();
}

// Host-tier blocks belong to no sequence: a swapped sequence's host blocks are its only copy
// of that K/V and never cached.
absl::Status GroupCache::check_pools(std::span<const Sequence* const> sequences,
                                     std::span<const GroupCache* const> device_sharers) const {
  if (!device_sharers.empty()) {
    PAGEDKV_RETURN_IF_ERROR(check_pool_balance(sequences, /*on_host=*/false, device_sharers));
  }
  const GroupCache* self = this;
  PAGEDKV_RETURN_IF_ERROR(check_pool_balance(sequences, /*on_host=*/true, {&self, 1}));
  if (host_tier_ != nullptr) {
    PAGEDKV_RETURN_IF_ERROR(host_tier_->check_invariants(
        host(), shared_.ledger, index_, /*exclusive=*/kind() != AttentionKind::kState));
  }
  if (!shared_.options.enable_host_cache && host().stats().cached_blocks != 0) {
    return broken("host tier off but ", host().stats().cached_blocks, " host blocks cached");
  }
  for (const Sequence* s : sequences) {
    for (const BlockId h : table(*s).host_blocks) {
      if (host().is_cached(h).value()) {
        return broken("seq ", s->id, " holds host block ", h, ", which is in the host tier");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
