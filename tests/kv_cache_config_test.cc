// KvCacheConfig (pagedkv/kv_cache_config.h): bytes per token per group, what one sequence
// keeps, and the split of a byte budget into one pool per group. Every expected figure is
// worked out in the comment above it.
#include "pagedkv/kv_cache_config.h"

#include <catch2/catch.hpp>
#include <string>
#include "support/state_models.h"

namespace pagedkv {
namespace {

// Gemma-3-27B: 62 layers, 52 sliding window 1,024 and 10 full, 16 KV heads x 128, bf16.
// One layer's token: 2 (K, V) x 16 x 128 x 2 bytes = 8,192 bytes.
const KvCacheConfig kGemma3{
    .groups = {{.kind = AttentionKind::kSlidingWindow,
                .window = 1024,
                .shape = {.num_layers = 52, .num_kv_heads = 16, .head_dim = 128}},
               {.kind = AttentionKind::kFull,
                .shape = {.num_layers = 10, .num_kv_heads = 16, .head_dim = 128}}},
    .dtype = DType::kBFloat16,
    .block_size = 16};

// Llama-4-Scout: 48 layers, 36 chunked local (chunk 8,192) and 12 full, 8 KV heads x 128.
// One layer's token: 2 x 8 x 128 x 2 = 4,096 bytes.
const KvCacheConfig kScout{
    .groups = {{.kind = AttentionKind::kChunkedLocal,
                .window = 8192,
                .shape = {.num_layers = 36, .num_kv_heads = 8, .head_dim = 128}},
               {.kind = AttentionKind::kFull,
                .shape = {.num_layers = 12, .num_kv_heads = 8, .head_dim = 128}}},
    .dtype = DType::kBFloat16,
    .block_size = 16};

const KvCacheConfig kLlama31_8B{
    .groups = {{.shape = {.num_layers = 32, .num_kv_heads = 8, .head_dim = 128}}},
    .dtype = DType::kBFloat16,
    .block_size = 16};

void expect_invalid(const absl::Status& s, const std::string& fragment) {
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find(fragment) != std::string::npos);
}

TEST_CASE("bytes per token and per page are each group's own layers", "[kv_cache_config]") {
  REQUIRE(kGemma3.validate().ok());
  CHECK(kGemma3.num_layers() == 62);
  CHECK(kGemma3.bytes_per_token(0) == 425984);  // 52 x 8,192
  CHECK(kGemma3.bytes_per_token(1) == 81920);   // 10 x 8,192
  CHECK(kGemma3.bytes_per_token() == 507904);   // 62 x 8,192
  CHECK(kGemma3.page_bytes(0) == 6815744);      // 16 tokens x 425,984
  CHECK(kGemma3.page_bytes(1) == 1310720);      // 16 x 81,920
  // The config's dtype applies to every group, whatever the shape says.
  KvCacheConfig fp8 = kGemma3;
  fp8.dtype = DType::kFloat8E4M3;
  fp8.groups[0].shape.dtype = DType::kFloat32;
  CHECK(fp8.bytes_per_token(0) == 212992);  // 52 x 2 x 16 x 128 x 1
  CHECK(kLlama31_8B.bytes_per_token() == 131072);
}

TEST_CASE("an MLA group is sized by its latent vector", "[kv_cache_config]") {
  // DeepSeek-V3: 61 layers x (512 + 64) x 2 bytes = 70,272 bytes per token.
  const KvCacheConfig mla{
      .groups = {
          {.shape = {.num_layers = 61, .num_kv_heads = 1, .head_dim = 576, .latent = true}}}};
  REQUIRE(mla.validate().ok());
  CHECK(mla.bytes_per_token() == 70272);
  CHECK(mla.page_bytes(0) == 1124352);
}

TEST_CASE("the analytic minimum counts the tokens the last token attends to", "[kv_cache_config]") {
  CHECK(kGemma3.tokens_attended(0, 32768) == 1024);
  CHECK(kGemma3.tokens_attended(1, 32768) == 32768);
  CHECK(kGemma3.tokens_attended(0, 100) == 100);
  CHECK(kGemma3.tokens_attended(0, 0) == 0);
  // 1,024 x 425,984 + 32,768 x 81,920 = 436,207,616 + 2,684,354,560.
  CHECK(kGemma3.min_bytes_per_sequence(32768) == 3120562176);
  // Chunked: position L - 1 attends to its own chunk, (L - 1) % 8,192 + 1 tokens.
  CHECK(kScout.tokens_attended(0, 8192) == 8192);
  CHECK(kScout.tokens_attended(0, 8193) == 1);
  CHECK(kScout.tokens_attended(0, 10000) == 1808);
}

TEST_CASE("a Gemma-3-27B sequence of 32K tokens holds at most 1.02x the minimum",
          "[kv_cache_config]") {
  // Held at 32,768: sliding keeps blocks 31,744 / 16 = 1,984 .. 32,767 / 16 = 2,047, 64
  // blocks = exactly the window; full keeps 2,048 blocks. Held == minimum.
  CHECK(kGemma3.blocks_held(0, 32768) == 64);
  CHECK(kGemma3.blocks_held(1, 32768) == 2048);
  CHECK(kGemma3.held_bytes_per_sequence(32768) == 3120562176);
  // At 32,770 the window 31,746 .. 32,769 straddles blocks 1,984 .. 2,048 (65) and the full
  // group needs ceil(32,770 / 16) = 2,049: 65 x 6,815,744 + 2,049 x 1,310,720 =
  // 3,128,688,640 against 1,024 x 425,984 + 32,770 x 81,920 = 3,120,726,016 (1.0026x).
  CHECK(kGemma3.held_bytes_per_sequence(32770) == 3128688640);
  CHECK(kGemma3.min_bytes_per_sequence(32770) == 3120726016);
  // What the split sets aside per sequence: sliding ceil(min(32,768, 1,023 + 16) / 16) + 1
  // = 65 + 1 = 66 blocks; full 2,048. 66 x 6,815,744 + 2,048 x 1,310,720 = 3,134,193,664,
  // 1.0044x the minimum.
  CHECK(kGemma3.blocks_per_sequence(0, 32768) == 66);
  CHECK(kGemma3.blocks_per_sequence(1, 32768) == 2048);
  CHECK(kGemma3.reserved_bytes_per_sequence(32768) == 3134193664);
  for (const int64_t tokens : {32768, 32770, 32783}) {
    INFO("tokens " << tokens);
    const double min = static_cast<double>(kGemma3.min_bytes_per_sequence(tokens));
    CHECK(static_cast<double>(kGemma3.held_bytes_per_sequence(tokens)) <= 1.02 * min);
    CHECK(static_cast<double>(kGemma3.reserved_bytes_per_sequence(tokens)) <= 1.02 * min);
  }
}

TEST_CASE("a windowed group never sets aside more than the sequence's blocks",
          "[kv_cache_config]") {
  // 100 tokens: 7 blocks; the window rule's ceil(100 / 16) + 1 = 8 is capped at 7.
  CHECK(kGemma3.blocks_per_sequence(0, 100) == 7);
  CHECK(kGemma3.blocks_held(0, 100) == 7);
  // Chunked at 10,000 tokens: chunk 8,192 .. 9,999 is blocks 512 .. 624 (113) held;
  // set aside ceil(8,192 / 16) + 1 = 513.
  CHECK(kScout.blocks_held(0, 10000) == 113);
  CHECK(kScout.blocks_per_sequence(0, 10000) == 513);
  CHECK(kScout.blocks_per_sequence(1, 10000) == 625);
  CHECK(kScout.blocks_per_sequence(0, 0) == 0);
}

TEST_CASE("a budget is split in proportion to one target-length sequence", "[kv_cache_config]") {
  // 64 GiB = 68,719,476,736 bytes at 32,768 tokens; demand 449,839,104 (sliding) and
  // 2,684,354,560 (full) of 3,134,193,664.
  // Sliding: 68,719,476,736 x 449,839,104 / 3,134,193,664 = 9,863,049,688 bytes
  //   / 6,815,744 = 1,447.1 -> 1,447 blocks.
  // Full: 58,856,427,047 bytes / 1,310,720 = 44,903.9 -> 44,903 blocks.
  // Used 1,447 x 6,815,744 + 44,903 x 1,310,720 = 68,717,641,728; lost 1,835,008 bytes.
  absl::StatusOr<PoolSplit> split = kGemma3.split_budget(int64_t{64} << 30, 32768);
  REQUIRE(split.ok());
  REQUIRE(split->groups.size() == 2);
  CHECK(split->groups[0].kind == AttentionKind::kSlidingWindow);
  CHECK(split->groups[0].window == 1024);
  CHECK(split->groups[0].num_blocks == 1447);
  CHECK(split->groups[1].kind == AttentionKind::kFull);
  CHECK(split->groups[1].num_blocks == 44903);
  CHECK(split->pool_bytes[0] == 1447 * int64_t{6815744});
  CHECK(split->used_bytes == 68717641728);
  CHECK(split->lost_bytes == 1835008);
  CHECK(split->target_tokens == 32768);
  // Both pools hold 21 target-length sequences (1,447 / 66 and 44,903 / 2,048).
  CHECK(kGemma3.max_sequences(*split, 32768) == 21);
  // Shorter sequences: the sliding pool, sized for the target, runs out first
  // (1,447 / ceil(1,039 / 16) + 1 = 21 against 44,903 / 256 = 175).
  CHECK(kGemma3.max_sequences(*split, 4096) == 21);
  // Longer: the full pool does (44,903 / 8,192 = 5).
  CHECK(kGemma3.max_sequences(*split, 131072) == 5);
}

TEST_CASE(
    "a split that counts the prefix cache gives the windowed pools what the full ones "
    "cannot use",
    "[kv_cache_config]") {
  // 64 GiB at 32,768 tokens, 262,144 cached tokens (16,384 blocks). The full group's
  // proportional share, 44,903 blocks, exceeds what it can use: 16,384 + 2,048 = 18,432
  // blocks (24,159,191,040 bytes). The sliding group's cap, 16,384 + 66 blocks, is above
  // the rest, 44,560,285,696 bytes / 6,815,744 = 6,537.8 -> 6,537 blocks (against 1,447
  // without the cache). Lost: 5,767,168 bytes.
  absl::StatusOr<PoolSplit> split = kGemma3.split_budget(int64_t{64} << 30, 32768, 262144);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 6537);
  CHECK(split->groups[1].num_blocks == 18432);
  CHECK(split->lost_bytes == 5767168);
  CHECK(split->cached_tokens == 262144);
  // 9 sequences of 32,768 fit (18,432 / 2,048 = 9; 6,537 / 66 = 99), against 21.
  CHECK(kGemma3.max_sequences(*split, 32768) == 9);

