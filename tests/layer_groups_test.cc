// Tests of KvCacheManager's layer groups (hybrid models): windowed release, slots per
// group, prefix hits across groups, verification along the anchor, copy-on-write, swap,
// block tables, all-or-nothing allocation. Exact values are worked out in the comments:
// a fresh pool hands out its clean blocks in id order, and freed cached blocks join the
// free queue's tail (tables are freed tail first).
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "pagedkv/kv_cache_manager.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

constexpr int32_t kFull = 0;  // group indices of the managers below
constexpr int32_t kWindow = 1;

// A full-attention group and a windowed one of `window` tokens, blocks of 4 tokens.
KvCacheManager hybrid(AttentionKind kind, int32_t window, int32_t full_blocks,
                      int32_t window_blocks, KvCacheManager::Options options = {}) {
  options.block_size = 4;
  options.layer_groups = {{.kind = AttentionKind::kFull, .num_blocks = full_blocks},
                          {.kind = kind, .window = window, .num_blocks = window_blocks}};
  return make_manager(std::move(options));
}

// Tokens of consecutive 4-token blocks, block i starting at firsts[i].
std::vector<TokenId> blocks_from(std::initializer_list<TokenId> firsts) {
  std::vector<TokenId> tokens;
  for (const TokenId f : firsts) {
    for (TokenId t = f; t < f + 4; ++t) tokens.push_back(t);
  }
  return tokens;
}

// A weak hash: a block's first token, whatever came before it. Chained hashes of
// different prefixes then collide, and only verification keeps them apart.
BlockHash first_token_hash(const BlockHash*, std::span<const TokenId> tokens,
                           std::span<const uint64_t>) {
  return BlockHash{static_cast<uint64_t>(tokens[0]), 0};
}

TEST_CASE("layer groups are validated, naming the group and the value", "[layer_groups]") {
  const LayerGroup full{.kind = AttentionKind::kFull, .num_blocks = 8};
  const LayerGroup window{.kind = AttentionKind::kSlidingWindow, .window = 16, .num_blocks = 8};
  require_error(KvCacheManager::create({}).status(), absl::StatusCode::kInvalidArgument,
                "no layer_groups; a model of full-attention layers has one: "
                "full_attention(num_blocks)");
  LayerGroup no_kind = full;
  no_kind.kind = static_cast<AttentionKind>(7);
  require_error(KvCacheManager::create({.layer_groups = {no_kind}}).status(),
                absl::StatusCode::kInvalidArgument, "kind 7 is not an AttentionKind (0 to 3)");
  LayerGroup no_window = window;
  no_window.window = 0;
  require_error(KvCacheManager::create({.layer_groups = {full, no_window}}).status(),
                absl::StatusCode::kInvalidArgument, "layer_groups[1] (sliding_window): window 0");
  LayerGroup full_with_window = full;
  full_with_window.window = 4;
  require_error(KvCacheManager::create({.layer_groups = {full_with_window}}).status(),
                absl::StatusCode::kInvalidArgument, "must be 0 for full attention");
  LayerGroup empty = window;
  empty.num_blocks = 0;
  require_error(KvCacheManager::create({.layer_groups = {full, empty}}).status(),
                absl::StatusCode::kInvalidArgument,
                "layer_groups[1] (sliding_window): num_blocks 0");
  require_error(KvCacheManager::create({.layer_groups = {window}}).status(),
                absl::StatusCode::kInvalidArgument, "need a full-attention group");
  CHECK(KvCacheManager::create({.enable_prefix_caching = false, .layer_groups = {window}}).ok());
  LayerGroup full_with_host = full;
  full_with_host.num_host_blocks = 4;
  require_error(
      KvCacheManager::create({.enable_host_cache = true, .layer_groups = {full_with_host, window}})
          .status(),
      absl::StatusCode::kInvalidArgument, "needs num_host_blocks > 0 in every group");
  const KvCacheManager m = make_manager({.layer_groups = {full, window}});
  CHECK(m.num_groups() == 2);
  CHECK(m.layer_group(1)->window == 16);
  require_error(m.sequence(0, 2).status(), absl::StatusCode::kNotFound, "unknown sequence 0");
}

