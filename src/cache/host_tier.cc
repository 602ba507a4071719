// HostTier: promotion, demotion and exchange of cached blocks between device and host.
#include "cache/host_tier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

void HostTier::promote_hits(Sequence& seq, int32_t max_blocks, int32_t room, const Pools& pools) {
  BlockPool& device = pools.device;
  BlockPool& host = pools.host;
  StepLedger& ledger = pools.ledger;
  const int32_t bs = device.block_size();
  const auto first = static_cast<int32_t>(seq.blocks.size());
  uint64_t parent_key = first == 0 ? 0 : device.content_key(seq.blocks[first - 1]);
  hits_.clear();
  for (int32_t i = first; i < max_blocks && i - first < room; ++i) {
    const BlockId hit = host.indexed_block(seq.block_hashes[i]);
    if (hit == kNoBlock ||
        !host.holds_contents(hit, parent_key, block_tokens(seq, i, bs), seq.extra_keys)) {
      break;
    }
    hits_.push_back(hit);
    parent_key = host.content_key(hit);
  }
  if (hits_.empty()) return;
  // Held first, so that nothing this call evicts lands in them.
  for (const BlockId h : hits_) host.touch_unchecked(h);
  const auto count = static_cast<int32_t>(hits_.size());
  seq.blocks.resize(first + count);
  const std::span<BlockId> promoted = std::span(seq.blocks).subspan(first);
  device.allocate_unchecked(promoted);
  // The evicted blocks, in allocation order: a subsequence of `promoted`. Those not
  // exchanged are kept at the front of the list and demoted after the loop.
  device.take_evictions(evicted_);
  size_t next_evicted = 0;
  size_t kept = 0;
  for (int32_t j = 0; j < count; ++j) {
    const BlockId h = hits_[j];
    const BlockId d = promoted[j];
    device.set_content_key(d, host.content_key(h));
    ledger.mark_filled_by_copy(d);
    host.uncache_unchecked(h);
    const BlockPool::EvictedBlock* e = nullptr;
    if (next_evicted < evicted_.size() && evicted_[next_evicted].block == d) {
      e = &evicted_[next_evicted++];
    }
    // One batch of exchanges may run concurrently: a host block a pending copy of this step
    // writes (a demotion or exchange put this hit there) is promoted after that batch
    // instead, and the evicted block demoted into another host block.
    const bool written_this_step = ledger.holds_host(h);
    if (e != nullptr && !written_this_step && !refresh_host_copy(*e, pools)) {
      host.import_copy(h, device, *e);
      ledger.record(kExchange, {d, h, bs});
      ++counters_.blocks_demoted;
    } else {
      if (e != nullptr && written_this_step) evicted_[kept++] = *e;
      ledger.record(kPromote, {h, d, bs});
    }
    ledger.release(host, Hold::kHost, h);
  }
  evicted_.resize(kept);
  demote(pools);
  device.cache_full_blocks_unchecked(
      promoted, std::span<const BlockHash>(seq.block_hashes).subspan(first, count),
      first == 0 ? kNoBlock : seq.blocks[first - 1],
      first == 0 ? nullptr : &seq.block_hashes[first - 1],
      std::span<const TokenId>(seq.tokens)
          .subspan(static_cast<size_t>(first) * bs, static_cast<size_t>(count) * bs),
      seq.extra_keys);
  counters_.blocks_promoted += count;
  counters_.host_hit_tokens += int64_t{count} * bs;
}

// Copies each block of evicted_ into a host block of the tier, unless the tier holds its
// hash already (see refresh_host_copy()) or no host block is free or evictable (then it is
// dropped, as without a tier). The host block is held until the engine takes the copy.
void HostTier::demote(const Pools& pools) {
  BlockPool& host = pools.host;
  // Host blocks written this step are held until the step ends: with fewer free than
  // evicted, the least recently used evictions are the ones dropped.
  const auto dropped =
      static_cast<size_t>(std::max<int64_t>(0, std::ssize(evicted_) - host.num_free_blocks()));
  for (size_t i = dropped; i < evicted_.size(); ++i) {
    const BlockPool::EvictedBlock& e = evicted_[i];
    if (refresh_host_copy(e, pools) || host.num_free_blocks() == 0) continue;
    BlockId h = kNoBlock;
    host.allocate_unchecked({&h, 1});
    host.import_copy(h, pools.device, e);
    pools.ledger.record(kDemote, {e.block, h, host.block_size()});
    pools.ledger.release(host, Hold::kHost, h);
    ++counters_.blocks_demoted;
  }
  evicted_.clear();
}

// Whether the host tier holds the hash of the evicted device block `e` already. A free
// host copy of the same contents then takes e's place in the tier's LRU order (and its
// retention), as a standby takes over in one pool; no copy is needed.
bool HostTier::refresh_host_copy(const BlockPool::EvictedBlock& e, const Pools& pools) {
  BlockPool& host = pools.host;
  const BlockId copy = host.indexed_block(e.hash);
  if (copy == kNoBlock) return false;
  if (host.ref_count_unchecked(copy) == 0) {
    const BlockPool::CachedContents c = pools.device.cached_contents(e.block);
    if (host.holds_contents(copy, c.parent_key, c.tokens, c.extra_keys)) {
      host.touch_unchecked(copy);
      host.copy_retention(copy, e);
      pools.ledger.release(host, Hold::kHost, copy);
    }
  }
  return true;
}

absl::Status HostTier::check_invariants(const BlockPool& host, const StepLedger& ledger) const {
  for (const BlockCopy& op : ledger.pending().promote) {
    if (host.is_cached(op.src).value()) {
      return absl::InternalError(absl::StrCat("HostTier invariant: host block ", op.src,
                                              " is promoted but still in the host tier"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
