// Tests of KvCachePlan: one object sizes the allocator and the storage alike, and refuses
// what would make them disagree.
#include <catch2/catch.hpp>

#include <vector>

#include "pagedkv/kv_cache_plan.h"
#include "support/manager_test_util.h"

namespace pagedkv {
namespace {

using namespace pagedkv::testing;  // NOLINT: the shared test helpers

// One sliding-window group of 2 layers and one full group of 1 layer, 2 KV heads of 64,
// bf16, 8 tokens per block: 1,024 and 512 bytes per token.
KvCacheConfig small_hybrid() {
  return {.groups = {{.kind = AttentionKind::kSlidingWindow,
                      .window = 64,
                      .shape = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64}},
                     {.kind = AttentionKind::kFull,
                      .shape = {.num_layers = 1, .num_kv_heads = 2, .head_dim = 64}}},
          .dtype = DType::kBFloat16,
          .block_size = 8};
}

TEST_CASE("a plan's manager options and storage agree group by group", "[kv_cache_plan]") {
  const absl::StatusOr<KvCachePlan> plan = KvCachePlan::for_budget(
      small_hybrid(), {.device_bytes = 1 << 20, .host_bytes = 1 << 18, .target_tokens = 512});
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  // The device split is KvCacheConfig::split_budget()'s; the host one too.
  const absl::StatusOr<PoolSplit> device = small_hybrid().split_budget(1 << 20, 512);
  const absl::StatusOr<PoolSplit> host = small_hybrid().split_budget(1 << 18, 512);
  REQUIRE(device.ok());
  REQUIRE(host.ok());
  REQUIRE(plan->num_groups() == 2);
  for (int32_t g = 0; g < 2; ++g) {
    CHECK(plan->layer_groups()[g].num_blocks == device->groups[g].num_blocks);
    CHECK(plan->layer_groups()[g].num_host_blocks == host->groups[g].num_blocks);
  }
  const absl::StatusOr<KvCacheManager::Options> options =
      plan->manager_options({.enable_host_cache = true});
  REQUIRE(options.ok());
  CHECK(options->block_size == 8);
  CHECK(options->enable_host_cache);
  KvCacheManager m = make_manager(*options);
  for (int32_t g = 0; g < 2; ++g) {
    const absl::StatusOr<KvStorage> storage = plan->create_storage(g, Device::kCpu);
    REQUIRE(storage.ok());
    CHECK(storage->layer_group() == g);
    CHECK(storage->spec().block_size == m.options().block_size);
    CHECK(storage->num_blocks() == (*m.device_pool(g))->num_blocks());
    CHECK(storage->num_host_blocks() == (*m.host_pool(g))->num_blocks());
    CHECK(storage->spec().num_layers == small_hybrid().groups[g].shape.num_layers);
  }
}

TEST_CASE("a plan refuses pools that do not fit its groups, and options of its own",
          "[kv_cache_plan]") {
  const KvCacheConfig config = small_hybrid();
  require_error(KvCachePlan::create(config, full_attention(8)).status(),
                absl::StatusCode::kInvalidArgument, "1 pools for a config of 2 layer groups");
  require_error(KvCachePlan::create(config, {{.kind = AttentionKind::kFull, .num_blocks = 8},
                                             {.kind = AttentionKind::kFull, .num_blocks = 8}})
                    .status(),
                absl::StatusCode::kInvalidArgument,
                "pool 0 is full window 0, its group sliding_window window 64");
  require_error(KvCachePlan::create(
                    config, {{.kind = AttentionKind::kSlidingWindow, .window = 64, .num_blocks = 0},
                             {.kind = AttentionKind::kFull, .num_blocks = 8}})
                    .status(),
                absl::StatusCode::kInvalidArgument, "pool 0 has 0 device and 0 host blocks");
  KvCacheConfig no_layers = config;
  no_layers.groups[1].shape.num_layers = 0;
  CHECK(absl::IsInvalidArgument(
      KvCachePlan::create(no_layers,
                          {{.kind = AttentionKind::kSlidingWindow, .window = 64, .num_blocks = 8},
                           {.kind = AttentionKind::kFull, .num_blocks = 8}})
          .status()));
  require_error(
      KvCachePlan::for_budget(config, {.device_bytes = 100, .target_tokens = 512}).status(),
      absl::StatusCode::kInvalidArgument, "KvCachePlan: device budget: split_budget");
  require_error(KvCachePlan::for_budget(
                    config, {.device_bytes = 1 << 20, .host_bytes = 100, .target_tokens = 512})
                    .status(),
                absl::StatusCode::kInvalidArgument, "KvCachePlan: host budget: split_budget");

  const absl::StatusOr<KvCachePlan> plan =
      KvCachePlan::for_budget(config, {.device_bytes = 1 << 20, .target_tokens = 512});
  REQUIRE(plan.ok());
  require_error(plan->manager_options({.block_size = 32}).status(),
                absl::StatusCode::kInvalidArgument,
                "manager_options: block_size 32 given, the plan's is 8");
  require_error(plan->manager_options({.layer_groups = full_attention(4)}).status(),
                absl::StatusCode::kInvalidArgument,
                "manager_options: 1 layer groups given; they are the plan's");
  CHECK(plan->manager_options({.block_size = 8}).ok());
  require_error(plan->create_storage(2, Device::kCpu).status(), absl::StatusCode::kInvalidArgument,
                "create_storage: layer group 2 outside [0, 2)");
}

TEST_CASE("a plan's state group gets state storage", "[kv_cache_plan]") {
  KvCacheConfig config = small_hybrid();
  config.groups[0] = {.kind = AttentionKind::kState,
                      .state = {.num_layers = 2, .conv_elements = 8, .recurrent_elements = 64}};
  std::swap(config.groups[0], config.groups[1]);  // an attention group first
  const absl::StatusOr<KvCachePlan> plan =
      KvCachePlan::create(config, {{.kind = AttentionKind::kFull, .num_blocks = 16},
                                   {.kind = AttentionKind::kState, .num_blocks = 4}});
  REQUIRE(plan.ok());
  const absl::StatusOr<KvStorage> state = plan->create_storage(1, Device::kCpu);
  REQUIRE(state.ok());
  CHECK(state->num_blocks() == 4);
  CHECK(state->layer_group() == 1);
  CHECK(make_manager(*plan->manager_options()).num_groups() == 2);
}

}  // namespace
}  // namespace pagedkv