TEST_CASE("every call that takes a layer group refuses one out of range, naming it",
          "[layer_groups]") {
  const KvCacheManager m = make_manager(
      {.layer_groups = {{.num_blocks = 8},
                        {.kind = AttentionKind::kSlidingWindow, .window = 16, .num_blocks = 8}}});
  for (const int32_t bad : {-1, 2, std::numeric_limits<int32_t>::max()}) {
    const std::string range = "layer group " + std::to_string(bad) + " outside [0, 2)";
    require_error(m.layer_group(bad).status(), absl::StatusCode::kInvalidArgument,
                  "layer_group: " + range);
    require_error(m.group_stats(bad).status(), absl::StatusCode::kInvalidArgument,
                  "group_stats: " + range);
    require_error(m.device_pool(bad).status(), absl::StatusCode::kInvalidArgument,
                  "device_pool: " + range);
    require_error(m.host_pool(bad).status(), absl::StatusCode::kInvalidArgument,
                  "host_pool: " + range);
    require_error(m.slot_mapping(bad).status(), absl::StatusCode::kInvalidArgument,
                  "slot_mapping: " + range);
    require_error(m.batch_slot_mapping(bad).status(), absl::StatusCode::kInvalidArgument,
                  "batch_slot_mapping: " + range);
  }
  CHECK(m.slot_mapping(1)->empty());  // no call yet
  CHECK((*m.device_pool(1))->num_blocks() == 8);
}

TEST_CASE("a sliding-window group releases the blocks behind the window, a step after writing them",
          "[layer_groups]") {
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 16, 8);
  admit(m, 1, iota_tokens(14));
  // 14 tokens: blocks 0-3 of each pool; the slots are the same in both.
  CHECK(allocate(m, 1, 14) == Slots{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  CHECK(slots_of(m, kWindow) == slots_of(m, kFull));
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{200}).ok());
  // Token 14 attends to [9, 14]: entries 0 and 1 are dead, but this step writes them, so
  // they stay until a later call.
  CHECK(allocate(m, 1, 1) == Slots{14});
  CHECK(table(m, 1, kWindow) == Blocks{0, 1, 2, 3});
  end_step(m);
  // Nothing new to compute; the next token (15) attends to [10, 15]: entries 0 and 1 go.
  CHECK(allocate(m, 1, 0).empty());
  CHECK(table(m, 1, kWindow) == Blocks{kNoBlock, kNoBlock, 2, 3});
  CHECK(m.sequence(1, kWindow)->first_held_block == 2);
  CHECK(table(m, 1, kFull) == Blocks{0, 1, 2, 3});
  // Both were full and hashed: they stay cached, behind the window pool's clean blocks, in
  // table order.
  CHECK(m.device_pool(kWindow).value()->free_queue_order() == Blocks{4, 5, 6, 7, 0, 1});
  CHECK(m.group_stats(kWindow)->released_blocks == 2);
  CHECK(m.group_stats(kWindow)->used_blocks == 2);
  CHECK(m.group_stats(kFull)->used_blocks == 4);
  end_step(m);
  // Four more tokens (15-18): block 4 of each pool.
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{201, 202, 203, 204}).ok());
  CHECK(allocate(m, 1, 4) == Slots{15, 16, 17, 18});
  CHECK(slots_of(m, kWindow) == Slots{15, 16, 17, 18});
  CHECK(table(m, 1, kWindow) == Blocks{kNoBlock, kNoBlock, 2, 3, 4});
  // Kernels get padding where the window released its blocks.
  BlockTables tables;
  const SeqId seqs[] = {1};
  REQUIRE(m.build_block_tables(seqs, &tables, kWindow).ok());
  CHECK(tables.block_table == std::vector<int32_t>{kPaddingBlock, kPaddingBlock, 2, 3, 4});
  CHECK(tables.context_lens == std::vector<int32_t>{19});
  CHECK(tables.indices == std::vector<int32_t>{kPaddingBlock, kPaddingBlock, 2, 3, 4});
  CHECK(tables.last_page_len == std::vector<int32_t>{3});
  require_error(m.build_block_tables(seqs, &tables, 2), absl::StatusCode::kInvalidArgument,
                "layer group 2 outside [0, 2)");
}

