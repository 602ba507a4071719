#include "eviction.h"

#include <algorithm>
#include <limits>
#include <set>
#include <span>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lru_lists.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

constexpr uint64_t kEvictionDomain = 0x4556494354494f4eULL;  // "EVICTION"

// The single token standing for a 512-token trace block in the block_size-1 pool.
TokenId block_token(int64_t hash_id) {
  return derive_token(kEvictionDomain, static_cast<uint64_t>(hash_id), 0);
}

// The two tiers of replay_tiered_lru() over dense ids (see eviction.h for the rules).
class TwoTierLru {
 public:
  TwoTierLru(int32_t num_ids, int32_t device_blocks, int32_t host_blocks,
             int32_t retained_head_blocks, HostAdmission admission)
      : device_blocks_(device_blocks),
        host_blocks_(host_blocks),
        retained_head_blocks_(retained_head_blocks),
        admission_(admission),
        blocks_(num_ids),
        lru_(num_ids, kNumLists) {
    result_.device_capacity = device_blocks;
    result_.host_capacity = host_blocks;
    result_.retained_head_blocks = retained_head_blocks;
  }

  // One request (at most device_blocks blocks): pin the hits, promote the host hits,
  // compute the misses, then make the blocks the device's most recent.
  void replay(const std::vector<int32_t>& ids) {
    const int32_t hits = pin_hits(ids);
    compute_misses(ids, hits);
    release(ids);
    result_.total_blocks += static_cast<int64_t>(ids.size());
  }

  const TieredReplayResult& result() const { return result_; }

 private:
  // kPinned: held by the request being replayed; it has a device slot but sits in no
  // list, so making room cannot demote it. kGhost: in neither tier, its id among the
  // device_blocks + host_blocks most recently dropped (HostAdmission::kReused's memory).
  enum Where : int8_t { kAbsent, kDevice, kHost, kPinned, kGhost };
  // List 0 is the host tier; the device has one list per retention priority: 0 (evicted
  // first) and 1 (a request's first retained_head_blocks blocks); then the ghost ids.
  static constexpr int32_t kHostList = 0, kPriorities = 2, kGhostList = 1 + kPriorities,
                           kNumLists = 2 + kPriorities;
  static int32_t device_list(int32_t priority) { return 1 + priority; }
  struct Block {
    Where where = kAbsent;
    int8_t list = 0;  // the device list of a kDevice block
    // Evidence of reuse since the block was last computed (HostAdmission::kReused): hit,
    // or recomputed while a ghost.
    bool reused = false;
  };

  bool present(int32_t id) const {
    const Where w = blocks_[id].where;
    return w == kDevice || w == kHost || w == kPinned;
  }

  // Pins the longest present prefix and returns its length. Host hits take a device slot
  // (promotion) once all hits are pinned, so making room never demotes a hit.
  int32_t pin_hits(const std::vector<int32_t>& ids) {
    const int32_t n = static_cast<int32_t>(ids.size());
    int32_t hits = 0;
    int32_t promotions = 0;
    for (; hits < n && present(ids[hits]); ++hits) {
      const int32_t id = ids[hits];
      blocks_[id].reused = true;
      if (blocks_[id].where == kHost) {
        lru_.remove(kHostList, id);
        ++promotions;
      } else if (blocks_[id].where == kDevice) {
        leave_device_list(id);
      }  // else a repeat within the request: already pinned
      blocks_[id].where = kPinned;
    }
    result_.host_hit_blocks += promotions;
    result_.device_hit_blocks += hits - promotions;
    for (int32_t i = 0; i < promotions; ++i) take_device_slot();
    return hits;
  }

  // Misses are computed into device slots. A block present after the first miss (not
  // prefix-closed; never on well-formed traces) is recomputed too: on the device it keeps
  // its slot, a host copy is dropped.
  void compute_misses(const std::vector<int32_t>& ids, int32_t hits) {
    for (size_t i = hits; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      Block& block = blocks_[id];
      if (block.where == kPinned) continue;  // a repeat within the request
      if (block.where == kDevice) {
        leave_device_list(id);
      } else {
        if (block.where == kHost) lru_.remove(kHostList, id);
        if (block.where == kGhost) lru_.remove(kGhostList, id);
        if (block.where != kHost) block.reused = block.where == kGhost;  // computed afresh
        take_device_slot();
      }
      block.where = kPinned;
    }
  }

  // Tail to head, so the head block ends up the most recently used.
  void release(const std::vector<int32_t>& ids) {
    for (int32_t i = static_cast<int32_t>(ids.size()) - 1; i >= 0; --i) {
      const int32_t id = ids[i];
      if (blocks_[id].where == kDevice) leave_device_list(id);  // a repeat within the request
      blocks_[id].list = static_cast<int8_t>(device_list(i < retained_head_blocks_ ? 1 : 0));
      lru_.push_back(blocks_[id].list, id);
      blocks_[id].where = kDevice;
    }
  }

