// Tests of BlockPool with EvictionPolicy::kAdaptive: which block each eviction takes,
// ghost hits, the prefix rule, retention, reset; against LRU on the same requests.
#include <catch2/catch.hpp>

#include <vector>

#include "pagedkv/block_hash.h"
#include "pagedkv/block_pool.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

BlockPool make_pool(int32_t num_blocks, EvictionPolicy policy) {
  auto pool =
      BlockPool::create({.num_blocks = num_blocks, .block_size = 1, .eviction_policy = policy});
  REQUIRE(pool.ok());
  return *std::move(pool);
}

using testing::require_valid;

// One request as an engine serves it (block_size 1: a token per block): hits the cached
// prefix, computes and caches the rest, then frees its table tail first. Returns the
// number of hit blocks; `retention` is given to the last block.
int serve(BlockPool& pool, const std::vector<TokenId>& tokens, int32_t retention = -1) {
  std::vector<BlockId> table;
  std::vector<BlockHash> hashes;
  int hits = 0;
  for (const TokenId t : tokens) {
    const BlockHash* parent_hash = hashes.empty() ? nullptr : &hashes.back();
    hashes.push_back(hash_block(parent_hash, {&t, 1}, {}));
    const BlockId parent = table.empty() ? kNoBlock : table.back();
    const BlockId hit = hits == std::ssize(table)
                            ? pool.find_cached(hashes.back(), parent, {&t, 1}, {}).value()
                            : kNoBlock;
    if (hit != kNoBlock) {
      REQUIRE(pool.touch(hit).ok());
      table.push_back(hit);
      ++hits;
      continue;
    }
    BlockId b = kNoBlock;
    REQUIRE(pool.allocate({&b, 1}).ok());
    REQUIRE(pool.cache_full_block(b, hashes.back(), parent, parent_hash, {&t, 1}, {}).ok());
    table.push_back(b);
  }
  if (retention >= 0) REQUIRE(pool.set_retention(table.back(), retention, 0).ok());
  const std::vector<BlockId> tail_first(table.rbegin(), table.rend());
  REQUIRE(pool.free(tail_first).ok());
  require_valid(pool);
  return hits;
}

TEST_CASE("adaptive eviction keeps a reused block that one-off requests flush out of LRU",
          "[adaptive]") {
  for (const EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kAdaptive}) {
    BlockPool pool = make_pool(4, policy);
    REQUIRE(serve(pool, {1}) == 0);
    REQUIRE(serve(pool, {1}) == 1);  // reused: frequent
    for (const TokenId one_off : {2, 3, 4, 5, 6}) REQUIRE(serve(pool, {one_off}) == 0);
    // LRU evicted 1 at the fifth block; ARC evicts the recent list while it is over its
    // target (0): 2, then 3.
    REQUIRE(pool.stats().evictions == 2);
    REQUIRE(serve(pool, {1}) == (policy == EvictionPolicy::kAdaptive ? 1 : 0));
    REQUIRE(pool.stats().recent_ghost_hits == 0);
  }
}

TEST_CASE("a ghost hit moves the target: toward recency from B1, toward frequency from B2",
          "[adaptive]") {
  BlockPool pool = make_pool(4, EvictionPolicy::kAdaptive);
  for (const TokenId t : {1, 1, 5, 5}) serve(pool, {t});  // T2 = {1, 5}: B1 may hold 2
  serve(pool, {2});
  serve(pool, {3});
  serve(pool, {4});                // |T1| = 4 - |T2| = 2 > p = 0: evicts 2 into B1
  REQUIRE(serve(pool, {2}) == 0);  // evicts 3 into B1, finds 2 there: p = 1, 2 frequent
  REQUIRE(pool.stats().recent_ghost_hits == 1);
  // T2 = {1, 5, 2}, T1 = {4}: |T1| = 1 <= p, so T2's least recent block, 1, goes into B2.
  REQUIRE(serve(pool, {6}) == 0);
  REQUIRE(serve(pool, {1}) == 0);  // evicts 4 (|T1| = 2 > 1), finds 1 in B2: p = 0
  REQUIRE(pool.stats().frequent_ghost_hits == 1);
  REQUIRE(pool.stats().evictions == 4);
  REQUIRE(serve(pool, {7}) == 0);  // |T1| = 1 > 0: evicts 6; T2 keeps 5, 2 and 1
  REQUIRE(serve(pool, {2}) == 1);
  REQUIRE(serve(pool, {1}) == 1);
  REQUIRE(serve(pool, {5}) == 1);
  REQUIRE(serve(pool, {6}) == 0);
}

TEST_CASE("a scan of one-off blocks through a pool with nothing reused files no ghost",
          "[adaptive]") {
  BlockPool pool = make_pool(4, EvictionPolicy::kAdaptive);
  for (TokenId t = 0; t < 40; ++t) serve(pool, {t});
  REQUIRE(pool.stats().evictions == 36);
  for (TokenId t = 0; t < 36; ++t) REQUIRE(serve(pool, {t}) == 0);  // ARC: |T1| = C, B1 empty
  REQUIRE(pool.stats().recent_ghost_hits == 0);
}

TEST_CASE("a parent is never evicted before its cached child, whatever their priorities",
          "[adaptive]") {
  for (const EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kAdaptive}) {
    BlockPool pool = make_pool(2, policy);
    serve(pool, {1});
    // The child gets the highest priority, its parent the default: LRU evicts the parent
    // first, leaving the child unreachable; the adaptive policy parks the parent and
    // evicts the child.
    REQUIRE(serve(pool, {1, 2}, kMaxRetentionPriority) == 1);
    REQUIRE(serve(pool, {9}) == 0);
    require_valid(pool);
    const int hits = serve(pool, {1, 2});
    REQUIRE(hits == (policy == EvictionPolicy::kAdaptive ? 1 : 0));
  }
}

TEST_CASE("reset_prefix_cache under the adaptive policy unparks and forgets the ghosts",
          "[adaptive]") {
  BlockPool pool = make_pool(3, EvictionPolicy::kAdaptive);
  serve(pool, {1});                         // block 0
  serve(pool, {1, 2});                      // block 1, after 0; 0 is frequent
  serve(pool, {9}, kMaxRetentionPriority);  // block 2
  REQUIRE(pool.touch(1).ok());              // the child in use, its parent free
  BlockId b = kNoBlock;
  REQUIRE(pool.allocate({&b, 1}).ok());  // parks 0 (a parent), evicts 9 (priority 100)
  REQUIRE(b == 2);
  require_valid(pool);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{0});
  pool.reset_prefix_cache();
  require_valid(pool);
  REQUIRE(pool.free(std::vector<BlockId>{2, 1}).ok());
  require_valid(pool);
  REQUIRE(pool.stats().cached_blocks == 0);
  REQUIRE(serve(pool, {9}) == 0);
  REQUIRE(pool.stats().recent_ghost_hits == 0);  // the ghosts went with the reset
}

TEST_CASE("BlockPool::create refuses an unknown eviction policy", "[adaptive]") {
  const auto pool =
      BlockPool::create({.num_blocks = 4, .eviction_policy = static_cast<EvictionPolicy>(7)});
  REQUIRE(pool.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(pool.status().message()), Catch::Contains("eviction_policy 7"));
}

}  // namespace
}  // namespace pagedkv