TEST_CASE("a prefix hit across groups needs the window before it", "[layer_groups]") {
  // Window pool of 7: the prompt's 4 blocks, and room for an unrelated prompt to evict.
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 32, 7);
  const std::vector<TokenId> prompt = iota_tokens(16);
  admit(m, 1, prompt);
  allocate(m, 1, 16);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // Freed tail first: window pool [4, 5, 6 clean | 3, 2, 1, 0 cached].
  CHECK(m.device_pool(kWindow).value()->free_queue_order() == Blocks{4, 5, 6, 3, 2, 1, 0});

  std::vector<TokenId> longer = prompt;
  longer.insert(longer.end(), {7, 7, 7});
  SECTION("the whole window is cached: the hit is the full groups' 16 tokens") {
    admit(m, 2, longer);
    // Token 16 attends to [11, 16]: entries 2 and 3 of the window group.
    CHECK(*m.match_prefix(2) == 16);
    CHECK(table(m, 2, kFull) == Blocks{0, 1, 2, 3});
    CHECK(table(m, 2, kWindow) == Blocks{kNoBlock, kNoBlock, 2, 3});
    CHECK(m.group_stats(kWindow)->hit_blocks == 2);
    CHECK(m.group_stats(kFull)->hit_blocks == 4);
    require_valid(m);
  }
  SECTION("the window lost the last block: the hit ends where a window is whole") {
    // 16 unrelated tokens take the 3 clean window blocks and evict block 3.
    admit(m, 3, iota_tokens(16, 900));
    allocate(m, 3, 16);
    CHECK(table(m, 3, kWindow) == Blocks{4, 5, 6, 3});
    admit(m, 2, longer);
    // 16 would need entry 3; 12 needs entries 1 and 2 (token 12 attends to [7, 12]).
    CHECK(*m.match_prefix(2) == 12);
    CHECK(table(m, 2, kFull) == Blocks{0, 1, 2});
    CHECK(table(m, 2, kWindow) == Blocks{kNoBlock, 1, 2});
    CHECK(m.stats().prefix_hit_tokens == 12);
    require_valid(m);
  }
}

TEST_CASE("a chunked-local group needs nothing cached for a hit at a chunk boundary",
          "[layer_groups]") {
  // Chunks of 8 tokens, a chunk pool of 4 blocks.
  KvCacheManager m = hybrid(AttentionKind::kChunkedLocal, /*chunk=*/8, 16, 4);
  const std::vector<TokenId> prompt = iota_tokens(16);
  admit(m, 1, prompt);
  allocate(m, 1, 16);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // Another prompt takes every chunk block: none of the first prompt's is left there.
  admit(m, 3, iota_tokens(16, 900));
  allocate(m, 3, 16);
  std::vector<TokenId> longer = prompt;
  longer.push_back(7);
  admit(m, 2, longer);
  // Token 16 starts a chunk: it attends to nothing before it.
  CHECK(*m.match_prefix(2) == 16);
  CHECK(table(m, 2, kWindow) == Blocks{kNoBlock, kNoBlock, kNoBlock, kNoBlock});
  CHECK(m.sequence(2, kWindow)->first_held_block == 4);
  end_step(m);
  REQUIRE(m.free(3).ok());
  // Token 16 then goes into a new block of each group: the full pool's first clean one.
  CHECK(allocate(m, 2, 1) == Slots{int64_t{8} * 4});
  CHECK(table(m, 2, kWindow).size() == 5);
  require_valid(m);
}

TEST_CASE("a windowed block cached after another prefix is never a hit, even when hashes collide",
          "[layer_groups]") {
  KvCacheManager::Options options;
  options.hash_fn = first_token_hash;
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 32, 7, options);
  const std::vector<TokenId> x = blocks_from({10, 20, 30, 40});
  admit(m, 1, x);
  allocate(m, 1, 16);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // Another prompt whose last block holds x's last tokens after other blocks: the window
  // pool evicts x's block 3 for it and caches its own block 3 under the same (weak) hash.
  admit(m, 2, blocks_from({50, 60, 70, 40}));
  allocate(m, 2, 16);
  CHECK(table(m, 2, kWindow) == Blocks{4, 5, 6, 3});
  end_step(m);
  REQUIRE(m.free(2).ok());
  std::vector<TokenId> longer = x;
  longer.push_back(99);
  admit(m, 3, longer);
  // The full group holds x's 4 blocks. The window group's block under hash 40 was cached
  // after block 70, not 30: verification against the full group's block 2 refuses it,
  // and the hit ends at 12, whose window (entries 1, 2) is x's.
  CHECK(*m.match_prefix(3) == 12);
  CHECK(table(m, 3, kWindow) == Blocks{kNoBlock, 1, 2});
  require_valid(m);
}

