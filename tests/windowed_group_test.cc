// Tests of WindowedGroup (sliding window, chunked local), driven directly
// (support/group_test_util.h) beside the full group that anchors it: the blocks a window
// needs, releases behind the window a step after writing them, the eviction class a
// released block keeps, and hits that every needed entry of the window can serve. A fresh
// pool hands out its clean blocks in id order.
#include <catch2/catch.hpp>

#include <vector>

#include "support/group_test_util.h"

namespace pagedkv {
namespace {

using internal::FullAttentionGroup;
using internal::Sequence;
using internal::WindowedGroup;
using testing::GroupFixture;
using testing::tokens_from;

constexpr int32_t kFull = 0;
constexpr int32_t kWindow = 1;

// A full group of 16 blocks and a windowed group of 8, 4 tokens a block.
KvCacheManager::Options with_window(AttentionKind kind, int32_t window) {
  return {.block_size = 4,
          .layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = 16},
                           {.kind = kind, .window = window, .num_blocks = 8}}};
}

TEST_CASE("a windowed group needs the blocks one token's window spans", "[windowed_group]") {
  GroupFixture sliding(with_window(AttentionKind::kSlidingWindow, 6));
  // A window of 6 tokens straddles at most ceil(5 / 4) + 1 = 3 blocks.
  CHECK(sliding.group(kWindow).blocks_to_run(4) == 1);
  CHECK(sliding.group(kWindow).blocks_to_run(9) == 3);
  CHECK(sliding.group(kWindow).blocks_to_run(40) == 3);
  GroupFixture chunked(with_window(AttentionKind::kChunkedLocal, 8));
  CHECK(chunked.group(kWindow).blocks_to_run(40) == 3);
  CHECK(chunked.group<WindowedGroup>(kWindow).first_needed_block(15) == 2);  // chunk [8, 16)
  CHECK(chunked.group<WindowedGroup>(kWindow).first_needed_block(16) == 4);
}

TEST_CASE("a windowed group releases the entries behind the window a step after writing them",
          "[windowed_group]") {
  GroupFixture f(with_window(AttentionKind::kSlidingWindow, 6));
  WindowedGroup& w = f.group<WindowedGroup>(kWindow);
  Sequence& a = f.add(1, tokens_from(100, 14));
  f.step(a, 14);
  a.tokens.push_back(200);
  // Token 14 attends to [9, 14]: entries 0 and 1 are dead, but this step writes them, so
  // they stay until a later call.
  CHECK(f.step(a, 1) == std::vector<int64_t>{14});
  CHECK(a.tables[kWindow].blocks == std::vector<BlockId>{0, 1, 2, 3});
  (void)f.end_step();
  // The tokens are computed; the next token (15) attends to [10, 15]: entries 0 and 1 go.
  a.match_hit = 3;  // the hit point whose window holds entry 1: it keeps the top class
  f.step(a, 0);
  CHECK(a.tables[kWindow].blocks == std::vector<BlockId>{kNoBlock, kNoBlock, 2, 3});
  CHECK(a.tables[kWindow].first_held == 2);
  CHECK(a.tables[kFull].blocks == std::vector<BlockId>{0, 1, 2, 3});
  CHECK(w.stats().released_blocks == 2);
  // Both were full and hashed: cached, behind the pool's clean blocks, in table order.
  CHECK(w.device_pool().free_queue_order() == std::vector<BlockId>{4, 5, 6, 7, 0, 1});
  // Entry 1 completes the window of a hit at 3 blocks (the sequence's last hit point):
  // the top class, the default priority. Entry 0 completes none: the lowest of 2 + 5
  // checkpoint levels' classes.
  CHECK(*w.device_pool().retention_priority(1) == kDefaultRetentionPriority);
  CHECK(*w.device_pool().retention_priority(0) == kDefaultRetentionPriority - 6);
}

TEST_CASE("a windowed group's hit needs every entry its window holds, verified after the anchor",
          "[windowed_group]") {
  GroupFixture f(with_window(AttentionKind::kSlidingWindow, 6));
  FullAttentionGroup& full = f.group<FullAttentionGroup>(kFull);
  WindowedGroup& w = f.group<WindowedGroup>(kWindow);
  Sequence& a = f.add(1, tokens_from(0, 16));
  f.step(a, 16);  // one step: the window group holds (and offers) all four blocks
  (void)f.end_step();
  Sequence& b = f.add(2, tokens_from(0, 17));
  f.hash(b, 4);
  REQUIRE(full.begin_match(b, 4) == 4);
  REQUIRE(w.begin_match(b, 4) == 4);
  // A hit of 4 blocks needs the entries the token at 16 attends to: [11, 16], entries 2, 3.
  CHECK(w.longest_hit(b, 4) == 4);
  // Without entry 3 the hit stops before it, at 3 blocks: the token at 12 needs entries 1, 2.
  w.device().uncache_unchecked(3);
  REQUIRE(full.begin_match(b, 4) == 4);
  REQUIRE(w.begin_match(b, 4) == 4);
  CHECK(w.longest_hit(b, 4) == 3);
  // Claimed: entries before the window of the hit stay released.
  w.share_hit(b, 3);
  CHECK(b.tables[kWindow].blocks == std::vector<BlockId>{kNoBlock, 1, 2});
  CHECK(b.tables[kWindow].first_held == 1);
}

}  // namespace
}  // namespace pagedkv