  // A device slot for one more block: a full device demotes its least recently used
  // block of the lowest priority present.
  void take_device_slot() {
    if (device_used_ == device_blocks_) {
      int32_t priority = 0;
      while (lru_.size(device_list(priority)) == 0) ++priority;  // pinned < device_blocks
      const int32_t victim = lru_.front(device_list(priority));
      leave_device_list(victim);
      --device_used_;
      demote(victim);
    }
    ++device_used_;
  }

  // Moves a block off the device into the host tier's most recent end, dropping the
  // host's least recently used block when it is full (with no host tier: an eviction). The
  // admission rule may drop the block instead.
  void demote(int32_t id) {
    if (host_blocks_ == 0) {
      ++result_.host_evictions;
      drop(id);
      return;
    }
    if (admission_ == HostAdmission::kReused && !blocks_[id].reused) {
      ++result_.undemoted;
      drop(id);
      return;
    }
    if (lru_.size(kHostList) == host_blocks_) {
      const int32_t dropped = lru_.front(kHostList);
      lru_.remove(kHostList, dropped);
      ++result_.host_evictions;
      drop(dropped);
    }
    lru_.push_back(kHostList, id);
    blocks_[id].where = kHost;
    ++result_.demotions;
  }

  // Out of both tiers: the id joins the ghosts, which keep the device_blocks + host_blocks
  // most recent.
  void drop(int32_t id) {
    if (lru_.size(kGhostList) == device_blocks_ + host_blocks_) {
      const int32_t oldest = lru_.front(kGhostList);
      lru_.remove(kGhostList, oldest);
      blocks_[oldest].where = kAbsent;
    }
    lru_.push_back(kGhostList, id);
    blocks_[id].where = kGhost;
  }

  void leave_device_list(int32_t id) { lru_.remove(blocks_[id].list, id); }

  int32_t device_blocks_;
  int32_t host_blocks_;
  int32_t retained_head_blocks_;
  HostAdmission admission_;
  std::vector<Block> blocks_;  // by id
  LruLists lru_;
  int32_t device_used_ = 0;  // pinned + device lists
  TieredReplayResult result_;
};

}  // namespace

std::vector<std::vector<int32_t>> dense_streams(const BlockStreams& streams, int32_t* num_ids) {
  absl::flat_hash_map<int64_t, int32_t> dense;
  std::vector<std::vector<int32_t>> out;
  out.reserve(streams.size());
  for (const auto& s : streams) {
    std::vector<int32_t>& ids = out.emplace_back();
    ids.reserve(s.size());
    for (int64_t id : s) {
      ids.push_back(dense.try_emplace(id, static_cast<int32_t>(dense.size())).first->second);
    }
  }
  *num_ids = static_cast<int32_t>(dense.size());
  return out;
}

BlockStreams block_streams(const Trace& trace) {
  BlockStreams streams;
  streams.reserve(trace.requests.size());
  for (const Request& r : trace.requests) streams.push_back(r.hash_ids);
  return streams;
}

int64_t distinct_blocks(const BlockStreams& streams) {
  absl::flat_hash_set<int64_t> ids;
  for (const auto& s : streams) ids.insert(s.begin(), s.end());
  return static_cast<int64_t>(ids.size());
}

