// make_group_cache(): a group's pools, tier, watermark and kind.
#include "cache/group_factory.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "cache/state_group.h"
#include "cache/windowed_group.h"
#include "common/arithmetic.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

namespace {

using Options = KvCacheManager::Options;

// The events of a hybrid model name their group (docs/events.md, "Layer groups"); those of
// one group are as they were without groups.
std::optional<EventGroup> event_group(std::span<const LayerGroup> groups, size_t i) {
  if (groups.size() == 1) return std::nullopt;
  return EventGroup{static_cast<int32_t>(i), groups[i].kind, groups[i].window};
}

// A group's device pool: its layers' blocks, and the roles the group's kind and place give
// them. `anchored_caching`: the model caches and has groups that verify along the anchor's
// chain (windowed and state groups): the anchor then reports contents it loses, and the
// others drop the blocks cached after them (docs/allocator.md). With
// Options::shared_block_pool the first group built makes the pool of all, with a key space
// per group and contents revived instead of logged (nothing is dropped); the others take it.
absl::StatusOr<std::shared_ptr<BlockPool>> make_device_pool(std::span<const LayerGroup> groups,
                                                            size_t i, SharedState& shared,
                                                            bool anchored_caching, bool is_anchor,
                                                            BlockPoolCore*& core) {
  const Options& options = shared.options;
  if (options.shared_block_pool && shared.shared_device != nullptr) {
    core = shared.shared_device_core;
    return shared.shared_device;
  }
  const LayerGroup& spec = groups[i];
  const bool full = spec.kind == AttentionKind::kFull;
  PoolRoles roles{.log_evictions = options.enable_host_cache,
                  .index_partial_prefixes = options.enable_partial_block_reuse,
                  .log_dead_contents = is_anchor && anchored_caching,
                  .index_children = anchored_caching && !full};
  if (options.shared_block_pool) {
    // Blocks cached after contents that left the pool stay cached, as vLLM's do, and verify
    // again once those contents are computed again.
    roles.log_dead_contents = false;
    roles.index_children = roles.revive_contents = anchored_caching;
    for (size_t g = 0; g < groups.size(); ++g) roles.key_spaces.push_back(*event_group(groups, g));
  }
  // A state group's checkpoints are its cached blocks: BlockStored names the block a
  // checkpoint ends (docs/events.md, "State groups"); its slots are never hashed.
  auto device = BlockPoolCore::create(
      {.num_blocks = spec.num_blocks,
       .block_size = options.block_size,
       .enable_caching = options.enable_prefix_caching,
       .event_sink = options.event_sink,
       .event_group = event_group(groups, i),
       .clock = options.clock,
       .eviction_policy = full ? options.eviction_policy : EvictionPolicy::kLru},
      roles);
  if (!device.ok()) return device.status();
  core = device->get();
  auto pool = std::make_shared<BlockPool>(*std::move(device));
  if (options.shared_block_pool) {
    shared.shared_device = pool;
    shared.shared_device_core = core;
  }
  return pool;
}

// A group's pools: on the device (make_device_pool()) and on the host.
absl::StatusOr<GroupPools> make_pools(std::span<const LayerGroup> groups, size_t i,
                                      SharedState& shared, bool anchored_caching, bool is_anchor) {
  const Options& options = shared.options;
  const LayerGroup& spec = groups[i];
  const bool full = spec.kind == AttentionKind::kFull;
  const bool host_tier = options.enable_host_cache;
  BlockPoolCore* device_core = nullptr;
  PAGEDKV_ASSIGN_OR_RETURN(
      std::shared_ptr<BlockPool> device,
      make_device_pool(groups, i, shared, anchored_caching, is_anchor, device_core));
  // A state group's tier holds checkpoints (demoted when evicted, restored from the host):
  // its host pool serves swapping and the tier, as an attention group's does.
  auto host = BlockPoolCore::create(
      {.num_blocks = spec.num_host_blocks,
       .block_size = options.block_size,
       .enable_caching = host_tier,
       .event_sink =
           spec.kind == AttentionKind::kState && !host_tier ? nullptr : options.event_sink,
       .medium = Medium::kHost,
       .event_group = event_group(groups, i),
       .clock = options.clock},
      // Its evictions become ghosts (HostTier). Host blocks take the content keys of the
      // device blocks they copy: the host's own keys (blocks renewed for swapping) are
      // drawn apart from the device's.
      {.log_evictions = host_tier && options.host_admission == HostAdmission::kReused,
       .first_content_key = uint64_t{1} << 63,
       .log_dead_contents = is_anchor && anchored_caching,
       .index_children = anchored_caching && !full});
  if (!host.ok()) return host.status();
  BlockPoolCore* host_core = host->get();
  return GroupPools{.device = std::move(device),
                    .host = BlockPool(*std::move(host)),
                    .device_core = device_core,
                    .host_core = host_core};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GroupCache>> make_group_cache(std::span<const LayerGroup> groups,
                                                             size_t i, SharedState& shared,
                                                             const FullAttentionGroup* anchor) {
  const Options& options = shared.options;
  const LayerGroup& spec = groups[i];
  const auto index = static_cast<int32_t>(i);
  const bool anchored_caching = options.enable_prefix_caching &&
                                std::any_of(groups.begin(), groups.end(), [](const LayerGroup& g) {
                                  return g.kind != AttentionKind::kFull;
                                });
  const bool is_anchor = spec.kind == AttentionKind::kFull && anchor == nullptr;
  PAGEDKV_ASSIGN_OR_RETURN(GroupPools pools,
                           make_pools(groups, i, shared, anchored_caching, is_anchor));
  // The watermark scaled to the group's pool, rounded up: the same headroom share.
  const int64_t watermark =
      div_ceil(int64_t{options.watermark_blocks} * spec.num_blocks, groups[0].num_blocks);
  GroupParts parts{
      .spec = spec,
      .index = index,
      .watermark_blocks = static_cast<int32_t>(std::min<int64_t>(watermark, spec.num_blocks - 1)),
      .pools = std::move(pools),
      .host_tier = options.enable_host_cache
                       ? std::make_unique<HostTier>(options.host_admission, spec.num_blocks,
                                                    spec.num_host_blocks)
                       : nullptr};
  switch (spec.kind) {
    case AttentionKind::kFull:
      return std::make_unique<FullAttentionGroup>(std::move(parts), shared);
    case AttentionKind::kSlidingWindow:
    case AttentionKind::kChunkedLocal:
      return std::make_unique<WindowedGroup>(std::move(parts), shared, anchor);
    case AttentionKind::kState:
      return std::make_unique<StateGroup>(std::move(parts), shared, anchor);
  }
  return absl::InvalidArgumentError("make_group_cache: not an AttentionKind");
}

}  // namespace pagedkv::internal