  // 1,600 cached tokens (100 blocks): both groups reach their caps, 166 and 2,148 blocks
  // (1,131,413,504 and 2,815,426,560 bytes); the other 64,772,636,672 bytes are shared in
  // proportion: sliding 1,131,413,504 + 9,296,574,483 = 10,427,987,987 bytes -> 1,529
  // blocks, full 58,291,488,748 bytes -> 44,472 blocks.
  split = kGemma3.split_budget(int64_t{64} << 30, 32768, 1600);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 1529);
  CHECK(split->groups[1].num_blocks == 44472);

  // A budget below what the full group can use: the proportional split, unchanged.
  split = kGemma3.split_budget(int64_t{64} << 30, 32768, int64_t{1} << 30);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 1447);
  CHECK(split->groups[1].num_blocks == 44903);

  expect_invalid(kGemma3.split_budget(int64_t{1} << 30, 4096, -1).status(),
                 "cached_tokens is -1, must be in [0, 2^50]");
}

TEST_CASE("one group takes the whole budget in whole pages", "[kv_cache_config]") {
  // 8 GiB / 2,097,152-byte pages = 4,096 blocks, nothing lost; 16 sequences of 4,096.
  absl::StatusOr<PoolSplit> split = kLlama31_8B.split_budget(int64_t{8} << 30, 4096);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 4096);
  CHECK(split->lost_bytes == 0);
  CHECK(kLlama31_8B.max_sequences(*split, 4096) == 16);
  // A remainder below one page is the only loss.
  split = kLlama31_8B.split_budget((int64_t{8} << 30) + 2097151, 4096);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 4096);
  CHECK(split->lost_bytes == 2097151);
}