absl::StatusOr<ReplayResult> replay_block_pool(const BlockStreams& streams, int32_t capacity,
                                               EvictionPolicy policy) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pool capacity ", capacity, " must be >= 1"));
  }
  absl::StatusOr<BlockPool> pool = BlockPool::create(
      {.num_blocks = capacity, .block_size = 1, .enable_caching = true, .eviction_policy = policy});
  if (!pool.ok()) return pool.status();
  ReplayResult result{.capacity = capacity};
  std::vector<BlockHash> hashes;
  std::vector<TokenId> tokens;
  std::vector<BlockId> blocks;
  std::vector<BlockId> reversed;
  for (size_t r = 0; r < streams.size(); ++r) {
    const std::vector<int64_t>& ids = streams[r];
    const int32_t n = static_cast<int32_t>(ids.size());
    if (n > capacity) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, " has ", n, " blocks, more than the pool's ", capacity));
    }
    hashes.resize(n);
    tokens.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      tokens[i] = block_token(ids[i]);
      hashes[i] = hash_block(i == 0 ? nullptr : &hashes[i - 1],
                             std::span<const TokenId>(&tokens[i], 1), {});
    }
    // Hits: the longest prefix whose chain is cached; touch them so allocation cannot
    // evict them.
    blocks.assign(n, kNoBlock);
    int32_t hits = 0;
    for (; hits < n; ++hits) {
      const BlockId parent = hits == 0 ? kNoBlock : blocks[hits - 1];
      absl::StatusOr<BlockId> b =
          pool->find_cached(hashes[hits], parent, std::span<const TokenId>(&tokens[hits], 1), {});
      if (!b.ok()) return b.status();
      if (*b == kNoBlock) break;
      if (absl::Status s = pool->touch(*b); !s.ok()) return s;
      blocks[hits] = *b;
    }
    // Misses: allocate (evicting cached blocks in the policy's order) and enter them into
    // the index.
    const int64_t evictions_before = pool->stats().evictions;
    if (absl::Status s = pool->allocate(std::span<BlockId>(blocks).subspan(hits)); !s.ok()) {
      return s;
    }
    result.evictions += pool->stats().evictions - evictions_before;
    for (int32_t i = hits; i < n; ++i) {
      absl::StatusOr<bool> cached = pool->cache_full_block(
          blocks[i], hashes[i], i == 0 ? kNoBlock : blocks[i - 1],
          i == 0 ? nullptr : &hashes[i - 1], std::span<const TokenId>(&tokens[i], 1), {});
      if (!cached.ok()) return cached.status();
      if (!*cached) ++result.unregistered;
    }
    // Insert/touch from tail to head: the head block is freed last, so it is the most
    // recently used.
    reversed.assign(blocks.rbegin(), blocks.rend());
    if (absl::Status s = pool->free(reversed); !s.ok()) return s;
    result.total_blocks += n;
    result.hit_blocks += hits;
  }
  return result;
}

absl::StatusOr<ReplayResult> replay_belady(const BlockStreams& streams, int64_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Belady capacity ", capacity, " must be >= 1"));
  }
  // Dense ids and the flattened reference stream.
  absl::flat_hash_map<int64_t, int32_t> dense;
  std::vector<int32_t> refs;
  for (const auto& s : streams) {
    for (int64_t id : s) {
      auto [it, inserted] = dense.try_emplace(id, static_cast<int32_t>(dense.size()));
      refs.push_back(it->second);
    }
  }
  // next_use[t]: position of the next reference to refs[t], or "never".
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> next_use(refs.size());
  {
    std::vector<int64_t> last(dense.size(), kNever);
    for (int64_t t = static_cast<int64_t>(refs.size()) - 1; t >= 0; --t) {
      next_use[t] = last[refs[t]];
      last[refs[t]] = t;
    }
  }
  ReplayResult result{.capacity = capacity};
  // Cached blocks ordered by next use; key[id] is the id's entry, or kAbsent.
  constexpr int64_t kAbsent = -1;
  std::set<std::pair<int64_t, int32_t>> cache;
  std::vector<int64_t> key(dense.size(), kAbsent);
  int64_t t = 0;
  for (const auto& s : streams) {
    const int64_t n = static_cast<int64_t>(s.size());
    int64_t hits = 0;
    while (hits < n && key[refs[t + hits]] != kAbsent) ++hits;
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int32_t id = refs[t];
      if (key[id] != kAbsent) {
        cache.erase({key[id], id});
      } else if (static_cast<int64_t>(cache.size()) >= capacity) {
        auto farthest = std::prev(cache.end());
        if (farthest->first <= next_use[t]) continue;  // bypass: this block is needed last
        key[farthest->second] = kAbsent;
        cache.erase(farthest);
        ++result.evictions;
      }
      key[id] = next_use[t];
      cache.emplace(next_use[t], id);
    }
    result.total_blocks += n;
    result.hit_blocks += hits;
  }
  return result;
}

absl::StatusOr<TieredReplayResult> replay_tiered_lru(const BlockStreams& streams,
                                                     int32_t device_blocks, int32_t host_blocks,
                                                     int32_t retained_head_blocks,
                                                     HostAdmission admission) {
  if (device_blocks < 1 || host_blocks < 0 || retained_head_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tiered LRU: device_blocks ", device_blocks, " must be >= 1, host_blocks ",
                     host_blocks, " and retained_head_blocks ", retained_head_blocks, " >= 0"));
  }
  int32_t num_ids = 0;
  const std::vector<std::vector<int32_t>> requests = dense_streams(streams, &num_ids);
  TwoTierLru tiers(num_ids, device_blocks, host_blocks, retained_head_blocks, admission);
  for (size_t r = 0; r < requests.size(); ++r) {
    const int32_t n = static_cast<int32_t>(requests[r].size());
    if (n > device_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", r, " has ", n, " blocks, more than the device tier's ", device_blocks));
    }
    tiers.replay(requests[r]);
  }
  return tiers.result();
}

