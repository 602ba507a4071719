// Tests of BlockPool: free queue order, allocation, eviction, verified prefix hits, events.
#include "pagedkv/block_pool.h"

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "pagedkv/block_hash.h"

namespace pagedkv {
namespace {

BlockPool make_pool(int32_t num_blocks, int32_t block_size, KvEventSink* sink = nullptr) {
  auto pool =
      BlockPool::create({.num_blocks = num_blocks, .block_size = block_size, .event_sink = sink});
  REQUIRE(pool.ok());
  return *std::move(pool);
}

void require_valid(const BlockPool& pool) {
  const absl::Status status = pool.check_invariants();
  INFO(status.ToString());
  REQUIRE(status.ok());
}

std::vector<BlockId> allocate(BlockPool& pool, int n) {
  std::vector<BlockId> blocks(n);
  REQUIRE(pool.allocate(blocks).ok());
  require_valid(pool);
  return blocks;
}

std::vector<BlockId> reversed(std::vector<BlockId> v) { return {v.rbegin(), v.rend()}; }

BlockHash constant_hash(const BlockHash*, std::span<const TokenId>, std::span<const uint64_t>) {
  return BlockHash{42, 42};
}

TEST_CASE("BlockPool::create rejects a negative pool or a non-positive block size") {
  auto negative = BlockPool::create({.num_blocks = -1, .block_size = 16});
  REQUIRE(negative.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(negative.status().message()), Catch::Contains("num_blocks -1"));
  auto zero_size = BlockPool::create({.num_blocks = 4, .block_size = 0});
  REQUIRE(zero_size.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(zero_size.status().message()), Catch::Contains("block_size 0"));
}

TEST_CASE("a new pool allocates blocks in id order from the head of the free queue") {
  BlockPool pool = make_pool(6, 4);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{0, 1, 2, 3, 4, 5});
  REQUIRE(allocate(pool, 2) == std::vector<BlockId>{0, 1});
  REQUIRE(allocate(pool, 3) == std::vector<BlockId>{2, 3, 4});
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{5});
  REQUIRE(pool.ref_count(0) == 1);
  REQUIRE(pool.stats().used_blocks == 5);
  REQUIRE(pool.stats().free_blocks == 1);
}

TEST_CASE("allocation is all or nothing") {
  BlockPool pool = make_pool(4, 4);
  allocate(pool, 3);
  std::vector<BlockId> two(2, kNoBlock);
  const absl::Status status = pool.allocate(two);
  REQUIRE(status.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(std::string(status.message()) == "BlockPool::allocate: need 2 blocks, 1 free of 4");
  REQUIRE(two == std::vector<BlockId>{kNoBlock, kNoBlock});
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{3});
  require_valid(pool);
}

TEST_CASE("tail-first free puts a prompt's last block at the head of the eviction order") {
  BlockPool pool = make_pool(8, 4);
  const std::vector<BlockId> a = allocate(pool, 3);  // 0 1 2
  const std::vector<BlockId> b = allocate(pool, 2);  // 3 4
  pool.free(reversed(a));
  require_valid(pool);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{5, 6, 7, 2, 1, 0});
  pool.free(reversed(b));
  require_valid(pool);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{5, 6, 7, 2, 1, 0, 4, 3});
  REQUIRE(allocate(pool, 4) == std::vector<BlockId>{5, 6, 7, 2});
}

TEST_CASE("touch shares a block and takes a free block out of the queue") {
  BlockPool pool = make_pool(4, 4);
  const std::vector<BlockId> a = allocate(pool, 2);
  pool.touch(a[0]);
  REQUIRE(pool.ref_count(a[0]) == 2);
  pool.free(reversed(a));
  require_valid(pool);
  REQUIRE(pool.ref_count(a[0]) == 1);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{2, 3, 1});
  pool.touch(1);  // a hit on a free block
  require_valid(pool);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{2, 3});
  REQUIRE(pool.stats().used_blocks == 2);
}