TEST_CASE("split_budget refuses what it cannot split, naming the value and the limit",
          "[kv_cache_config]") {
  expect_invalid(kGemma3.split_budget(-1, 32768).status(), "budget is -1 bytes");
  expect_invalid(kGemma3.split_budget((int64_t{1} << 50) + 1, 32768).status(), "[0, 2^50]");
  expect_invalid(kGemma3.split_budget(int64_t{1} << 30, 0).status(), "target length is 0");
  // 7 MiB at 32,768: the sliding group's share is 7,340,032 x 449,839,104 / 3,134,193,664 =
  // 1,053,487 bytes, less than its 6,815,744-byte page.
  expect_invalid(kGemma3.split_budget(7 << 20, 32768).status(),
                 "gives group 0 (sliding_window 1024, 52 layers) 1053487 bytes, less than one "
                 "page of 6815744 bytes");
}

using testing::kNemotronH;  // support/state_models.h

TEST_CASE("a state group costs one slot per sequence, whatever its length", "[kv_cache_config]") {
  REQUIRE(kNemotronH.validate().ok());
  CHECK(kNemotronH.num_layers() == 28);
  CHECK(kNemotronH.num_layers(0) == 24);
  CHECK(kNemotronH.bytes_per_token(0) == 0);      // the state does not grow with tokens
  CHECK(kNemotronH.bytes_per_token(1) == 16384);  // 4 x 4,096
  CHECK(kNemotronH.bytes_per_token() == 16384);
  CHECK(kNemotronH.page_bytes(0) == 102137856);  // one slot
  CHECK(kNemotronH.page_bytes(1) == 262144);     // 16 x 16,384
  // 8,192 tokens: the slot and 8,192 x 16,384 = 134,217,728 bytes of the full layers, in 512
  // whole blocks: 236,355,584 bytes, minimum, held and set aside alike.
  CHECK(kNemotronH.min_bytes_per_sequence(8192) == 236355584);
  CHECK(kNemotronH.held_bytes_per_sequence(8192) == 236355584);
  CHECK(kNemotronH.reserved_bytes_per_sequence(8192) == 236355584);
  // One token more: a 513th block (+262,144); the slot is the same.
  CHECK(kNemotronH.held_bytes_per_sequence(8193) == 236617728);
  CHECK(kNemotronH.min_bytes_per_sequence(1) == 102137856 + 16384);
  CHECK(kNemotronH.min_bytes_per_sequence(0) == 0);
  CHECK(kNemotronH.blocks_held(0, 100000) == 1);
  CHECK(kNemotronH.blocks_per_sequence(0, 8192) == 1);
  // The split counts the running slot and two checkpoints.
  CHECK(kNemotronH.split_pages_per_sequence(0, 8192) == 3);
  CHECK(kNemotronH.split_pages_per_sequence(1, 8192) == 512);
}