absl::StatusOr<TieredReplayResult> replay_tiered_manager(const BlockStreams& streams,
                                                         int32_t device_blocks, int32_t host_blocks,
                                                         HostAdmission admission) {
  if (device_blocks < 1 || host_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tiered manager replay: device_blocks ",
                                                   device_blocks, " and host_blocks ", host_blocks,
                                                   " must be >= 1"));
  }
  absl::StatusOr<KvCacheManager> m =
      KvCacheManager::create({.block_size = 1,
                              .enable_host_cache = true,
                              .host_admission = admission,
                              .layer_groups = full_attention(device_blocks, host_blocks)});
  if (!m.ok()) return m.status();
  TieredReplayResult result{.device_capacity = device_blocks, .host_capacity = host_blocks};
  std::vector<TokenId> tokens;
  for (size_t r = 0; r < streams.size(); ++r) {
    const auto n = static_cast<int32_t>(streams[r].size());
    if (n > device_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", r, " has ", n, " blocks, more than the device tier's ", device_blocks));
    }
    // A last token that is never computed: match_prefix() leaves a prompt's last token to
    // be computed, so every id's block can hit.
    tokens.resize(n + 1);
    for (int32_t i = 0; i < n; ++i) tokens[i] = block_token(streams[r][i]);
    tokens[n] = 0;
    const auto seq = static_cast<SeqId>(r);
    const KvCacheManager::Stats before = m->stats();
    if (absl::Status added = m->add_sequence(seq, tokens); !added.ok()) return added;
    absl::StatusOr<int32_t> hit = m->match_prefix(seq);
    if (!hit.ok()) return hit.status();
    if (auto slots = m->allocate_slots(seq, n - *hit); !slots.ok()) return slots.status();
    (void)m->take_step_ops();  // no engine: the copies need not run
    if (absl::Status freed = m->free(seq); !freed.ok()) return freed;
    const KvCacheManager::Stats after = m->stats();
    result.total_blocks += n;
    result.host_hit_blocks += after.host_hit_tokens - before.host_hit_tokens;
    result.device_hit_blocks += *hit - (after.host_hit_tokens - before.host_hit_tokens);
  }
  const KvCacheManager::Stats s = m->stats();
  result.demotions = s.blocks_demoted;
  result.host_evictions = s.host_evictions;
  result.undemoted = s.blocks_not_admitted;
  return result;
}

absl::StatusOr<std::vector<TierRow>> tier_study(const BlockStreams& streams,
                                                const std::vector<TierSize>& sizes) {
  std::vector<TierRow> rows;
  for (const TierSize& size : sizes) {
    const int64_t total = int64_t{size.device_blocks} + size.host_blocks;
    if (total > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("tier size ", size.device_blocks, " + ",
                                                     size.host_blocks, " exceeds int32"));
    }
    absl::StatusOr<TieredReplayResult> tiered =
        replay_tiered_lru(streams, size.device_blocks, size.host_blocks, size.retained_head_blocks);
    if (!tiered.ok()) return tiered.status();
    absl::StatusOr<ReplayResult> single = replay_block_pool(streams, static_cast<int32_t>(total));
    if (!single.ok()) return single.status();
    rows.push_back({.tiered = *tiered, .single = *single});
  }
  return rows;
}

double trace_seconds(const Trace& trace) {
  if (trace.requests.size() < 2) return 0.0;
  return trace.requests.back().arrival_s - trace.requests.front().arrival_s;
}

absl::StatusOr<std::vector<EvictionRow>> eviction_study(const BlockStreams& streams,
                                                        const std::vector<int32_t>& capacities) {
  std::vector<EvictionRow> rows;
  const int64_t distinct = distinct_blocks(streams);
  std::vector<std::pair<int64_t, bool>> sizes;
  for (int32_t c : capacities) sizes.emplace_back(c, false);
  sizes.emplace_back(std::max<int64_t>(distinct, 1), true);
  for (auto [capacity, infinite] : sizes) {
    if (capacity > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("capacity ", capacity, " exceeds int32"));
    }
    absl::StatusOr<ReplayResult> lru = replay_block_pool(streams, static_cast<int32_t>(capacity));
    if (!lru.ok()) return lru.status();
    absl::StatusOr<ReplayResult> belady = replay_belady(streams, capacity);
    if (!belady.ok()) return belady.status();
    rows.push_back({.capacity = capacity, .infinite = infinite, .lru = *lru, .belady = *belady});
  }
  return rows;
}

}  // namespace pagedkv::sim
