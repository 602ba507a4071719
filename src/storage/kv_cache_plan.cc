// KvCachePlan: a config's groups with their pools; the allocator's options and each group's
// storage, both from it.
#include "pagedkv/kv_cache_plan.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pagedkv {

absl::StatusOr<KvCachePlan> KvCachePlan::create(KvCacheConfig config,
                                                std::vector<LayerGroup> pools) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (std::ssize(pools) != config.num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCachePlan: ", pools.size(),
                                                   " pools for a config of ", config.num_groups(),
                                                   " layer groups"));
  }
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const KvCacheGroup& group = config.groups[static_cast<size_t>(g)];
    const LayerGroup& pool = pools[static_cast<size_t>(g)];
    if (pool.kind != group.kind || pool.window != group.window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvCachePlan: pool ", g, " is ", attention_kind_name(pool.kind), " window ", pool.window,
          ", its group ", attention_kind_name(group.kind), " window ", group.window));
    }
    if (pool.num_blocks <= 0 || pool.num_host_blocks < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCachePlan: pool ", g, " has ", pool.num_blocks, " device and ",
                       pool.num_host_blocks, " host blocks; need > 0 and >= 0"));
    }
  }
  return KvCachePlan(std::move(config), std::move(pools));
}

absl::StatusOr<KvCachePlan> KvCachePlan::for_budget(KvCacheConfig config, const Budget& budget) {
  absl::StatusOr<PoolSplit> device =
      config.split_budget(budget.device_bytes, budget.target_tokens, budget.cached_tokens);
  if (!device.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCachePlan: device budget: ", device.status().message()));
  }
  std::vector<LayerGroup> pools = std::move(device->groups);
  if (budget.host_bytes > 0) {
    absl::StatusOr<PoolSplit> host = config.split_budget(budget.host_bytes, budget.target_tokens);
    if (!host.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCachePlan: host budget: ", host.status().message()));
    }
    for (size_t g = 0; g < pools.size(); ++g) pools[g].num_host_blocks = host->groups[g].num_blocks;
  }
  return create(std::move(config), std::move(pools));
}

absl::StatusOr<KvCacheManager::Options> KvCachePlan::manager_options(
    KvCacheManager::Options options) const {
  if (!options.layer_groups.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCachePlan::manager_options: ", options.layer_groups.size(),
                     " layer groups given; they are the plan's"));
  }
  if (options.block_size != KvCacheManager::Options{}.block_size &&
      options.block_size != block_size()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCachePlan::manager_options: block_size ",
                                                   options.block_size, " given, the plan's is ",
                                                   block_size()));
  }
  options.block_size = block_size();
  options.layer_groups = pools_;
  return options;
}

absl::StatusOr<KvStorage> KvCachePlan::create_storage(int32_t group, Device device,
                                                      KvLayout layout) const {
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCachePlan::create_storage: layer group ",
                                                   group, " outside [0, ", num_groups(), ")"));
  }
  const LayerGroup& pool = pools_[static_cast<size_t>(group)];
  const KvStorageOptions options{.device = device,
                                 .layout = layout,
                                 .num_host_blocks = pool.num_host_blocks,
                                 .layer_group = group};
  if (config_.is_state(group)) {
    return KvStorage::create_state(config_.groups[static_cast<size_t>(group)].state,
                                   pool.num_blocks, options);
  }
  return KvStorage::create(config_.group_spec(group), pool.num_blocks, options);
}

}  // namespace pagedkv