TEST_CASE("a state group's pool gets a running slot and checkpoints per sequence",
          "[kv_cache_config]") {
  constexpr int64_t kBudget = int64_t{64} << 30;  // 68,719,476,736
  // Demand per 8,192-token sequence: state 3 x 102,137,856 = 306,413,568, full 512 x
  // 262,144 = 134,217,728; 440,631,296 in all.
  // State: 68,719,476,736 x 306,413,568 / 440,631,296 = 47,787,300,286 -> 467 slots.
  // Full: 68,719,476,736 x 134,217,728 / 440,631,296 = 20,932,176,449 -> 79,849 blocks.
  absl::StatusOr<PoolSplit> split = kNemotronH.split_budget(kBudget, 8192);
  REQUIRE(split.ok());
  CHECK(split->groups[0].kind == AttentionKind::kState);
  CHECK(split->groups[0].num_blocks == 467);
  CHECK(split->groups[1].num_blocks == 79849);
  CHECK(split->pool_bytes[0] == 467 * int64_t{102137856});
  // Lost: 88,921,534 below a slot and 240,193 below a page.
  CHECK(split->lost_bytes == 89161728);
  // 79,849 / 512 = 155 sequences of 8K at once; the state pool holds their 155 running slots
  // and 312 checkpoints (2 each, and 2 more).
  CHECK(kNemotronH.max_sequences(*split, 8192) == 155);

  // No checkpoints: the state pool shrinks to a slot per sequence. Demand 102,137,856 +
  // 134,217,728 = 236,355,584; state 68,719,476,736 x 102,137,856 / 236,355,584 =
  // 29,696,188,685 bytes -> 290 slots; full 148,862 blocks, 290 sequences of 512.
  KvCacheConfig no_checkpoints = kNemotronH;
  no_checkpoints.checkpoints_per_sequence = 0;
  split = no_checkpoints.split_budget(kBudget, 8192);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 290);
  CHECK(kNemotronH.max_sequences(*split, 8192) == 290);
}

