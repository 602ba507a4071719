#include "eviction.h"

#include <algorithm>
#include <limits>
#include <span>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "studies/belady.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

constexpr uint64_t kEvictionDomain = 0x4556494354494f4eULL;  // "EVICTION"

// The single token standing for a 512-token trace block in a pool of one-token blocks.
TokenId block_token(int64_t hash_id) {
  return derive_token(kEvictionDomain, static_cast<uint64_t>(hash_id), 0);
}

absl::Status too_long(size_t request, int32_t blocks, const char* pool, int32_t capacity) {
  return absl::InvalidArgumentError(absl::StrCat("request ", request, " needs ", blocks,
                                                 " blocks, more than the ", pool, "'s ", capacity));
}

// One request on the BlockPool: hits are the longest prefix whose chain is cached (touched,
// so allocation cannot evict them); the misses are allocated and cached; then every block
// is freed tail to head. `scratch` holds the request's hashes, tokens and blocks.
struct PoolScratch {
  std::vector<BlockHash> hashes;
  std::vector<TokenId> tokens;
  std::vector<BlockId> blocks;
};

absl::Status replay_request(BlockPool& pool, const std::vector<int64_t>& ids, PoolScratch& s,
                            ReplayResult& result) {
  const auto n = static_cast<int32_t>(ids.size());
  s.hashes.resize(n);
  s.tokens.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    s.tokens[i] = block_token(ids[i]);
    s.hashes[i] = hash_block(i == 0 ? nullptr : &s.hashes[i - 1],
                             std::span<const TokenId>(&s.tokens[i], 1), {});
  }
  s.blocks.assign(n, kNoBlock);
  int32_t hits = 0;
  for (; hits < n; ++hits) {
    const BlockId parent = hits == 0 ? kNoBlock : s.blocks[hits - 1];
    absl::StatusOr<BlockId> b =
        pool.find_cached(s.hashes[hits], parent, std::span<const TokenId>(&s.tokens[hits], 1), {});
    if (!b.ok()) return b.status();
    if (*b == kNoBlock) break;
    if (absl::Status touched = pool.touch(*b); !touched.ok()) return touched;
    s.blocks[hits] = *b;
  }
  if (absl::Status a = pool.allocate(std::span<BlockId>(s.blocks).subspan(hits)); !a.ok()) return a;
  for (int32_t i = hits; i < n; ++i) {
    absl::StatusOr<bool> cached = pool.cache_full_block(
        s.blocks[i], s.hashes[i], i == 0 ? kNoBlock : s.blocks[i - 1],
        i == 0 ? nullptr : &s.hashes[i - 1], std::span<const TokenId>(&s.tokens[i], 1), {});
    if (!cached.ok()) return cached.status();
    if (!*cached) ++result.unregistered;
  }
  // The head block is freed last: it becomes the most recently used.
  std::reverse(s.blocks.begin(), s.blocks.end());
  if (absl::Status f = pool.free(s.blocks); !f.ok()) return f;
  result.total_blocks += n;
  result.hit_blocks += hits;
  return absl::OkStatus();
}

// The manager of replay_tiers(): one-token blocks, the host tier when there are host blocks.
absl::StatusOr<KvCacheManager> tier_manager(const TierSize& size, HostAdmission admission) {
  if (size.device_blocks < 1 || size.host_blocks < 0 || size.retained_head_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tiers: device_blocks ", size.device_blocks, " must be >= 1, host_blocks ",
        size.host_blocks, " and retained_head_blocks ", size.retained_head_blocks, " >= 0"));
  }
  return KvCacheManager::create(
      {.block_size = 1,
       .enable_host_cache = size.host_blocks > 0,
       .host_admission = admission,
       .layer_groups = full_attention(size.device_blocks, size.host_blocks)});
}

}  // namespace

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
  PoolScratch scratch;
  for (size_t r = 0; r < streams.size(); ++r) {
    const auto n = static_cast<int32_t>(streams[r].size());
    if (n > capacity) return too_long(r, n, "pool", capacity);
    if (absl::Status s = replay_request(*pool, streams[r], scratch, result); !s.ok()) return s;
  }
  const BlockPool::Stats stats = pool->stats();
  result.evictions = stats.evictions;
  result.recent_ghost_hits = stats.recent_ghost_hits;
  result.frequent_ghost_hits = stats.frequent_ghost_hits;
  return result;
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

