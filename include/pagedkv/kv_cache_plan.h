// File: pagedkv/kv_cache_plan.h
//
// KvCachePlan: one model's KV cache laid out and sized. Its layer groups' shapes
// (KvCacheConfig: kinds, windows, K/V or state shapes, one dtype and one block size) and
// each group's pools (LayerGroup: device and host blocks) in one object, from which an
// engine takes both the allocator's options and each group's storage: the two cannot
// disagree on the block size, the groups' order or a pool's size (a mismatch would
// otherwise surface only at the kernels' argument checks, or as K/V in the wrong place).
//
// A small hybrid model, two sliding-window layers of 512 tokens and one full layer, 2 KV
// heads of 64 in bf16, in 64 MiB of device memory and 16 MiB of host memory.
// Example (in a function returning a Status; tests/doc_examples_test.cc runs it):
//   KvCacheConfig config{
//       .groups = {{.kind = AttentionKind::kSlidingWindow, .window = 512,
//                   .shape = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64}},
//                  {.kind = AttentionKind::kFull,
//                   .shape = {.num_layers = 1, .num_kv_heads = 2, .head_dim = 64}}},
//       .dtype = DType::kBFloat16, .block_size = 16};
//   absl::StatusOr<KvCachePlan> plan = KvCachePlan::for_budget(
//       config, {.device_bytes = 64 << 20, .host_bytes = 16 << 20, .target_tokens = 4096});
//   if (!plan.ok()) return plan.status();
//   absl::StatusOr<KvCacheManager::Options> options =
//       plan->manager_options({.enable_host_cache = true});
//   if (!options.ok()) return options.status();
//   absl::StatusOr<KvCacheManager> manager = KvCacheManager::create(*std::move(options));
//   if (!manager.ok()) return manager.status();
//   std::vector<KvStorage> storage;  // one per group, each running its group's copies
//   for (int32_t g = 0; g < plan->num_groups(); ++g) {
//     absl::StatusOr<KvStorage> s = plan->create_storage(g, Device::kCpu);
//     if (!s.ok()) return s.status();
//     storage.push_back(*std::move(s));
//   }
//   // every step: for (KvStorage& s : storage) s.run_step_ops(ops), ops from take_step_ops()
#ifndef PAGEDKV_KV_CACHE_PLAN_H_
#define PAGEDKV_KV_CACHE_PLAN_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/device.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/kv_cache_view.h"
#include "pagedkv/kv_storage.h"
#include "pagedkv/layer_group.h"

namespace pagedkv {

class KvCachePlan {
 public:
  // The byte budgets for_budget() splits between the groups (KvCacheConfig::split_budget()).
  struct Budget {
    int64_t device_bytes = 0;
    int64_t host_bytes = 0;     // swap space and host tier, split as the device's (0: none)
    int64_t target_tokens = 0;  // the sequence length at which every pool runs out together
    int64_t cached_tokens = 0;  // prefix-cache content the device split counts (0: none)
  };

  // A plan of `config` with `pools`, one per group in the config's order, with the
  // group's kind and window. Errors: InvalidArgument for an invalid config
  // (KvCacheConfig::validate()), another number of pools, a pool whose kind or window is
  // not its group's, or sizes KvCacheManager::create() refuses (num_blocks <= 0,
  // num_host_blocks < 0).
  [[nodiscard]] static absl::StatusOr<KvCachePlan> create(KvCacheConfig config,
                                                          std::vector<LayerGroup> pools);
  // A plan of `config` whose pools split `budget` (KvCacheConfig::split_budget(): device
  // and host budgets alike). Errors: split_budget()'s, naming the budget.
  [[nodiscard]] static absl::StatusOr<KvCachePlan> for_budget(KvCacheConfig config,
                                                              const Budget& budget);

  const KvCacheConfig& config() const { return config_; }
  std::span<const LayerGroup> layer_groups() const { return pools_; }
  int32_t num_groups() const { return static_cast<int32_t>(pools_.size()); }
  int32_t block_size() const { return config_.block_size; }

  // KvCacheManager's options: `options` with the plan's block_size and layer_groups. Errors:
  // InvalidArgument when `options` names layer groups of its own, or a block size other
  // than the plan's (16, the default, counts as none).
  [[nodiscard]] absl::StatusOr<KvCacheManager::Options> manager_options(
      KvCacheManager::Options options = {}) const;

  // The storage of group `group`: its layers' K/V (or state slots) in its pools' device
  // and host blocks, running the copies of that group (KvStorageOptions::layer_group).
  // Errors: InvalidArgument for a group outside [0, num_groups()); KvStorage's.
  [[nodiscard]] absl::StatusOr<KvStorage> create_storage(int32_t group,
                                                         Device device = default_device(),
                                                         KvLayout layout = KvLayout::kHND) const;

 private:
  KvCachePlan(KvCacheConfig config, std::vector<LayerGroup> pools)
      : config_(std::move(config)), pools_(std::move(pools)) {}

  KvCacheConfig config_;
  std::vector<LayerGroup> pools_;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_CACHE_PLAN_H_