TEST_CASE("forks, copy-on-write and swapping hold in every group", "[layer_groups]") {
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 16, 8);
  SECTION("a fork shares every held entry; appending copies the shared partial block per group") {
    admit(m, 1, iota_tokens(10));
    allocate(m, 1, 10);
    end_step(m);
    REQUIRE(m.fork(1, 2).ok());
    CHECK(m.device_pool(kWindow).value()->ref_count(2).value() == 2);
    REQUIRE(m.append_tokens(2, std::vector<TokenId>{7}).ok());
    // Token 10 goes into block 2 (2 valid tokens), shared: a new block 3 in each pool.
    CHECK(allocate(m, 2, 1) == Slots{3 * 4 + 2});
    const StepOps ops = m.take_step_ops();
    CHECK(ops.copy_on_write ==
          std::vector<BlockCopy>{{.src = 2, .dst = 3, .num_tokens = 2},
                                 {.src = 2, .dst = 3, .num_tokens = 2, .group = kWindow}});
    // The child's token 10 attends to [5, 10]: its entry 0 is released, the parent's stays.
    CHECK(table(m, 2, kWindow) == Blocks{kNoBlock, 1, 3});
    CHECK(table(m, 1, kWindow) == Blocks{0, 1, 2});
    CHECK(m.stats().cow_copies == 2);
    require_valid(m);
  }
}

TEST_CASE("swapping copies each group's held entries to its own host pool and back",
          "[layer_groups]") {
  KvCacheManager::Options options;
  options.block_size = 4;
  options.layer_groups = {
      {.kind = AttentionKind::kFull, .num_blocks = 16, .num_host_blocks = 8},
      {.kind = AttentionKind::kSlidingWindow, .window = 6, .num_blocks = 8, .num_host_blocks = 4}};
  KvCacheManager m = make_manager(options);
  admit(m, 1, iota_tokens(14));
  allocate(m, 1, 14);
  end_step(m);
  REQUIRE(m.append_tokens(1, std::vector<TokenId>{7}).ok());
  allocate(m, 1, 1);  // releases window entries 0 and 1
  end_step(m);
  REQUIRE(m.preempt(1, PreemptionMode::kSwap).ok());
  // 15 computed tokens: 4 full blocks to the full group's host pool, the 2 held window
  // entries (2, 3) to the window group's.
  CHECK(m.sequence(1, kFull)->host_blocks.size() == 4);
  CHECK(m.sequence(1, kWindow)->host_blocks.size() == 2);
  CHECK(m.sequence(1, kWindow)->first_held_block == 2);
  StepOps ops = m.take_step_ops();
  CHECK(ops.swap_out == std::vector<BlockCopy>{{0, 0, 4, kFull},
                                               {1, 1, 4, kFull},
                                               {2, 2, 4, kFull},
                                               {3, 3, 3, kFull},
                                               {2, 0, 4, kWindow},
                                               {3, 1, 3, kWindow}});
  REQUIRE(m.swap_in(1).ok());
  CHECK(table(m, 1, kWindow).size() == 4);
  CHECK(table(m, 1, kWindow)[0] == kNoBlock);
  ops = m.take_step_ops();
  CHECK(ops.swap_in.size() == 6);
  CHECK(ops.swap_in[4] == BlockCopy{0, table(m, 1, kWindow)[2], 4, kWindow});
  require_valid(m);
}