TEST_CASE("a cached free block is evicted when reallocated, with a BlockRemoved event") {
  KvEventBuffer events;
  BlockPool pool = make_pool(2, 2, &events);
  const std::vector<TokenId> tokens = {7, 8};
  const BlockHash hash = hash_block(nullptr, tokens, {});
  const std::vector<BlockId> a = allocate(pool, 1);
  REQUIRE(pool.cache_full_block(a[0], hash, kNoBlock, nullptr, tokens, {}));
  pool.free(a);
  require_valid(pool);
  REQUIRE(pool.stats().cached_free_blocks == 1);
  REQUIRE(pool.find_cached(hash, kNoBlock, tokens, {}) == a[0]);

  allocate(pool, 2);  // takes block 1, then evicts block 0
  REQUIRE(pool.find_cached(hash, kNoBlock, tokens, {}) == kNoBlock);
  REQUIRE(pool.stats().evictions == 1);
  REQUIRE(pool.stats().cached_free_blocks == 0);
  const std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 2);
  const auto& stored = std::get<BlockStored>(seen[0]);
  REQUIRE(stored.block_hashes == std::vector<BlockHash>{hash});
  REQUIRE(stored.token_ids == tokens);
  REQUIRE(stored.block_size == 2);
  REQUIRE_FALSE(stored.parent_hash.has_value());
  REQUIRE(std::get<BlockRemoved>(seen[1]).block_hashes == std::vector<BlockHash>{hash});
}

TEST_CASE("a run of blocks is stored in one event, evicting them gives one event each") {
  KvEventBuffer events;
  BlockPool pool = make_pool(3, 2, &events);
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6};
  const BlockHash h0 = hash_block(nullptr, std::span(tokens).subspan(0, 2), {});
  const BlockHash h1 = hash_block(&h0, std::span(tokens).subspan(2, 2), {});
  const BlockHash h2 = hash_block(&h1, std::span(tokens).subspan(4, 2), {});
  const std::vector<BlockId> b = allocate(pool, 3);
  // b[1] is skipped (its hash is taken), which splits the event in two runs.
  REQUIRE(pool.cache_full_block(b[1], h1, kNoBlock, nullptr, std::span(tokens).subspan(2, 2), {}));
  events.take();
  const std::vector<BlockHash> hashes = {h0, h1, h2};
  REQUIRE(pool.cache_full_blocks(b, hashes, kNoBlock, nullptr, tokens, {}) == 2);
  std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 2);
  REQUIRE(std::get<BlockStored>(seen[0]).block_hashes == std::vector<BlockHash>{h0});
  REQUIRE(std::get<BlockStored>(seen[1]).block_hashes == std::vector<BlockHash>{h2});
  REQUIRE(std::get<BlockStored>(seen[1]).parent_hash == h1);
  REQUIRE(std::get<BlockStored>(seen[1]).token_ids == std::vector<TokenId>{5, 6});
  require_valid(pool);

  pool.free(b);
  allocate(pool, 3);  // evicts all three cached blocks
  seen = events.take();
  REQUIRE(seen.size() == 3);
  for (const KvEvent& e : seen) REQUIRE(std::get<BlockRemoved>(e).block_hashes.size() == 1);
}

TEST_CASE("a hash hit is verified against tokens, extra keys and parent") {
  BlockPool pool = make_pool(4, 2);
  const std::vector<TokenId> t0 = {1, 2};
  const std::vector<TokenId> t1 = {3, 4};
  const std::vector<uint64_t> salt = {99};
  const BlockHash h0 = hash_block(nullptr, t0, salt);
  const BlockHash h1 = hash_block(&h0, t1, salt);
  const std::vector<BlockId> b = allocate(pool, 2);
  REQUIRE(pool.cache_full_block(b[0], h0, kNoBlock, nullptr, t0, salt));
  REQUIRE(pool.cache_full_block(b[1], h1, b[0], &h0, t1, salt));
  require_valid(pool);

  REQUIRE(pool.find_cached(h1, b[0], t1, salt) == b[1]);
  REQUIRE(pool.find_cached(h1, b[0], t0, salt) == kNoBlock);      // other tokens
  REQUIRE(pool.find_cached(h1, b[0], t1, {}) == kNoBlock);        // other extra keys
  REQUIRE(pool.find_cached(h1, kNoBlock, t1, salt) == kNoBlock);  // other parent
  REQUIRE(pool.find_cached(h1, b[1], t1, salt) == kNoBlock);
}

TEST_CASE("forced hash collision never shares a block") {
  BlockPool pool = make_pool(4, 2);
  const std::vector<TokenId> mine = {1, 2};
  const std::vector<TokenId> theirs = {5, 6};
  const BlockHash h = constant_hash(nullptr, mine, {});
  const std::vector<BlockId> b = allocate(pool, 2);
  REQUIRE(pool.cache_full_block(b[0], h, kNoBlock, nullptr, mine, {}));
  // The colliding block is not indexed, and a lookup of other tokens finds nothing.
  REQUIRE_FALSE(pool.cache_full_block(b[1], constant_hash(nullptr, theirs, {}), kNoBlock, nullptr,
                                      theirs, {}));
  REQUIRE(pool.find_cached(constant_hash(nullptr, theirs, {}), kNoBlock, theirs, {}) == kNoBlock);
  REQUIRE(pool.find_cached(h, kNoBlock, mine, {}) == b[0]);
  REQUIRE(pool.stats().cached_blocks == 1);
  require_valid(pool);
}

