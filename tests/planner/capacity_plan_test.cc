// capacity_plan.h: pagedkv's pools, sequences that fit, and vLLM's grouping waste beside
// them, for the seven fixtures at a 64 GiB budget and 32,768-token sequences (bf16 KV).
// Every expected figure is worked out in the comment above it. The models are read from
// their fixture excerpts (fixtures.h).
#include "pagedkv/capacity_plan.h"

#include <catch2/catch.hpp>
#include <string>

#include "nlohmann/json.hpp"
#include "planner/fixtures.h"
#include "support/state_models.h"

namespace pagedkv {
namespace {

constexpr int64_t kBudget = int64_t{64} << 30;  // 68,719,476,736 bytes
constexpr int64_t kTarget = 32768;

std::optional<CapacityPlan> plan_fixture(const std::string& name, PlanOptions options = {}) {
  const std::string path = testing::fixture_excerpt(name);
  // gpt-oss names no torch_dtype; every fixture is planned with bf16 KV.
  absl::StatusOr<HfModelConfig> model = read_hf_config(path, {.kv_dtype = DType::kBFloat16});
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  if (options.budget_bytes == 0) options.budget_bytes = kBudget;
  if (options.target_tokens == 0) options.target_tokens = kTarget;
  if (options.max_model_len == 0 && model->max_position_embeddings < kTarget) {
    options.max_model_len = kTarget;
  }
  absl::StatusOr<CapacityPlan> plan = plan_capacity(*model, options);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  return *plan;
}

const LengthPlan& at(const CapacityPlan& plan, int64_t tokens) {
  for (const LengthPlan& l : plan.lengths) {
    if (l.tokens == tokens) return l;
  }
  FAIL("no length " << tokens);
  return plan.lengths.front();
}

// The done-when bound: pagedkv loses at most 2% of the budget to padding and grouping.
void check_waste_bound(const CapacityPlan& plan) {
  CHECK(plan.padding_bytes == 0);
  CHECK(plan.waste_fraction <= 0.02);
  CHECK(plan.split.lost_bytes >= 0);
  int64_t pages = 0;
  for (const GroupPlan& g : plan.groups) pages += g.page_bytes;
  CHECK(plan.split.lost_bytes < pages);  // each pool's remainder is below one page
}

TEST_CASE("Llama-3.1-8B: 32,768 blocks, 16 sequences of 32K, no waste on either side",
          "[planner]") {
  std::optional<CapacityPlan> plan =
      plan_fixture("meta-llama--Llama-3.1-8B", {.lengths = {4096, kTarget}});
  // 64 GiB / (16 x 131,072 = 2,097,152-byte pages) = 32,768 blocks exactly.
  REQUIRE(plan->groups.size() == 1);
  CHECK(plan->groups[0].num_blocks == 32768);
  CHECK(plan->split.lost_bytes == 0);
  check_waste_bound(*plan);
  // 32,768 blocks / 256 per 4K sequence = 128; / 2,048 per 32K sequence = 16.
  CHECK(at(*plan, 4096).sequences == 128);
  CHECK(at(*plan, kTarget).sequences == 16);
  // vLLM: one spec for all layers, one group, the same pool.
  CHECK(plan->vllm.rule == "uniform_spec");
  CHECK(plan->vllm.num_blocks == 32768);
  CHECK(plan->vllm.waste_fraction == 0);
  CHECK(at(*plan, kTarget).vllm_sequences == 16);
}

TEST_CASE("Llama-3.1-70B and Qwen3-8B: one full group, remainders only", "[planner]") {
  std::optional<CapacityPlan> plan = plan_fixture("meta-llama--Llama-3.1-70B");
  // Pages of 16 x 327,680 = 5,242,880 bytes: 68,719,476,736 / 5,242,880 = 13,107.2 ->
  // 13,107 blocks, 1,048,576 bytes lost; 13,107 / 2,048 = 6 sequences of 32K.
  CHECK(plan->groups[0].num_blocks == 13107);
  CHECK(plan->split.lost_bytes == 1048576);
  CHECK(at(*plan, kTarget).sequences == 6);
  check_waste_bound(*plan);
  CHECK(plan->vllm.waste_fraction == 0);

  plan = plan_fixture("Qwen--Qwen3-8B");
  // max_position_embeddings is 40,960. Pages of 16 x 147,456 = 2,359,296 bytes:
  // 29,127.1 -> 29,127 blocks, 262,144 bytes lost; 29,127 / 2,048 = 14 sequences of 32K.
  CHECK(plan->max_model_len == 40960);
  CHECK(plan->groups[0].num_blocks == 29127);
  CHECK(plan->split.lost_bytes == 262144);
  CHECK(at(*plan, kTarget).sequences == 14);
  check_waste_bound(*plan);
}

TEST_CASE("Gemma-3-27B: no padding for pagedkv, 2.16% for vLLM, 32K at 1.0x the minimum",
          "[planner]") {
  std::optional<CapacityPlan> plan =
      plan_fixture("google--gemma-3-27b-it", {.lengths = {4096, kTarget, 32770}});
  // Pools as tests/kv_cache_config_test.cc works out: 1,447 sliding blocks of 6,815,744
  // bytes and 44,903 full blocks of 1,310,720; 1,835,008 bytes lost (0.0027%).
  REQUIRE(plan->groups.size() == 2);
  CHECK(plan->groups[0].bytes_per_token == 425984);
  CHECK(plan->groups[1].bytes_per_token == 81920);
  CHECK(plan->groups[0].num_blocks == 1447);
  CHECK(plan->groups[1].num_blocks == 44903);
  CHECK(plan->groups[0].blocks_per_sequence == 66);
  CHECK(plan->split.lost_bytes == 1835008);
  check_waste_bound(*plan);
  CHECK(at(*plan, kTarget).sequences == 21);  // 1,447 / 66 and 44,903 / 2,048

  // The done-when check: one 32K sequence holds at most 1.02x the analytic minimum.
  // Minimum 1,024 x 425,984 + 32,768 x 81,920 = 3,120,562,176 bytes; held the same (the
  // window is 64 whole blocks), set aside 66 x 6,815,744 + 2,048 x 1,310,720 =
  // 3,134,193,664 (1.0044x).
  const LengthPlan& l = at(*plan, kTarget);
  CHECK(l.min_bytes == 3120562176);
  CHECK(l.held_bytes == 3120562176);
  CHECK(l.reserved_bytes == 3134193664);
  CHECK(static_cast<double>(l.held_bytes) <= 1.02 * static_cast<double>(l.min_bytes));
  CHECK(static_cast<double>(l.reserved_bytes) <= 1.02 * static_cast<double>(l.min_bytes));
  const LengthPlan& straddling = at(*plan, 32770);
  CHECK(static_cast<double>(straddling.held_bytes) <=
        1.02 * static_cast<double>(straddling.min_bytes));
  // 64 GiB / 3,120,562,176 = 22.02: the minimum would fit 22.
  CHECK(l.ideal_sequences == 22);

  // vLLM (_get_kv_cache_groups_uniform_page_size): 52 sliding and 10 full layers, one page
  // size (16 x 16 x 128 x 2 x 2 = 131,072 bytes per layer). 52 >= 1.5 x 10, so group_size
  // is 10: the sliding layers make ceil(52 / 10) = 6 groups, layers[i::6] giving 9, 9, 9,
  // 9, 8, 8 real layers, 60 - 52 = 8 padding layers; the full layers one group of 10.
  const VllmGrouping& v = plan->vllm;
  CHECK(v.rule == "uniform_page_size");
  CHECK(v.group_size == 10);
  CHECK(v.padding_layers == 8);
  REQUIRE(v.groups.size() == 7);
  CHECK(v.groups[0].num_layers == 9);
  CHECK(v.groups[4].num_layers == 8);
  CHECK(v.groups[6].num_layers == 10);
  CHECK(v.page_bytes == 131072);
  // One block spans 10 layers' pages: 1,310,720 bytes; 64 GiB holds 52,428 of them.
  CHECK(v.block_bytes == 1310720);
  CHECK(v.num_blocks == 52428);
  // A 32K sequence takes 66 blocks in each sliding group and 2,048 in the full one:
  // 6 x 66 + 2,048 = 2,444 blocks, of whose pages 66 x (1 + 1 + 1 + 1 + 2 + 2) = 528 are
  // padding. Filled with such sequences, the pool's padding is
  // 52,428 x 131,072 x 528 / 2,444 = 1,484,587,973 bytes, 2.16% of the budget.
  CHECK(v.padding_bytes == 1484587973);
  CHECK(v.waste_fraction == Approx(0.0216036).epsilon(1e-5));
  CHECK(v.waste_fraction > plan->waste_fraction);
  // 52,428 / 2,444 = 21 sequences of 32K in vLLM's pool as in ours.
  CHECK(l.vllm_sequences == 21);
  // At 4K the split made for 32K runs short of sliding blocks (1,447 / 66 = 21), where
  // vLLM's shared pool takes 52,428 / (6 x 66 + 256) = 80: the static split's price.
  CHECK(at(*plan, 4096).sequences == 21);
  CHECK(at(*plan, 4096).vllm_sequences == 80);
}

TEST_CASE("Gemma-3-27B split for 4K sequences holds as many as vLLM at 4K", "[planner]") {
  std::optional<CapacityPlan> plan =
      plan_fixture("google--gemma-3-27b-it", {.target_tokens = 4096, .lengths = {4096}});
  // Demand per 4K sequence: 66 x 6,815,744 = 449,839,104 (sliding) and 256 x 1,310,720 =
  // 335,544,320 (full). Sliding pool 64 GiB x 449,839,104 / 785,383,424 = 39,360,020,720
  // bytes = 5,774 blocks; full 29,359,456,015 bytes = 22,399 blocks. 5,774 / 66 = 87 and
  // 22,399 / 256 = 87 sequences, against vLLM's 80 (its padding is 8.1% at 4K:
  // 66 x 8 / (6 x 66 + 256) / 10).
  CHECK(plan->groups[0].num_blocks == 5774);
  CHECK(plan->groups[1].num_blocks == 22399);
  CHECK(at(*plan, 4096).sequences == 87);
  CHECK(at(*plan, 4096).vllm_sequences == 80);
  CHECK(plan->vllm.waste_fraction == Approx(0.080980).epsilon(1e-4));
  check_waste_bound(*plan);
}

TEST_CASE("gpt-oss-120b: 18 + 18 layers, vLLM groups them without padding", "[planner]") {
  std::optional<CapacityPlan> plan = plan_fixture("openai--gpt-oss-120b");
  // Pages of 16 x 36,864 = 589,824 bytes in both pools. Per 32K sequence: sliding
  // ceil(min(32,768, 127 + 16) / 16) + 1 = 10 blocks, full 2,048. Shares: 64 GiB x 10 /
  // 2,058 = 333,913,881 bytes -> 566 blocks; 64 GiB x 2,048 / 2,058 -> 115,942 blocks;
  // 262,144 bytes lost. 566 / 10 = 56 and 115,942 / 2,048 = 56 sequences.
  CHECK(plan->groups[0].group.window == 128);
  CHECK(plan->groups[0].num_blocks == 566);
  CHECK(plan->groups[1].num_blocks == 115942);
  CHECK(plan->split.lost_bytes == 262144);
  CHECK(at(*plan, kTarget).sequences == 56);
  check_waste_bound(*plan);
  // vLLM: 18 and 18 layers, group_size 18, two groups, no padding.
  CHECK(plan->vllm.rule == "uniform_page_size");
  CHECK(plan->vllm.group_size == 18);
  CHECK(plan->vllm.groups.size() == 2);
  CHECK(plan->vllm.padding_layers == 0);
  CHECK(plan->vllm.waste_fraction == 0);
}

TEST_CASE("Llama-4-Scout: 36 chunked + 12 full, vLLM's 4 groups of 12 need no padding",
          "[planner]") {
  std::optional<CapacityPlan> plan = plan_fixture("meta-llama--Llama-4-Scout-17B-16E-Instruct");
  // Pages: 16 x 147,456 = 2,359,296 (chunked) and 16 x 49,152 = 786,432 (full). Per 32K
  // sequence: chunked ceil(8,192 / 16) + 1 = 513 blocks, full 2,048. Demand 1,210,318,848
  // and 1,610,612,736 bytes: chunked pool 29,484,046,472 bytes -> 12,496 blocks, full
  // 39,235,430,263 -> 49,890; 2,621,440 bytes lost. 12,496 / 513 = 24, 49,890 / 2,048 = 24.
  CHECK(plan->groups[0].num_blocks == 12496);
  CHECK(plan->groups[1].num_blocks == 49890);
  CHECK(plan->split.lost_bytes == 2621440);
  CHECK(at(*plan, kTarget).sequences == 24);
  check_waste_bound(*plan);
  CHECK(plan->vllm.group_size == 12);
  CHECK(plan->vllm.groups.size() == 4);
  CHECK(plan->vllm.padding_layers == 0);
  CHECK(plan->vllm.waste_fraction == 0);
}

TEST_CASE("DeepSeek-V3: 61,119 latent blocks of 1,124,352 bytes", "[planner]") {
  std::optional<CapacityPlan> plan = plan_fixture("deepseek-ai--DeepSeek-V3");
  // 64 GiB / (16 x 70,272 = 1,124,352) = 61,119.2 -> 61,119 blocks, 206,848 bytes lost;
  // 61,119 / 2,048 = 29 sequences of 32K.
  CHECK(plan->groups[0].bytes_per_token == 70272);
  CHECK(plan->groups[0].num_blocks == 61119);
  CHECK(plan->split.lost_bytes == 206848);
  CHECK(at(*plan, kTarget).sequences == 29);
  check_waste_bound(*plan);
  CHECK(plan->vllm.rule == "uniform_spec");
  CHECK(plan->vllm.waste_fraction == 0);
}

// --- vLLM's rule on configs of its other branches ----------------------------------------------

KvCacheGroup group(AttentionKind kind, int32_t window, int32_t layers, int32_t head_dim = 128) {
  return {.kind = kind,
          .window = window,
          .shape = {.num_layers = layers, .num_kv_heads = 8, .head_dim = head_dim}};
}

TEST_CASE("vLLM pads to the larger type when it is below 1.5x the smaller", "[planner]") {
  // gpt-oss-20b + an EAGLE drafter's extra full layer (kv_cache_utils.py's own example):
  // 12 sliding + 13 full; 13 < 1.5 x 12, so group_size 13 and one sliding padding layer.
  const KvCacheConfig c{.groups = {group(AttentionKind::kSlidingWindow, 128, 12),
                                   group(AttentionKind::kFull, 0, 13)}};
  const VllmGrouping v = vllm_grouping(c, kBudget, 4096);
  CHECK(v.group_size == 13);
  CHECK(v.padding_layers == 1);
  REQUIRE(v.groups.size() == 2);
  CHECK(v.groups[0].num_layers == 12);
  // Pages of 16 x 2 x 8 x 128 x 2 = 65,536 bytes per layer. Blocks per 4K sequence:
  // sliding ceil(143 / 16) + 1 = 10, full 256; padding pages 10 x 1 of 266 x 13.
  // 64 GiB / (13 x 65,536) = 80,659 blocks; 80,659 x 65,536 x 10 / 266 = 198,724,369 bytes.
  CHECK(v.num_blocks == 80659);
  CHECK(v.padding_bytes == 198724369);
}

TEST_CASE("vLLM scales block sizes to one page size, or cannot group", "[planner]") {
  // Sliding layers with head_dim 64 have half the page of full layers with 128: their
  // block size doubles to 32 tokens (unify_kv_cache_spec_page_size).
  KvCacheConfig c{.groups = {group(AttentionKind::kSlidingWindow, 1024, 20, 64),
                             group(AttentionKind::kFull, 0, 10)}};
  VllmGrouping v = vllm_grouping(c, kBudget, 4096);
  CHECK(v.rule == "uniform_page_size");
  REQUIRE(v.groups.size() == 3);
  CHECK(v.groups[0].block_size == 32);
  CHECK(v.groups[2].block_size == 16);
  // A page that is not a multiple of the others cannot be unified: vLLM raises.
  c.groups[0].shape.head_dim = 96;
  v = vllm_grouping(c, kBudget, 4096);
  CHECK(v.rule == "unsupported");
  CHECK(v.reason.find("not a multiple of") != std::string::npos);
  absl::StatusOr<CapacityPlan> plan =
      plan_capacity(c, {.budget_bytes = kBudget, .max_model_len = 4096});
  REQUIRE(plan.ok());
  CHECK(plan->lengths[0].vllm_sequences == 0);
  REQUIRE(!plan->notes.empty());
  CHECK(plan->notes[0].find("NotImplementedError") != std::string::npos);
}

TEST_CASE("vLLM keeps one attention type of mixed shapes in one group", "[planner]") {
  const KvCacheConfig c{
      .groups = {group(AttentionKind::kFull, 0, 4, 64), group(AttentionKind::kFull, 0, 4, 128)}};
  const VllmGrouping v = vllm_grouping(c, kBudget, 4096);
  CHECK(v.rule == "uniform_type");
  CHECK(v.padding_layers == 0);
  // One block spans every layer's own page: 4 x 16 x 2 x 8 x 64 x 2 + 4 x 16 x 2 x 8 x 128 x
  // 2 = 393,216 bytes.
  CHECK(v.block_bytes == 393216);
  CHECK(v.num_blocks == kBudget / 393216);
}

// --- vLLM's attention block size beside state layers ---------------------------------------

using testing::kNemotronH;  // support/state_models.h

TEST_CASE("vLLM's attention block size beside state layers, by its own rule", "[planner]") {
  // Token page 2 x 8 x 128 x 2 = 4,096 bytes. 16 x ceil(4,255,744 / (16 x 4,096)) =
  // 16 x ceil(64.94) = 16 x 65 = 1,040 tokens.
  absl::StatusOr<int32_t> block = vllm_state_block_size(kNemotronH);
  REQUIRE(block.ok());
  CHECK(*block == 1040);
  // Prefix caching, chunk_size 128: lcm(128, 16) = 128; ceil(4,255,744 / 4,096) = 1,039
  // tokens; 128 x ceil(1,039 / 128) = 128 x 9 = 1,152.
  CHECK(*vllm_state_block_size(kNemotronH, {.prefix_caching_chunk = 128}) == 1152);
  // An alignment of 32 (vLLM's Blackwell FlashInfer head-256 case): 32 x ceil(4,255,744 /
  // 131,072) = 32 x 33 = 1,056.
  CHECK(*vllm_state_block_size(kNemotronH, {.kernel_alignment = 32}) == 1056);

  // Qwen3-Next-80B-A3B: Gated DeltaNet, conv 3 x (2 x 16 x 128 + 32 x 128) = 24,576 and
  // recurrent 32 x 128 x 128 = 524,288 elements, both bf16: 1,097,728 bytes per layer.
  // Attention 2 KV heads x 256: token page 2 x 2 x 256 x 2 = 2,048 bytes.
  // 16 x ceil(1,097,728 / 32,768) = 16 x ceil(33.5) = 544.
  KvCacheConfig qwen3_next{
      .groups = {{.kind = AttentionKind::kState,
                  .state = {.num_layers = 36,
                            .conv_elements = 24576,
                            .recurrent_elements = 524288,
                            .recurrent_dtype = DType::kBFloat16}},
                 {.kind = AttentionKind::kFull,
                  .shape = {.num_layers = 12, .num_kv_heads = 2, .head_dim = 256}}}};
  CHECK(*vllm_state_block_size(qwen3_next) == 544);
  // Prefix caching at vLLM's default chunk of 2,048: ceil(1,097,728 / 2,048) = 536 tokens,
  // one chunk: 2,048.
  CHECK(*vllm_state_block_size(qwen3_next, {.prefix_caching_chunk = 2048}) == 2048);

  // MLA beside the Nemotron-H state: a latent of 576 bf16 is 1,152 bytes per token, and
  // vLLM aligns MLA blocks to 64: 64 x ceil(4,255,744 / 73,728) = 64 x 58 = 3,712.
  KvCacheConfig mla = kNemotronH;
  mla.groups[1].shape = {.num_layers = 4, .num_kv_heads = 1, .head_dim = 576, .latent = true};
  CHECK(*vllm_state_block_size(mla) == 3712);
}

TEST_CASE("Nemotron-H-8B: a slot and two checkpoints per sequence beside vLLM's 1,040-token blocks",
          "[planner]") {
  std::optional<CapacityPlan> plan =
      plan_fixture("nvidia--Nemotron-H-8B-Base-8K",
                   {.max_model_len = 8192, .target_tokens = 8192, .lengths = {1024, 8192}});
  REQUIRE(plan->groups.size() == 2);
  // tests/kv_cache_config_test.cc works the split out: 467 slots of 102,137,856 bytes and
  // 79,849 full blocks of 262,144.
  CHECK(plan->groups[0].num_layers == 24);
  CHECK(plan->groups[0].page_bytes == 102137856);
  CHECK(plan->groups[0].blocks_per_sequence == 3);
  CHECK(plan->groups[0].num_blocks == 467);
  CHECK(plan->groups[1].num_blocks == 79849);
  check_waste_bound(*plan);
  // 79,849 / 64 blocks of 1K = 1,247 sequences, but 467 slots: 467. At 8K: 79,849 / 512 = 155.
  CHECK(at(*plan, 1024).sequences == 467);
  CHECK(at(*plan, 8192).sequences == 155);
  // vLLM: blocks of 1,040 tokens, each state page padded from 4,255,744 to 1,040 x 4,096 =
  // 4,259,840 bytes; the config's chunk_size 128 gives 1,152 with prefix caching.
  CHECK(plan->vllm.state_block_size == 1040);
  CHECK(plan->vllm.state_prefix_caching_block_size == 1152);
  CHECK(plan->vllm.state_chunk == 128);
  CHECK(plan->vllm.state_page_bytes == 4255744);
  CHECK(plan->vllm.page_bytes == 4259840);
  // Types: 24 state layers and 4 full; 24 >= 1.5 x 4, so groups of 4: 6 state groups and
  // one full, no padding layers. 64 GiB / (4 x 4,259,840) = 4,032 blocks. A sequence takes
  // one block in each state group and ceil(L / 1,040) full blocks: 1K 7 -> 576 sequences,
  // 8K 6 + 8 = 14 -> 288. (vLLM keeps no checkpoints: its state blocks hold running
  // sequences only.)
  CHECK(plan->vllm.group_size == 4);
  CHECK(plan->vllm.groups.size() == 7);
  CHECK(plan->vllm.padding_layers == 0);
  CHECK(plan->vllm.num_blocks == 4032);
  CHECK(at(*plan, 1024).vllm_sequences == 576);
  CHECK(at(*plan, 8192).vllm_sequences == 288);
  const std::string text = format_plan_text(*plan);
  CHECK(text.find("vLLM's block size for this model by its rule: 1,040 tokens (pagedkv: 16)") !=
        std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(format_plan_json(*plan));
  CHECK(json["groups"][0]["state"]["slot_bytes"] == 102137856);
  CHECK(json["vllm"]["state_block_size"] == 1040);
}

TEST_CASE("Qwen3-Next and Granite-4.0-H-Tiny: vLLM's 544- and 400-token blocks", "[planner]") {
  std::optional<CapacityPlan> plan = plan_fixture("Qwen--Qwen3-Next-80B-A3B-Instruct");
  // 16 x ceil(1,097,728 / (16 x 2,048)) = 16 x 34 = 544; the config names no chunk, so
  // vLLM's default 2,048: ceil(1,097,728 / 2,048) = 536 -> 2,048.
  CHECK(plan->vllm.state_block_size == 544);
  CHECK(plan->vllm.state_prefix_caching_block_size == 2048);
  CHECK(plan->groups[0].page_bytes == 39518208);
  plan = plan_fixture("ibm-granite--granite-4.0-h-tiny");
  // Token page 2 x 4 x 128 x 2 = 2,048; 16 x ceil(806,400 / 32,768) = 16 x 25 = 400.
  // mamba_chunk_size 256: ceil(806,400 / 2,048) = 394 -> 256 x 2 = 512.
  CHECK(plan->vllm.state_block_size == 400);
  CHECK(plan->vllm.state_prefix_caching_block_size == 512);
  CHECK(plan->groups[0].page_bytes == 29030400);
}

TEST_CASE("vllm_state_block_size refuses a config without both kinds of layers", "[planner]") {
  auto invalid = [](const absl::StatusOr<int32_t>& block, const std::string& fragment) {
    INFO(block.status().ToString());
    CHECK(block.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(block.status().message().find(fragment) != std::string::npos);
  };
  invalid(vllm_state_block_size(KvCacheConfig{.groups = {group(AttentionKind::kFull, 0, 4)}}),
          "no state group");
  KvCacheConfig state_only = kNemotronH;
  state_only.groups.pop_back();
  invalid(vllm_state_block_size(state_only), "no attention group");
  invalid(vllm_state_block_size(kNemotronH, {.kernel_alignment = -16}), "kernel_alignment is -16");
}

// --- options, errors and output ---------------------------------------------------------------

const KvCacheConfig kTwoGroups{
    .groups = {group(AttentionKind::kSlidingWindow, 1024, 5), group(AttentionKind::kFull, 0, 1)}};

TEST_CASE("plan_capacity refuses what it cannot plan, naming the value", "[planner]") {
  auto invalid = [](const absl::StatusOr<CapacityPlan>& plan, const std::string& fragment) {
    INFO(plan.status().ToString());
    CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(plan.status().message().find(fragment) != std::string::npos);
  };
  invalid(plan_capacity(kTwoGroups, {.budget_bytes = 0, .max_model_len = 8192}),
          "budget is 0 bytes, must be positive");
  invalid(plan_capacity(kTwoGroups, {.budget_bytes = kBudget}),
          "max_model_len is 0, must be at least 1 (the config names no "
          "max_position_embeddings: pass one)");
  invalid(plan_capacity(kTwoGroups,
                        {.budget_bytes = kBudget, .max_model_len = 8192, .target_tokens = 9000}),
          "target length is 9000 tokens, must be in [1, 8192]");
  invalid(
      plan_capacity(kTwoGroups, {.budget_bytes = kBudget, .max_model_len = 8192, .lengths = {0}}),
      "length 0 tokens");
  invalid(plan_capacity(kTwoGroups, {.budget_bytes = 100000, .max_model_len = 8192}),
          "less than one page");
}

TEST_CASE("lengths default to the target and max_model_len, capped and deduplicated", "[planner]") {
  absl::StatusOr<CapacityPlan> plan =
      plan_capacity(kTwoGroups, {.budget_bytes = kBudget, .max_model_len = 8192});
  REQUIRE(plan.ok());
  CHECK(plan->target_tokens == 8192);
  REQUIRE(plan->lengths.size() == 1);  // target == max_model_len
  plan = plan_capacity(kTwoGroups, {.budget_bytes = kBudget,
                                    .max_model_len = 8192,
                                    .target_tokens = 1000,
                                    .lengths = {500, 100000, 9000}});
  REQUIRE(plan.ok());
  REQUIRE(plan->lengths.size() == 2);
  CHECK(plan->lengths[1].tokens == 8192);
  CHECK(plan->notes.size() == 2);  // both lengths over 8,192 say so
}

TEST_CASE("a max_model_len no pool holds once is reported", "[planner]") {
  // Split for 1,000 tokens, a 262,144-token sequence needs 16,384 full blocks.
  absl::StatusOr<CapacityPlan> plan = plan_capacity(
      kTwoGroups,
      {.budget_bytes = int64_t{1} << 30, .max_model_len = 262144, .target_tokens = 1000});
  REQUIRE(plan.ok());
  bool reported = false;
  for (const std::string& note : plan->notes) {
    reported = reported || note.find("does not fit: full needs 16,384 blocks") != std::string::npos;
  }
  CHECK(reported);
}

TEST_CASE("the text and JSON reports carry the same figures", "[planner]") {
  absl::StatusOr<CapacityPlan> plan = plan_capacity(
      kTwoGroups, {.budget_bytes = kBudget, .max_model_len = 8192, .lengths = {4096}});
  REQUIRE(plan.ok());
  const std::string text = format_plan_text(*plan);
  CHECK(text.find("sliding window 1,024") != std::string::npos);
  CHECK(text.find("no padding") != std::string::npos);
  CHECK(text.find("vLLM:") != std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(format_plan_json(*plan));
  CHECK(json["budget_bytes"] == kBudget);
  CHECK(json["groups"].size() == 2);
  CHECK(json["groups"][0]["kind"] == "sliding_window");
  CHECK(json["groups"][0]["num_blocks"] == plan->groups[0].num_blocks);
  CHECK(json["bytes_per_token"] == kTwoGroups.bytes_per_token());
  CHECK(json["vllm"]["group_size"] == 1);
  CHECK(json["vllm"]["padding_layers"] == 0);
  CHECK(json["lengths"][0]["tokens"] == 4096);
  CHECK(json["lengths"][0]["sequences"] == plan->lengths[0].sequences);
  CHECK(json["padding_bytes"] == 0);
}

}  // namespace
}  // namespace pagedkv