TEST_CASE("allocation is all or nothing across groups, naming the group that lacks blocks",
          "[layer_groups]") {
  // A window pool of 4 blocks, one of them held by another sequence.
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 16, 4);
  admit(m, 9, iota_tokens(4, 900));
  allocate(m, 9, 4);
  admit(m, 1, iota_tokens(16));
  const Blocks full_queue = m.device_pool(kFull).value()->free_queue_order();
  require_error(m.allocate_slots(1, 16).status(), absl::StatusCode::kResourceExhausted,
                "need 4 blocks in group 1, 3 free of 4");
  CHECK(m.device_pool(kFull).value()->free_queue_order() == full_queue);
  CHECK(table(m, 1, kFull).empty());
  // A prefill that could never fit the window pool at once is refused as such.
  admit(m, 2, iota_tokens(20));
  require_error(m.allocate_slots(2, 20).status(), absl::StatusCode::kInvalidArgument,
                "20 slots need 5 blocks in group 1; the pool has 4");
  REQUIRE(m.free(2).ok());
  // In chunks it fits: tokens 0-7 into window blocks 1 and 2, tokens 8-11 (which attend
  // from token 3: entry 0 stays) into block 3.
  CHECK(allocate(m, 1, 8) == Slots{4, 5, 6, 7, 8, 9, 10, 11});
  end_step(m);
  CHECK(allocate(m, 1, 4) == Slots{12, 13, 14, 15});
  CHECK(table(m, 1, kWindow) == Blocks{1, 2, 3});
  end_step(m);
  // Tokens 12-15 attend from token 7: entry 0 (block 1) is released and, the pool's only
  // free block, taken for entry 3.
  CHECK(allocate(m, 1, 4) == Slots{16, 17, 18, 19});
  CHECK(slots_of(m, kWindow) == Slots{4, 5, 6, 7});
  CHECK(table(m, 1, kWindow) == Blocks{kNoBlock, 2, 3, 1});
  require_valid(m);
}

TEST_CASE("each group's host tier demotes its evicted blocks and promotes the hits it serves",
          "[layer_groups]") {
  KvCacheManager::Options options;
  options.block_size = 4;
  options.enable_host_cache = true;
  options.layer_groups = {
      {.kind = AttentionKind::kFull, .num_blocks = 5, .num_host_blocks = 4},
      {.kind = AttentionKind::kSlidingWindow, .window = 6, .num_blocks = 5, .num_host_blocks = 4}};
  KvCacheManager m = make_manager(options);
  const std::vector<TokenId> prompt = iota_tokens(16);
  admit(m, 1, prompt);
  allocate(m, 1, 16);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // An unrelated prompt evicts all four cached blocks of each pool: demoted, per group.
  admit(m, 3, iota_tokens(20, 900));
  allocate(m, 3, 20);
  StepOps ops = m.take_step_ops();
  REQUIRE(ops.demote.size() == 8);
  CHECK(ops.demote[0].group == kFull);
  CHECK(ops.demote[4].group == kWindow);
  REQUIRE(m.free(3).ok());
  std::vector<TokenId> longer = prompt;
  longer.push_back(7);
  admit(m, 2, longer);
  // The full group finds its 4 blocks in its host tier; the window group needs entries 2
  // and 3 (token 16 attends to [11, 16]) and finds them in its own.
  CHECK(*m.match_prefix(2) == 16);
  CHECK(m.stats().host_hit_tokens == 16);
  CHECK(m.group_stats(kFull)->blocks_promoted == 4);
  CHECK(m.group_stats(kWindow)->blocks_promoted == 2);
  const Blocks window = table(m, 2, kWindow);
  REQUIRE(window.size() == 4);
  CHECK(window[0] == kNoBlock);
  CHECK(window[1] == kNoBlock);
  ops = m.take_step_ops();
  int promoted_into_window = 0;
  for (const BlockCopy& c : ops.promote) promoted_into_window += c.group == kWindow;
  for (const BlockCopy& c : ops.exchange) promoted_into_window += c.group == kWindow;
  CHECK(promoted_into_window == 2);
  require_valid(m);
}