TEST_CASE("a child cached after a parent that was evicted and refilled never matches") {
  BlockPool pool = make_pool(3, 1);
  const std::vector<TokenId> t = {5};
  const BlockHash weak = constant_hash(nullptr, t, {});
  std::vector<BlockId> chain = allocate(pool, 2);  // parent 0, child 1
  REQUIRE(pool.cache_full_block(chain[0], weak, kNoBlock, nullptr, t, {}));
  pool.free(std::vector<BlockId>{chain[0]});              // parent free-cached, child still in use
  allocate(pool, 1);                                      // block 2
  const std::vector<BlockId> refill = allocate(pool, 1);  // evicts the parent, block 0
  REQUIRE(refill[0] == chain[0]);
  REQUIRE(pool.cache_full_block(chain[1], BlockHash{1, 1}, chain[0], &weak, t, {}));
  // Refill block 0 with the same content again: a new generation.
  pool.free(refill);
  std::vector<BlockId> again = allocate(pool, 1);
  REQUIRE(again[0] == chain[0]);
  REQUIRE(pool.find_cached(BlockHash{1, 1}, chain[0], t, {}) == kNoBlock);
  require_valid(pool);
}

TEST_CASE("reset_prefix_cache empties the index and emits AllBlocksCleared") {
  KvEventBuffer events;
  BlockPool pool = make_pool(3, 1, &events);
  const std::vector<BlockId> b = allocate(pool, 2);
  const std::vector<TokenId> t0 = {1}, t1 = {2};
  REQUIRE(pool.cache_full_block(b[0], hash_block(nullptr, t0, {}), kNoBlock, nullptr, t0, {}));
  REQUIRE(pool.cache_full_block(b[1], hash_block(nullptr, t1, {}), kNoBlock, nullptr, t1, {}));
  pool.free(std::vector<BlockId>{b[1]});
  REQUIRE(pool.stats().cached_free_blocks == 1);
  events.take();
  pool.reset_prefix_cache();
  require_valid(pool);
  REQUIRE(pool.stats().cached_blocks == 0);
  REQUIRE(pool.stats().cached_free_blocks == 0);
  REQUIRE_FALSE(pool.is_cached(b[0]));
  REQUIRE(pool.ref_count(b[0]) == 1);  // in-use blocks stay with their owner
  const std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 1);
  REQUIRE(std::holds_alternative<AllBlocksCleared>(seen[0]));
}

TEST_CASE("caching off registers nothing") {
  auto pool = BlockPool::create({.num_blocks = 2, .block_size = 1, .enable_caching = false});
  REQUIRE(pool.ok());
  std::vector<BlockId> b(1);
  REQUIRE(pool->allocate(b).ok());
  const std::vector<TokenId> t = {1};
  REQUIRE_FALSE(pool->cache_full_block(b[0], hash_block(nullptr, t, {}), kNoBlock, nullptr, t, {}));
  REQUIRE(pool->stats().cached_blocks == 0);
}

TEST_CASE("hash_block chains the parent, the tokens and the extra keys") {
  const std::vector<TokenId> t = {1, 2, 3, 4};
  const std::vector<uint64_t> salt_a = {1}, salt_b = {2};
  const BlockHash root = hash_block(nullptr, t, {});
  REQUIRE(root == hash_block(nullptr, t, {}));
  REQUIRE_FALSE(root == hash_block(nullptr, t, salt_a));
  REQUIRE_FALSE(hash_block(nullptr, t, salt_a) == hash_block(nullptr, t, salt_b));
  REQUIRE_FALSE(hash_block(&root, t, {}) == root);
  const std::vector<TokenId> other = {1, 2, 3, 5};
  REQUIRE_FALSE(hash_block(nullptr, other, {}) == root);
  // Large blocks take the streaming path and agree with themselves.
  std::vector<TokenId> big(512);
  std::iota(big.begin(), big.end(), 0);
  REQUIRE(hash_block(&root, big, salt_a) == hash_block(&root, big, salt_a));
  big[511] = -1;
  REQUIRE_FALSE(hash_block(&root, big, salt_a) ==
                hash_block(&root, std::vector<TokenId>(512), salt_a));
}

}  // namespace
}  // namespace pagedkv
