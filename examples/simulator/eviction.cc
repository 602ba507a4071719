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

absl::StatusOr<ReplayResult> replay_lru(const BlockStreams& streams, int32_t capacity) {
  if (capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("LRU capacity ", capacity, " must be >= 1"));
  }
  absl::StatusOr<BlockPool> pool =
      BlockPool::create({.num_blocks = capacity, .block_size = 1, .enable_caching = true});
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
    // Misses: allocate from the head of the free queue (evicting the least recently used
    // cached blocks) and enter them into the index.
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
    absl::StatusOr<ReplayResult> lru = replay_lru(streams, static_cast<int32_t>(capacity));
    if (!lru.ok()) return lru.status();
    absl::StatusOr<ReplayResult> belady = replay_belady(streams, capacity);
    if (!belady.ok()) return belady.status();
    rows.push_back({.capacity = capacity, .infinite = infinite, .lru = *lru, .belady = *belady});
  }
  return rows;
}

}  // namespace pagedkv::sim
