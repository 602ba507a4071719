// Tests of BlockPool: free queue order, allocation, eviction, verified prefix hits, events.
#include "pagedkv/block_pool.h"

#include <catch2/catch.hpp>

#include <climits>
#include <numeric>
#include <string>
#include <vector>

#include "pagedkv/block_hash.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

BlockPool make_pool(int32_t num_blocks, int32_t block_size, KvEventSink* sink = nullptr) {
  auto pool =
      BlockPool::create({.num_blocks = num_blocks, .block_size = block_size, .event_sink = sink});
  REQUIRE(pool.ok());
  return *std::move(pool);
}

using testing::require_valid;

std::vector<BlockId> allocate(BlockPool& pool, int n) {
  std::vector<BlockId> blocks(n);
  REQUIRE(pool.allocate(blocks).ok());
  require_valid(pool);
  return blocks;
}

std::vector<BlockId> reversed(std::vector<BlockId> v) { return {v.rbegin(), v.rend()}; }

void free_blocks(BlockPool& pool, const std::vector<BlockId>& blocks) {
  const absl::Status status = pool.free(blocks);
  INFO(status.ToString());
  REQUIRE(status.ok());
  require_valid(pool);
}

void touch(BlockPool& pool, BlockId block) {
  REQUIRE(pool.touch(block).ok());
  require_valid(pool);
}

int32_t ref_count(const BlockPool& pool, BlockId block) { return pool.ref_count(block).value(); }

BlockId find(const BlockPool& pool, const BlockHash& hash, BlockId parent,
             const std::vector<TokenId>& tokens, const std::vector<uint64_t>& keys = {}) {
  const absl::StatusOr<BlockId> found = pool.find_cached(hash, parent, tokens, keys);
  INFO(found.status().ToString());
  REQUIRE(found.ok());
  return *found;
}

bool cache(BlockPool& pool, BlockId block, const BlockHash& hash, BlockId parent,
           const BlockHash* parent_hash, const std::vector<TokenId>& tokens,
           const std::vector<uint64_t>& keys = {}) {
  const absl::StatusOr<bool> cached =
      pool.cache_full_block(block, hash, parent, parent_hash, tokens, keys);
  INFO(cached.status().ToString());
  REQUIRE(cached.ok());
  return *cached;
}

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
  REQUIRE(ref_count(pool, 0) == 1);
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

TEST_CASE("freed clean blocks go to the head, cached blocks to the tail, in the given order") {
  BlockPool pool = make_pool(8, 1);
  const std::vector<BlockId> a = allocate(pool, 3);  // 0 1 2
  const std::vector<BlockId> b = allocate(pool, 2);  // 3 4
  for (const BlockId block : {0, 1, 3}) {            // full blocks, hashed
    const std::vector<TokenId> t = {block};
    REQUIRE(cache(pool, block, hash_block(nullptr, t, {}), kNoBlock, nullptr, t));
  }
  free_blocks(pool, reversed(a));  // 2 clean, then 1 0 cached: tail first
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{2, 5, 6, 7, 1, 0});
  free_blocks(pool, reversed(b));  // 4 clean, 3 cached
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{4, 2, 5, 6, 7, 1, 0, 3});
  // Clean blocks are reused before any cached block is evicted; then the least recent.
  REQUIRE(allocate(pool, 6) == std::vector<BlockId>{4, 2, 5, 6, 7, 1});
  REQUIRE(pool.stats().evictions == 1);
  // Clean blocks freed in one call queue up from the head in the given order.
  free_blocks(pool, {6, 4, 7});
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{6, 4, 7, 0, 3});
}

