// HostTier: promotion, demotion and exchange of cached blocks between device and host.
#include "cache/host_tier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

BlockId HostTier::find_hit(const BlockPoolCore& host, const BlockHash& hash, uint64_t parent_key,
                           std::span<const TokenId> tokens, std::span<const uint64_t> extra_keys) {
  const BlockId hit = host.indexed_block(hash);
  if (hit == kNoBlock || !host.holds_contents(hit, parent_key, tokens, extra_keys)) return kNoBlock;
  return hit;
}

void HostTier::promote(std::span<const BlockId> hits, std::span<BlockId> promoted,
                       const Pools& pools) {
  BlockPoolCore& device = pools.device;
  BlockPoolCore& host = pools.host;
  StepLedger& ledger = pools.ledger;
  const int32_t bs = device.block_size();
  if (hits.empty()) return;
  // Held first, so that nothing this call evicts lands in them.
  for (const BlockId h : hits) host.touch_unchecked(h);
  device.allocate_unchecked(promoted);
  // The evicted blocks, in allocation order: a subsequence of `promoted`. Those not
  // exchanged are kept at the front of the list and demoted after the loop.
  device.take_evictions(evicted_);
  drop_unreused(host);
  for (const BlockId d : promoted) note_hit(d);
  size_t next_evicted = 0;
  size_t kept = 0;
  for (size_t j = 0; j < hits.size(); ++j) {
    const BlockId h = hits[j];
    const BlockId d = promoted[j];
    device.set_content_key(d, host.content_key(h));
    ledger.mark_filled_by_copy(pools.group, d);
    host.uncache_unchecked(h);
    const BlockPoolCore::EvictedBlock* e = nullptr;
    if (next_evicted < evicted_.size() && evicted_[next_evicted].block == d) {
      e = &evicted_[next_evicted++];
    }
    // One batch of exchanges may run concurrently: a host block a pending copy of this step
    // writes (a demotion or exchange put this hit there) is promoted after that batch
    // instead, and the evicted block demoted into another host block.
    const bool written_this_step = ledger.holds_host(pools.group, h);
    if (e != nullptr && !written_this_step && !refresh_host_copy(*e, pools)) {
      host.import_copy(h, device, *e);
      ledger.record(kExchange, {d, h, bs, pools.group});
      ++counters_.blocks_demoted;
    } else {
      if (e != nullptr && written_this_step) evicted_[kept++] = *e;
      ledger.record(kPromote, {h, d, bs, pools.group});
    }
    ledger.release(host, Hold::kHost, pools.group, h);
  }
  evicted_.resize(kept);
  demote(pools);
  counters_.blocks_promoted += std::ssize(hits);
}

void HostTier::note_computed(std::span<const BlockId> computed, std::span<const BlockHash> hashes) {
  if (admits_all()) return;
  for (size_t i = 0; i < computed.size(); ++i) {
    const bool ghost = ghosts_.take(hashes[i]);
    reused_[computed[i]] = ghost;
    counters_.ghost_hits += ghost;
  }
}

// With HostAdmission::kReused: drops the evictions without evidence of reuse from
// evicted_, into the ghost list, unless the tier holds their hash (refresh_host_copy()
// then moves that copy at no cost).
void HostTier::drop_unreused(const BlockPoolCore& host) {
  if (admits_all()) return;
  std::erase_if(evicted_, [&](const BlockPoolCore::EvictedBlock& e) {
    if (reused_[e.block] || host.indexed_block(e.hash) != kNoBlock) return false;
    ghosts_.add(e.hash);
    ++counters_.blocks_not_admitted;
    return true;
  });
}

// Copies each block of evicted_ into a host block of the tier, unless the tier holds its
// hash already (see refresh_host_copy()) or no host block is free or evictable (then it is
// dropped, as without a tier). The host block is held until the engine takes the copy.
// The hashes that leave both tiers become ghosts (with HostAdmission::kReused).
void HostTier::demote(const Pools& pools) {
  BlockPoolCore& host = pools.host;
  // Host blocks written this step are held until the step ends: with fewer free than
  // evicted, the least recently used evictions are the ones dropped.
  const auto dropped =
      static_cast<size_t>(std::max<int64_t>(0, std::ssize(evicted_) - host.num_free_blocks()));
  take_host_evictions(host);
  for (size_t i = 0; i < dropped; ++i) ghosts_.add(evicted_[i].hash);
  for (size_t i = dropped; i < evicted_.size(); ++i) {
    const BlockPoolCore::EvictedBlock& e = evicted_[i];
    if (refresh_host_copy(e, pools)) continue;
    if (host.num_free_blocks() == 0) {
      ghosts_.add(e.hash);
      continue;
    }
    BlockId h = kNoBlock;
    host.allocate_unchecked({&h, 1});
    take_host_evictions(host);
    host.import_copy(h, pools.device, e);
    pools.ledger.record(kDemote, {e.block, h, host.block_size(), pools.group});
    pools.ledger.release(host, Hold::kHost, pools.group, h);
    ++counters_.blocks_demoted;
  }
  evicted_.clear();
}

// The host-tier blocks the host pool evicted since the last call (logged with
// HostAdmission::kReused only: swapping's allocations too) become ghosts.
void HostTier::take_host_evictions(BlockPoolCore& host) {
  if (!host.has_evictions()) return;
  host.take_evictions(host_evicted_);
  for (const BlockPoolCore::EvictedBlock& e : host_evicted_) ghosts_.add(e.hash);
}

// Whether the host tier holds the hash of the evicted device block `e` already. A free
// host copy of the same contents then takes e's place in the tier's LRU order (and its
// retention), as a standby takes over in one pool; no copy is needed.
bool HostTier::refresh_host_copy(const BlockPoolCore::EvictedBlock& e, const Pools& pools) {
  BlockPoolCore& host = pools.host;
  const BlockId copy = host.indexed_block(e.hash);
  if (copy == kNoBlock) return false;
  if (host.ref_count_unchecked(copy) == 0) {
    const BlockPoolCore::CachedContents c = pools.device.cached_contents(e.block);
    if (host.holds_contents(copy, c.parent_key, c.tokens, c.extra_keys)) {
      host.touch_unchecked(copy);
      host.copy_retention(copy, e);
      pools.ledger.release(host, Hold::kHost, pools.group, copy);
    }
  }
  return true;
}

absl::Status HostTier::check_invariants(const BlockPoolCore& host, const StepLedger& ledger,
                                        int32_t group, bool exclusive) const {
  for (const BlockCopy& op : ledger.pending().promote) {
    if (op.group != group) continue;
    if (exclusive && host.is_cached(op.src).value()) {
      return absl::InternalError(absl::StrCat("HostTier invariant: group ", group, " host block ",
                                              op.src, " is promoted but still in the host tier"));
    }
    // A restored checkpoint stays in the tier, out of its free queue until the step ends.
    if (!exclusive && host.ref_count_unchecked(op.src) == 0) {
      return absl::InternalError(absl::StrCat("HostTier invariant: group ", group,
                                              " host checkpoint ", op.src,
                                              " is free while a pending restore reads it"));
    }
  }
  return ghosts_.check_invariants();
}

}  // namespace pagedkv::internal