TEST_CASE("partial-block reuse copies the first tokens of a cached block that continues the prompt",
          "[layer_groups][partial_reuse]") {
  KvCacheManager m = make_manager(
      {.block_size = 4, .enable_partial_block_reuse = true, .layer_groups = full_attention(16)});
  admit(m, 1, iota_tokens(12));  // blocks [100-103] [104-107] [108-111]
  allocate(m, 1, 12);
  SECTION("a block written this step is not copied before its K/V exists") {
    admit(m, 2, {100, 101, 102, 103, 104, 105, 7, 7, 7});
    CHECK(*m.match_prefix(2) == 4);
    CHECK(m.stats().partial_hit_tokens == 0);
  }
  end_step(m);
  REQUIRE(m.free(1).ok());
  SECTION("the prompt shares 2 tokens of block 1: they are copied into a new block") {
    admit(m, 2, {100, 101, 102, 103, 104, 105, 7, 7, 7});
    // Block 0 is a full hit; block 1 starts with 104, 105 and then differs.
    CHECK(*m.match_prefix(2) == 6);
    CHECK(table(m, 2) == Blocks{0, 3});  // block 3: the first clean one
    CHECK(m.stats().partial_hit_tokens == 2);
    CHECK(m.stats().prefix_hit_tokens == 6);
    require_valid(m);
    // The copy runs with the step's ops; block 1 is held until then.
    CHECK(m.device_pool().value()->ref_count(1).value() == 1);
    const StepOps ops = m.take_step_ops();
    CHECK(ops.copy_on_write == std::vector<BlockCopy>{{1, 3, 2}});
    CHECK(m.device_pool().value()->ref_count(1).value() == 0);
    // Tokens 6-8 follow in block 3 (offsets 2, 3) and a new block 4.
    CHECK(allocate(m, 2, 3) == Slots{14, 15, 16});
    CHECK(table(m, 2) == Blocks{0, 3, 4});
  }
  SECTION("never the last token") {
    admit(m, 2, {100, 101, 102, 103, 104, 105});
    // At most 5 of 6 tokens: block 0 and token 104.
    CHECK(*m.match_prefix(2) == 5);
    CHECK(m.take_step_ops().copy_on_write == std::vector<BlockCopy>{{1, 3, 1}});
  }
  SECTION("a prompt diverging at the block's first token reuses nothing") {
    admit(m, 2, {100, 101, 102, 103, 9, 9, 9, 9, 9});
    CHECK(*m.match_prefix(2) == 4);
    CHECK(m.take_step_ops().copy_on_write.empty());
  }
}

TEST_CASE("partial-block reuse needs the block in every group", "[layer_groups][partial_reuse]") {
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 16, 7,
                            {.enable_partial_block_reuse = true});
  const std::vector<TokenId> prompt = iota_tokens(16);
  admit(m, 1, prompt);
  allocate(m, 1, 16);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // Window pool: [4, 5, 6 clean | 3, 2, 1, 0 cached]. The prompt below hits blocks 0-2 and
  // continues into the first 3 tokens of block 3 ([112-115]).
  std::vector<TokenId> longer(prompt.begin(), prompt.begin() + 15);
  longer.insert(longer.end(), {7, 7});
  SECTION("both groups hold block 3: 3 tokens are copied in each") {
    admit(m, 2, longer);
    CHECK(*m.match_prefix(2) == 15);
    CHECK(m.take_step_ops().copy_on_write ==
          std::vector<BlockCopy>{{3, 4, 3, kFull}, {3, 4, 3, kWindow}});
    CHECK(table(m, 2, kWindow) == Blocks{kNoBlock, 1, 2, 4});
    require_valid(m);
  }
  SECTION("the window group lost block 3: no partial reuse") {
    admit(m, 3, iota_tokens(16, 900));  // evicts the window pool's block 3
    allocate(m, 3, 16);
    end_step(m);
    admit(m, 2, longer);
    CHECK(*m.match_prefix(2) == 12);
    CHECK(m.stats().partial_hit_tokens == 0);
    CHECK(m.take_step_ops().copy_on_write.empty());
    require_valid(m);
  }
}

// Windowed eviction (docs/allocator.md, "Eviction in windowed groups"). Window of 6 tokens,
// blocks of 4: a hit of p blocks needs windowed entries p - 2 and p - 1.
TEST_CASE("windowed blocks that complete a checkpoint's window outlive the others",
          "[layer_groups][windowed_eviction]") {
  // Checkpoints every 16 tokens (4 blocks): entries 2, 3 (point 4) and 6, 7 (point 8) of a
  // 33-token prompt rank above entries 0, 1, 4, 5. The window pool holds that prompt's 9
  // blocks and nothing more.
  auto run = [](int32_t checkpoint_tokens) {
    KvCacheManager m =
        hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 64, 9,
               {.window_checkpoint_tokens = checkpoint_tokens, .window_checkpoint_levels = 1});
    const std::vector<TokenId> prompt = iota_tokens(33);
    admit(m, 1, prompt);
    allocate(m, 1, 33);
    end_step(m);
    REQUIRE(m.free(1).ok());
    // 17 unrelated tokens take the clean partial block and evict four cached ones.
    admit(m, 2, iota_tokens(17, 5000));
    allocate(m, 2, 17);
    end_step(m);
    REQUIRE(m.free(2).ok());
    CHECK(m.group_stats(kWindow)->evictions == 4);
    // The first 32 tokens again, then others: the full group holds 8 blocks.
    std::vector<TokenId> again(prompt.begin(), prompt.begin() + 32);
    for (TokenId t = 9000; t < 9005; ++t) again.push_back(t);
    REQUIRE(m.add_sequence(3, again).ok());
    absl::StatusOr<int32_t> hit = m.match_prefix(3);
    REQUIRE(hit.ok());
    require_valid(m);
    return *hit;
  };
  // The rule evicts entries 0, 1, 4, 5 and keeps the window of 8 blocks.
  CHECK(run(16) == 32);
  // Without checkpoints the prompt's entries share one class and go least recently
  // released first: 7, 6, 5, 4 (freed tail first); the longest window left is of 4 blocks.
  CHECK(run(0) == 16);
}