TEST_CASE("touch shares a block and takes a free block out of the queue") {
  BlockPool pool = make_pool(4, 4);
  const std::vector<BlockId> a = allocate(pool, 2);
  touch(pool, a[0]);
  REQUIRE(ref_count(pool, a[0]) == 2);
  free_blocks(pool, reversed(a));
  require_valid(pool);
  REQUIRE(ref_count(pool, a[0]) == 1);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{1, 2, 3});  // clean: at the head
  touch(pool, 1);                                                     // a hit on a free block
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
  REQUIRE(cache(pool, a[0], hash, kNoBlock, nullptr, tokens, {}));
  free_blocks(pool, a);
  require_valid(pool);
  REQUIRE(pool.stats().cached_free_blocks == 1);
  REQUIRE(find(pool, hash, kNoBlock, tokens, {}) == a[0]);

  allocate(pool, 2);  // takes block 1, then evicts block 0
  REQUIRE(find(pool, hash, kNoBlock, tokens, {}) == kNoBlock);
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
  REQUIRE(cache(pool, b[1], h1, kNoBlock, nullptr, {3, 4}));
  events.take();
  const std::vector<BlockHash> hashes = {h0, h1, h2};
  REQUIRE(pool.cache_full_blocks(b, hashes, kNoBlock, nullptr, tokens, {}).value() == 2);
  std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 2);
  REQUIRE(std::get<BlockStored>(seen[0]).block_hashes == std::vector<BlockHash>{h0});
  REQUIRE(std::get<BlockStored>(seen[1]).block_hashes == std::vector<BlockHash>{h2});
  REQUIRE(std::get<BlockStored>(seen[1]).parent_hash == h1);
  REQUIRE(std::get<BlockStored>(seen[1]).token_ids == std::vector<TokenId>{5, 6});
  require_valid(pool);

  free_blocks(pool, b);
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
  REQUIRE(cache(pool, b[0], h0, kNoBlock, nullptr, t0, salt));
  REQUIRE(cache(pool, b[1], h1, b[0], &h0, t1, salt));
  require_valid(pool);

  REQUIRE(find(pool, h1, b[0], t1, salt) == b[1]);
  REQUIRE(find(pool, h1, b[0], t0, salt) == kNoBlock);      // other tokens
  REQUIRE(find(pool, h1, b[0], t1, {}) == kNoBlock);        // other extra keys
  REQUIRE(find(pool, h1, kNoBlock, t1, salt) == kNoBlock);  // other parent
  REQUIRE(find(pool, h1, b[1], t1, salt) == kNoBlock);
}

TEST_CASE("forced hash collision never shares a block") {
  BlockPool pool = make_pool(4, 2);
  const std::vector<TokenId> mine = {1, 2};
  const std::vector<TokenId> theirs = {5, 6};
  const BlockHash h = constant_hash(nullptr, mine, {});
  const std::vector<BlockId> b = allocate(pool, 2);
  REQUIRE(cache(pool, b[0], h, kNoBlock, nullptr, mine, {}));
  // The colliding block is not indexed, and a lookup of other tokens finds nothing.
  REQUIRE_FALSE(
      cache(pool, b[1], constant_hash(nullptr, theirs, {}), kNoBlock, nullptr, theirs, {}));
  REQUIRE(find(pool, constant_hash(nullptr, theirs, {}), kNoBlock, theirs, {}) == kNoBlock);
  REQUIRE(find(pool, h, kNoBlock, mine, {}) == b[0]);
  REQUIRE(pool.stats().cached_blocks == 1);
  require_valid(pool);
}

TEST_CASE("a child cached after a parent that was evicted and refilled never matches") {
  BlockPool pool = make_pool(3, 1);
  const std::vector<TokenId> t = {5};
  const BlockHash weak = constant_hash(nullptr, t, {});
  std::vector<BlockId> chain = allocate(pool, 2);  // parent 0, child 1
  REQUIRE(cache(pool, chain[0], weak, kNoBlock, nullptr, t, {}));
  free_blocks(pool, std::vector<BlockId>{chain[0]});      // parent free-cached, child still in use
  allocate(pool, 1);                                      // block 2
  const std::vector<BlockId> refill = allocate(pool, 1);  // evicts the parent, block 0
  REQUIRE(refill[0] == chain[0]);
  REQUIRE(cache(pool, chain[1], BlockHash{1, 1}, chain[0], &weak, t, {}));
  // Refill block 0 with the same content again: a new generation.
  free_blocks(pool, refill);
  std::vector<BlockId> again = allocate(pool, 1);
  REQUIRE(again[0] == chain[0]);
  REQUIRE(find(pool, BlockHash{1, 1}, chain[0], t, {}) == kNoBlock);
  require_valid(pool);
}

