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

// A group's pools: its layers' blocks on the device and on the host, and the roles the
// group's kind and place give them.
// `anchored_caching`: the model caches and has groups that verify along the anchor's chain
// (windowed and state groups): the anchor then reports contents it loses, and the others
// drop the blocks cached after them (docs/allocator.md).
absl::StatusOr<GroupPools> make_pools(const Options& options, const LayerGroup& spec, int32_t index,
                                      size_t num_groups, bool anchored_caching, bool is_anchor) {
  const bool full = spec.kind == AttentionKind::kFull;
  const bool host_tier = options.enable_host_cache;
  // The events of a hybrid model name their group (docs/events.md, "Layer groups"); those
  // of one group are as they were without groups.
  const std::optional<EventGroup> event_group =
      num_groups > 1 ? std::optional<EventGroup>(EventGroup{index, spec.kind, spec.window})
                     : std::nullopt;
  // A state group's checkpoints are its cached blocks: BlockStored names the block a
  // checkpoint ends (docs/events.md, "State groups"); its slots are never hashed.
  auto device = BlockPoolCore::create(
      {.num_blocks = spec.num_blocks,
       .block_size = options.block_size,
       .enable_caching = options.enable_prefix_caching,
       .event_sink = options.event_sink,
       .event_group = event_group,
       .clock = options.clock,
       .eviction_policy = full ? options.eviction_policy : EvictionPolicy::kLru},
      {.log_evictions = host_tier,
       .index_partial_prefixes = options.enable_partial_block_reuse,
       .log_dead_contents = is_anchor && anchored_caching,
       .index_children = anchored_caching && !full});
  if (!device.ok()) return device.status();
  // A state group's tier holds checkpoints (demoted when evicted, restored from the host):
  // its host pool serves swapping and the tier, as an attention group's does.
  auto host = BlockPoolCore::create(
      {.num_blocks = spec.num_host_blocks,
       .block_size = options.block_size,
       .enable_caching = host_tier,
       .event_sink =
           spec.kind == AttentionKind::kState && !host_tier ? nullptr : options.event_sink,
       .medium = Medium::kHost,
       .event_group = event_group,
       .clock = options.clock},
      // Its evictions become ghosts (HostTier). Host blocks take the content keys of the
      // device blocks they copy: the host's own keys (blocks renewed for swapping) are
      // drawn apart from the device's.
      {.log_evictions = host_tier && options.host_admission == HostAdmission::kReused,
       .first_content_key = uint64_t{1} << 63,
       .log_dead_contents = is_anchor && anchored_caching,
       .index_children = anchored_caching && !full});
  if (!host.ok()) return host.status();
  BlockPoolCore* device_core = device->get();
  BlockPoolCore* host_core = host->get();
  return GroupPools{.device = BlockPool(*std::move(device)),
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
  PAGEDKV_ASSIGN_OR_RETURN(GroupPools pools, make_pools(options, spec, index, groups.size(),
                                                        anchored_caching, is_anchor));
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