absl::StatusOr<TieredReplayResult> replay_tiers(const BlockStreams& streams, const TierSize& size,
                                                HostAdmission admission) {
  absl::StatusOr<KvCacheManager> m = tier_manager(size, admission);
  if (!m.ok()) return m.status();
  // A request's head blocks (block_size 1: its first tokens) outrank the default priority.
  SequenceOptions head_retained;
  if (size.retained_head_blocks > 0) {
    head_retained.retention = {
        {.end = size.retained_head_blocks, .priority = kDefaultRetentionPriority + 1}};
  }
  TieredReplayResult result{.size = size};
  std::vector<TokenId> tokens;
  for (size_t r = 0; r < streams.size(); ++r) {
    // One token more, never computed: match_prefix() leaves a prompt's last token to be
    // computed, so every id's block can hit. The sequence needs a block for it too.
    const auto n = static_cast<int32_t>(streams[r].size());
    if (n + 1 > size.device_blocks) return too_long(r, n + 1, "device tier", size.device_blocks);
    tokens.resize(n + 1);
    for (int32_t i = 0; i < n; ++i) tokens[i] = block_token(streams[r][i]);
    tokens[n] = 0;
    const auto seq = static_cast<SeqId>(r);
    const int64_t host_hits_before = m->stats().host_hit_tokens;
    if (absl::Status added = m->add_sequence(seq, tokens, head_retained); !added.ok()) return added;
    absl::StatusOr<int32_t> hit = m->match_prefix(seq);
    if (!hit.ok()) return hit.status();
    if (auto slots = m->allocate_slots(seq, n - *hit); !slots.ok()) return slots.status();
    (void)m->take_step_ops();  // no engine: the copies need not run
    if (absl::Status freed = m->free(seq); !freed.ok()) return freed;
    const int64_t host_hits = m->stats().host_hit_tokens - host_hits_before;
    result.total_blocks += n;
    result.host_hit_blocks += host_hits;
    result.device_hit_blocks += *hit - host_hits;
  }
  const KvCacheManager::Stats s = m->stats();
  result.demotions = s.blocks_demoted;
  result.promotions = s.blocks_promoted;
  result.dropped = size.host_blocks > 0 ? s.host_evictions : s.evictions;
  result.not_admitted = s.blocks_not_admitted;
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
    absl::StatusOr<TieredReplayResult> tiered = replay_tiers(streams, size);
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

double PolicyRow::gap_closed() const {
  const int64_t gap = belady.hit_blocks - lru.hit_blocks;
  return gap == 0 ? 0.0 : static_cast<double>(adaptive.hit_blocks - lru.hit_blocks) / gap;
}

absl::StatusOr<std::vector<PolicyRow>> policy_study(const BlockStreams& streams,
                                                    const std::vector<int32_t>& capacities) {
  std::vector<PolicyRow> rows;
  for (int32_t capacity : capacities) {
    absl::StatusOr<ReplayResult> lru = replay_block_pool(streams, capacity);
    if (!lru.ok()) return lru.status();
    absl::StatusOr<ReplayResult> adaptive =
        replay_block_pool(streams, capacity, EvictionPolicy::kAdaptive);
    if (!adaptive.ok()) return adaptive.status();
    absl::StatusOr<ReplayResult> belady = replay_belady(streams, capacity);
    if (!belady.ok()) return belady.status();
    rows.push_back({.capacity = capacity, .lru = *lru, .adaptive = *adaptive, .belady = *belady});
  }
  return rows;
}

double AdmissionRow::demotions_saved() const {
  return all.demotions == 0 ? 0.0 : 1.0 - static_cast<double>(reused.demotions) / all.demotions;
}

absl::StatusOr<AdmissionRow> admission_study(const BlockStreams& streams, const TierSize& size) {
  absl::StatusOr<TieredReplayResult> all = replay_tiers(streams, size, HostAdmission::kAll);
  if (!all.ok()) return all.status();
  absl::StatusOr<TieredReplayResult> reused = replay_tiers(streams, size, HostAdmission::kReused);
  if (!reused.ok()) return reused.status();
  return AdmissionRow{.all = *all, .reused = *reused};
}

}  // namespace pagedkv::sim