TEST_CASE("reset_prefix_cache empties the index and emits AllBlocksCleared") {
  KvEventBuffer events;
  BlockPool pool = make_pool(3, 1, &events);
  const std::vector<BlockId> b = allocate(pool, 2);
  const std::vector<TokenId> t0 = {1}, t1 = {2};
  REQUIRE(cache(pool, b[0], hash_block(nullptr, t0, {}), kNoBlock, nullptr, t0, {}));
  REQUIRE(cache(pool, b[1], hash_block(nullptr, t1, {}), kNoBlock, nullptr, t1, {}));
  free_blocks(pool, std::vector<BlockId>{b[1]});
  REQUIRE(pool.stats().cached_free_blocks == 1);
  events.take();
  pool.reset_prefix_cache();
  require_valid(pool);
  REQUIRE(pool.stats().cached_blocks == 0);
  REQUIRE(pool.stats().cached_free_blocks == 0);
  REQUIRE_FALSE(*pool.is_cached(b[0]));
  REQUIRE(ref_count(pool, b[0]) == 1);  // in-use blocks stay with their owner
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
  REQUIRE_FALSE(cache(*pool, b[0], hash_block(nullptr, t, {}), kNoBlock, nullptr, t, {}));
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

// --- issue 11: limits, checked entry points, standby duplicates, reset ----------------------

void require_error(const absl::Status& status, absl::StatusCode code, const std::string& message) {
  INFO(status.ToString());
  REQUIRE(status.code() == code);
  REQUIRE(std::string(status.message()) == message);
}

TEST_CASE("BlockPool::create rejects pools and blocks beyond the limits, without throwing") {
  require_error(BlockPool::create({.num_blocks = INT32_MAX, .block_size = 16}).status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool: num_blocks 2147483647 must be in [0, 16777216]");
  require_error(BlockPool::create({.num_blocks = 4, .block_size = INT32_MAX}).status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool: block_size 2147483647 must be in [1, 65536]");
  require_error(BlockPool::create({.num_blocks = 1 << 24, .block_size = 256}).status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool: num_blocks 16777216 x block_size 256 = 4294967296 token slots, more "
                "than the limit 2147483648");
  REQUIRE(BlockPool::create({.num_blocks = 1 << 16, .block_size = 1 << 15}).ok());  // 2^31 slots
}

TEST_CASE("BlockPool entry points reject ids out of range and change nothing") {
  BlockPool pool = make_pool(4, 2);
  const std::vector<BlockId> a = allocate(pool, 2);
  const std::vector<BlockId> queue = pool.free_queue_order();
  const std::vector<TokenId> t = {1, 2};
  const BlockHash h = hash_block(nullptr, t, {});
  for (const BlockId bad : {-1, 4, INT32_MAX, INT32_MIN}) {
    INFO("id " << bad);
    const std::string range = "block " + std::to_string(bad) + " outside [0, 4)";
    require_error(pool.touch(bad), absl::StatusCode::kInvalidArgument,
                  "BlockPool::touch: " + range);
    require_error(pool.free(std::vector<BlockId>{a[0], bad}), absl::StatusCode::kInvalidArgument,
                  "BlockPool::free: " + range);
    require_error(pool.uncache(bad), absl::StatusCode::kInvalidArgument,
                  "BlockPool::uncache: " + range);
    require_error(pool.ref_count(bad).status(), absl::StatusCode::kInvalidArgument,
                  "BlockPool::ref_count: " + range);
    require_error(pool.is_cached(bad).status(), absl::StatusCode::kInvalidArgument,
                  "BlockPool::is_cached: " + range);
    require_error(pool.cached_hash(bad).status(), absl::StatusCode::kInvalidArgument,
                  "BlockPool::cached_hash: " + range);
    require_error(pool.cache_full_block(bad, h, kNoBlock, nullptr, t, {}).status(),
                  absl::StatusCode::kInvalidArgument, "BlockPool::cache_full_block: " + range);
    if (bad == kNoBlock) continue;  // as a parent, -1 means "none"
    require_error(pool.cache_full_block(a[1], h, bad, nullptr, t, {}).status(),
                  absl::StatusCode::kInvalidArgument, "BlockPool::cache_full_block: " + range);
    require_error(pool.find_cached(h, bad, t, {}).status(), absl::StatusCode::kInvalidArgument,
                  "BlockPool::find_cached: " + range);
  }
  REQUIRE(ref_count(pool, a[0]) == 1);
  REQUIRE(pool.free_queue_order() == queue);
  REQUIRE(pool.stats().cached_blocks == 0);
  require_valid(pool);
}

TEST_CASE("a double free is refused and changes nothing") {
  BlockPool pool = make_pool(4, 2);
  const std::vector<BlockId> a = allocate(pool, 2);  // 0 1
  free_blocks(pool, {a[1]});
  require_error(pool.free(std::vector<BlockId>{a[0], a[1]}), absl::StatusCode::kFailedPrecondition,
                "BlockPool::free: block 1 (entry 1) has ref_count 0: a double free");
  // Listed twice with one reference: the second entry would drive it to -1.
  require_error(pool.free(std::vector<BlockId>{a[0], a[0]}), absl::StatusCode::kFailedPrecondition,
                "BlockPool::free: block 0 (entry 1) has ref_count 0: a double free");
  REQUIRE(ref_count(pool, a[0]) == 1);
  REQUIRE(ref_count(pool, a[1]) == 0);
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{1, 2, 3});
  REQUIRE(pool.stats().used_blocks == 1);
  require_valid(pool);
  // A block held twice may be listed twice.
  touch(pool, a[0]);
  free_blocks(pool, {a[0], a[0]});
  REQUIRE(pool.free_queue_order() == std::vector<BlockId>{0, 1, 2, 3});
}

TEST_CASE("cache_full_block refuses a wrong token count and a free block") {
  BlockPool pool = make_pool(4, 2);
  const std::vector<BlockId> a = allocate(pool, 1);
  const std::vector<TokenId> three = {1, 2, 3};
  require_error(pool.cache_full_block(a[0], BlockHash{1, 1}, kNoBlock, nullptr, three, {}).status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool::cache_full_block: 3 tokens, block_size is 2");
  require_error(pool.find_cached(BlockHash{1, 1}, kNoBlock, three, {}).status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool::find_cached: 3 tokens, block_size is 2");
  const std::vector<TokenId> two = {1, 2};
  require_error(pool.cache_full_block(3, BlockHash{1, 1}, kNoBlock, nullptr, two, {}).status(),
                absl::StatusCode::kFailedPrecondition,
                "BlockPool::cache_full_block: block 3 is free (ref_count 0); cache it in use");
  require_error(pool.cached_hash(a[0]).status(), absl::StatusCode::kNotFound,
                "BlockPool::cached_hash: block 0 holds no hash");
  REQUIRE(pool.stats().cached_blocks == 0);
  REQUIRE(pool.stats().cached_free_blocks == 0);
  require_valid(pool);
}

TEST_CASE("an identical block computed twice stands by and takes over when the original leaves") {
  KvEventBuffer events;
  BlockPool pool = make_pool(6, 1, &events);
  const std::vector<TokenId> t0 = {10}, t1 = {11}, t2 = {12};
  const BlockHash h0 = hash_block(nullptr, t0, {});
  const BlockHash h1 = hash_block(&h0, t1, {});
  const BlockHash h2 = hash_block(&h1, t2, {});
  const std::vector<BlockId> chain = allocate(pool, 3);  // 0 1 2
  REQUIRE(cache(pool, chain[0], h0, kNoBlock, nullptr, t0));
  REQUIRE(cache(pool, chain[1], h1, chain[0], &h0, t1));
  REQUIRE(cache(pool, chain[2], h2, chain[1], &h1, t2));
  const BlockId copy = allocate(pool, 1)[0];  // 3: block 1 computed again after block 0
  events.take();
  REQUIRE(cache(pool, copy, h1, chain[0], &h0, t1));  // a standby: no event
  REQUIRE(events.take().empty());
  REQUIRE(pool.stats().cached_blocks == 4);
  REQUIRE(find(pool, h1, chain[0], t1) == chain[1]);
  // Other contents under the same hash are a collision, not a standby.
  const BlockId other = allocate(pool, 1)[0];
  REQUIRE_FALSE(cache(pool, other, h1, kNoBlock, nullptr, t1));

  REQUIRE(pool.uncache(chain[1]).ok());
  require_valid(pool);
  REQUIRE(events.take().empty());  // the hash stays cached
  REQUIRE(find(pool, h1, chain[0], t1) == copy);
  REQUIRE(find(pool, h2, copy, t2) == chain[2]);  // the original's child follows the copy
  REQUIRE(pool.uncache(copy).ok());
  const std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 1);
  REQUIRE(std::get<BlockRemoved>(seen[0]).block_hashes == std::vector<BlockHash>{h1});
  REQUIRE(find(pool, h1, chain[0], t1) == kNoBlock);
  REQUIRE(pool.stats().cached_blocks == 2);
  require_valid(pool);
}

TEST_CASE("blocks in use at a reset are never indexed again, nor blocks cached after them") {
  BlockPool pool = make_pool(4, 1);
  const std::vector<TokenId> t0 = {1}, t1 = {2};
  const BlockHash h0 = hash_block(nullptr, t0, {});
  const BlockHash h1 = hash_block(&h0, t1, {});
  const BlockId before = allocate(pool, 1)[0];  // 0, filled before the reset
  pool.reset_prefix_cache();
  REQUIRE_FALSE(cache(pool, before, h0, kNoBlock, nullptr, t0));
  const BlockId after = allocate(pool, 1)[0];  // 1, filled after it, after block 0
  REQUIRE_FALSE(cache(pool, after, h1, before, &h0, t1));
  REQUIRE(pool.stats().cached_blocks == 0);
  // Reallocated blocks are fresh.
  free_blocks(pool, {after, before});
  const std::vector<BlockId> fresh = allocate(pool, 2);
  REQUIRE(cache(pool, fresh[0], h0, kNoBlock, nullptr, t0));
  REQUIRE(cache(pool, fresh[1], h1, fresh[0], &h0, t1));
  require_valid(pool);
}

// --- issue 11's rules inside issue 14's batched cache_full_blocks() ---------------------

TEST_CASE("cache_full_blocks indexes nothing stale and announces nothing stale") {
  KvEventBuffer events;
  BlockPool pool = make_pool(4, 1, &events);
  const std::vector<TokenId> tokens = {1, 2, 3};
  const BlockHash h0 = hash_block(nullptr, std::span(tokens).subspan(0, 1), {});
  const BlockHash h1 = hash_block(&h0, std::span(tokens).subspan(1, 1), {});
  const BlockHash h2 = hash_block(&h1, std::span(tokens).subspan(2, 1), {});
  const BlockId before = allocate(pool, 1)[0];  // 0, in use at the reset
  pool.reset_prefix_cache();
  REQUIRE(std::holds_alternative<AllBlocksCleared>(events.take().at(0)));
  const std::vector<BlockId> after = allocate(pool, 2);  // 1 2, filled after block 0
  const std::vector<BlockId> run = {before, after[0], after[1]};
  const std::vector<BlockHash> hashes = {h0, h1, h2};
  REQUIRE(pool.cache_full_blocks(run, hashes, kNoBlock, nullptr, tokens, {}).value() == 0);
  REQUIRE(events.take().empty());
  REQUIRE(pool.stats().cached_blocks == 0);
  // A later call naming a block of that run as parent stays stale too.
  const BlockId next = allocate(pool, 1)[0];
  const BlockHash h3 = hash_block(&h2, std::vector<TokenId>{4}, {});
  REQUIRE_FALSE(cache(pool, next, h3, after[1], &h2, {4}));
  REQUIRE(events.take().empty());
  require_valid(pool);
}

TEST_CASE("cache_full_blocks keeps a duplicate as a silent standby that splits the event") {
  KvEventBuffer events;
  BlockPool pool = make_pool(6, 1, &events);
  const std::vector<TokenId> tokens = {1, 2, 3};
  const BlockHash h0 = hash_block(nullptr, std::span(tokens).subspan(0, 1), {});
  const BlockHash h1 = hash_block(&h0, std::span(tokens).subspan(1, 1), {});
  const BlockHash h2 = hash_block(&h1, std::span(tokens).subspan(2, 1), {});
  const std::vector<BlockId> first = allocate(pool, 3);  // 0 1 2
  const std::vector<BlockHash> hashes = {h0, h1, h2};
  REQUIRE(pool.cache_full_blocks(first, hashes, kNoBlock, nullptr, tokens, {}).value() == 3);
  std::vector<KvEvent> seen = events.take();
  REQUIRE(seen.size() == 1);
  REQUIRE(std::get<BlockStored>(seen[0]).block_hashes == hashes);
  // The same contents again, but block 2 was dropped from the index first: blocks 3 and 4
  // become standbys (no event), block 5 is indexed and announced alone, after h1.
  REQUIRE(pool.uncache(first[2]).ok());
  events.take();
  const std::vector<BlockId> second = allocate(pool, 3);  // 3 4 5
  REQUIRE(pool.cache_full_blocks(second, hashes, kNoBlock, nullptr, tokens, {}).value() == 3);
  seen = events.take();
  REQUIRE(seen.size() == 1);
  const auto& stored = std::get<BlockStored>(seen[0]);
  REQUIRE(stored.block_hashes == std::vector<BlockHash>{h2});
  REQUIRE(stored.parent_hash == h1);
  REQUIRE(stored.token_ids == std::vector<TokenId>{3});
  REQUIRE(pool.stats().cached_blocks == 5);
  require_valid(pool);
  // Evicting an original whose standby is resident announces nothing: the hash stays.
  free_blocks(pool, {first[0], first[1], first[2]});  // 2 is clean: head; 0 1: tail
  allocate(pool, 3);                                  // takes 2, then evicts 0 and 1
  REQUIRE(events.take().empty());
  REQUIRE(find(pool, h0, kNoBlock, {1}) == second[0]);
  REQUIRE(pool.stats().evictions == 2);
  require_valid(pool);
}

TEST_CASE("cache_full_blocks validates every block first and changes nothing on error") {
  KvEventBuffer events;
  BlockPool pool = make_pool(4, 2, &events);
  const std::vector<TokenId> tokens = {1, 2, 3, 4};
  const BlockHash h0 = hash_block(nullptr, std::span(tokens).subspan(0, 2), {});
  const BlockHash h1 = hash_block(&h0, std::span(tokens).subspan(2, 2), {});
  const std::vector<BlockId> used = allocate(pool, 1);  // 0; block 1 stays free
  const std::vector<BlockHash> hashes = {h0, h1};
  require_error(pool.cache_full_blocks(std::vector<BlockId>{used[0], 1}, hashes, kNoBlock, nullptr,
                                       tokens, {})
                    .status(),
                absl::StatusCode::kFailedPrecondition,
                "BlockPool::cache_full_blocks: block 1 is free (ref_count 0); cache it in use");
  require_error(pool.cache_full_blocks(std::vector<BlockId>{used[0], 4}, hashes, kNoBlock, nullptr,
                                       tokens, {})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool::cache_full_blocks: block 4 outside [0, 4)");
  require_error(pool.cache_full_blocks(used, hashes, kNoBlock, nullptr, tokens, {}).status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool::cache_full_blocks: 2 hashes for 1 blocks");
  require_error(pool.cache_full_blocks(std::vector<BlockId>{used[0], used[0]}, hashes, kNoBlock,
                                       nullptr, std::span(tokens).first(3), {})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "BlockPool::cache_full_blocks: 3 tokens for 2 blocks, block_size is 2");
  REQUIRE(events.take().empty());
  REQUIRE(pool.stats().cached_blocks == 0);
  require_valid(pool);
}

}  // namespace
}  // namespace pagedkv