TEST_CASE("with cached tokens a state pool caps at a checkpoint per cached block",
          "[kv_cache_config]") {
  constexpr int64_t kBudget = int64_t{64} << 30;
  // 1,048,576 cached tokens = 65,536 blocks. Full cap (65,536 + 512) x 262,144 =
  // 17,314,086,912 bytes, below its proportional 20,932,176,449: capped at 66,048 blocks.
  // State cap (65,536 + 3) slots = 6.69e12 bytes, beyond the budget: it takes the rest,
  // 68,719,476,736 - 17,314,086,912 = 51,405,389,824 bytes -> 503 slots (30,048,256 lost).
  absl::StatusOr<PoolSplit> split = kNemotronH.split_budget(kBudget, 8192, 1048576);
  REQUIRE(split.ok());
  CHECK(split->groups[1].num_blocks == 66048);
  CHECK(split->groups[0].num_blocks == 503);
  CHECK(split->lost_bytes == 30048256);
  // 32 cached tokens = 2 blocks: state cap (2 + 3) slots = 510,689,280 bytes, full cap
  // (2 + 512) x 262,144 = 134,742,016 bytes. 1 GiB proportionally gives state
  // 1,073,741,824 x 306,413,568 / 440,631,296 = 746,676,566 bytes, above its cap: capped,
  // leaving 563,052,544; full then 563,052,544 x 134,217,728 / 440,631,296 = 171,505,... bytes,
  // above its cap too. The rest, 1,073,741,824 - 510,689,280 - 134,742,016 = 428,310,528
  // bytes, is shared in proportion again: state + 297,845,746 = 808,535,026 bytes = 7 slots;
  // full + 130,464,781 = 265,206,797 bytes = 1,011 blocks.
  split = kNemotronH.split_budget(int64_t{1} << 30, 8192, 32);
  REQUIRE(split.ok());
  CHECK(split->groups[0].num_blocks == 7);
  CHECK(split->groups[1].num_blocks == 1011);
}

TEST_CASE("a state group is refused by the field that is wrong", "[kv_cache_config]") {
  KvCacheConfig c = kNemotronH;
  c.groups[0].window = 4;
  expect_invalid(c.validate(), "group 0 is state with window 4; a state group takes window 0");
  c = kNemotronH;
  c.groups[0].state.num_layers = 0;
  expect_invalid(c.validate(), "group 0: state.num_layers is 0, must be at least 1");
  c = kNemotronH;
  c.groups[0].state.conv_elements = 0;
  c.groups[0].state.recurrent_elements = 0;
  expect_invalid(c.validate(), "state.conv_elements is 0 and state.recurrent_elements is 0");
  c.groups[0].state.conv_elements = -1;
  c.groups[0].state.recurrent_elements = 5;
  expect_invalid(c.validate(), "state.conv_elements is -1");
  c = kNemotronH;
  c.groups[0].state.recurrent_elements = int64_t{1} << 37;
  expect_invalid(c.validate(), "more than 2^40 bytes");
  c = kNemotronH;
  c.groups.pop_back();
  expect_invalid(c.validate(), "only state groups; a prefix hit is verified along an attention");
  c = kNemotronH;
  c.checkpoints_per_sequence = -1;
  expect_invalid(c.validate(), "checkpoints_per_sequence is -1, must be at least 0");
  // The state group's unused shape is not validated.
  c = kNemotronH;
  c.groups[0].shape.num_layers = 0;
  CHECK(c.validate().ok());
  // A budget below a slot names the slot: 2^26 x 306,413,568 / 440,631,296 = 46,667,285.
  expect_invalid(kNemotronH.split_budget(int64_t{1} << 26, 8192).status(),
                 "gives group 0 (state, 24 layers) 46667285 bytes, less than one state slot of "
                 "102137856 bytes");
}

TEST_CASE("validate names the group and the field", "[kv_cache_config]") {
  expect_invalid(KvCacheConfig{}.validate(), "no layer groups");
  KvCacheConfig c = kGemma3;
  c.groups[1].window = 4;
  expect_invalid(c.validate(), "group 1 is full attention with window 4");
  c = kGemma3;
  c.groups[0].window = 0;
  expect_invalid(c.validate(), "group 0 is sliding_window with window 0");
  c = kScout;
  c.groups[0].window = -3;
  expect_invalid(c.validate(), "group 0 is chunked_local with window -3");
  c = kGemma3;
  c.groups[1].shape.num_layers = 0;
  expect_invalid(c.validate(), "group 1: KvCacheSpec: num_layers is 0");
  c = kGemma3;
  c.groups[0].shape.latent = true;
  expect_invalid(c.validate(), "group 0: KvCacheSpec: a latent (MLA) spec has num_kv_heads 16");
  c = kGemma3;
  c.block_size = 0;
  expect_invalid(c.split_budget(int64_t{1} << 30, 4096).status(), "block_size is 0");
}

}  // namespace
}  // namespace pagedkv