TEST_CASE("the window of a match's branch point outlives blocks released after it",
          "[layer_groups][windowed_eviction]") {
  // No checkpoints: a windowed block ranks top if it completes a branch point of the match
  // of the sequence that releases it, else lowest.
  KvCacheManager m =
      hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 64, 12, {.window_checkpoint_tokens = 0});
  const std::vector<TokenId> prompt = iota_tokens(33);
  admit(m, 1, prompt);
  allocate(m, 1, 33);
  end_step(m);
  REQUIRE(m.free(1).ok());
  // A prompt that shares the first 20 tokens hits all 5 blocks (window entries 3 and 4)
  // and releases entries 3 and 4 in the top class.
  std::vector<TokenId> branch(prompt.begin(), prompt.begin() + 20);
  branch.push_back(7000);
  REQUIRE(m.add_sequence(2, branch).ok());
  REQUIRE(*m.match_prefix(2) == 20);
  allocate(m, 2, 1);
  end_step(m);
  REQUIRE(m.free(2).ok());
  // 60 unrelated tokens, a block per step, hold 3 blocks at a time and release the rest
  // behind the window: 15 blocks, the first 4 clean, then 11 evictions. Least recently
  // released first, those would reach entries 4 and 3 after the first prompt's other six;
  // in their class the evictions take the first prompt's six, then five of the new
  // prompt's own released blocks.
  admit(m, 3, iota_tokens(60, 5000));
  for (int32_t k = 0; k < 15; ++k) {
    allocate(m, 3, 4);
    end_step(m);
  }
  CHECK(m.group_stats(kWindow)->evictions == 11);
  REQUIRE(m.free(3).ok());
  // The branch point's window is still there; the 8-block prefix's (entries 6, 7) is not,
  // so a prompt that shares 32 tokens hits the same 20.
  for (const auto& [length, seq] : {std::pair{20, 10}, std::pair{32, 11}}) {
    std::vector<TokenId> again(prompt.begin(), prompt.begin() + length);
    again.push_back(8000);
    REQUIRE(m.add_sequence(seq, again).ok());
    CHECK(*m.match_prefix(seq) == 20);
    REQUIRE(m.free(seq).ok());
  }
  require_valid(m);
}

TEST_CASE("windowed blocks cached after an evicted anchor block are reused first",
          "[layer_groups][windowed_eviction]") {
  // Full pool of 10, window pool of 20. A 33-token prompt caches 8 blocks in each group;
  // 33 unrelated tokens then take the full pool's 2 clean blocks and evict 7 of the
  // prompt's cached ones, freed tail first: 7 down to 1. No hit can verify the window
  // entries cached after them (entries 2 to 7) any more: they become clean.
  KvCacheManager m = hybrid(AttentionKind::kSlidingWindow, /*window=*/6, 10, 20);
  admit(m, 1, iota_tokens(33));
  allocate(m, 1, 33);
  end_step(m);
  REQUIRE(m.free(1).ok());
  CHECK(m.device_pool(kWindow).value()->stats().cached_blocks == 8);
  admit(m, 2, iota_tokens(33, 5000));
  allocate(m, 2, 33);
  CHECK(m.group_stats(kFull)->evictions == 7);
  // Entries 0 and 1 (cached after no block and after block 0) stay; the second prompt
  // cached 8 of its own.
  CHECK(m.device_pool(kWindow).value()->stats().cached_blocks == 2 + 8);
  CHECK(m.group_stats(kWindow)->evictions == 0);
  require_valid(m);
}

}  // namespace
}  // namespace pagedkv
