// KvCacheManager::create(): options and layer groups validated, then the pools of every
// group built; nothing is allocated for a configuration that is refused.
#include "pagedkv/kv_cache_manager.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/group_pools.h"
#include "cache/host_tier.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/arithmetic.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace pagedkv {

using internal::div_ceil;
using internal::GroupPools;

namespace {

// Checkpoint levels are retention priorities below the default, one each: keep them few.
constexpr int32_t kMaxCheckpointLevels = 16;

absl::Status check_groups(const KvCacheManager::Options& options,
                          std::span<const LayerGroup> groups) {
  bool has_full = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LayerGroup& g = groups[i];
    const std::string name =
        absl::StrCat("KvCacheManager: layer_groups[", i, "] (", attention_kind_name(g.kind), ")");
    if (g.num_blocks <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": num_blocks ", g.num_blocks, " must be > 0"));
    }
    if (g.num_host_blocks < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": num_host_blocks ", g.num_host_blocks, " must be >= 0"));
    }
    const bool windowed =
        g.kind == AttentionKind::kSlidingWindow || g.kind == AttentionKind::kChunkedLocal;
    if (windowed ? g.window <= 0 : g.window != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": window ", g.window,
          windowed ? " must be > 0"
                   : (g.kind == AttentionKind::kFull ? " must be 0 for full attention"
                                                     : " must be 0 for a state group")));
    }
    if (g.kind == AttentionKind::kState && i == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name,
                       ": the first group must be an attention group: allocate_slots() returns its "
                       "slot mapping, and a state group has none"));
    }
    if (g.kind == AttentionKind::kState && options.enable_partial_block_reuse) {
      return absl::InvalidArgumentError(
          absl::StrCat(name,
                       ": enable_partial_block_reuse with a state group: a hit must end where a "
                       "checkpoint holds the state, at a block boundary"));
    }
    if (options.enable_host_cache && g.num_host_blocks == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": enable_host_cache needs num_host_blocks > 0 in every group"));
    }
    has_full |= g.kind == AttentionKind::kFull;
  }
  if (!has_full && options.enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "KvCacheManager: windowed or state layer groups with prefix caching need a "
        "full-attention group: hits are verified along its chain (disable prefix caching, or "
        "add the group)");
  }
  return absl::OkStatus();
}

}  // namespace

// --- construct -------------------------------------------------------------------------

absl::StatusOr<KvCacheManager> KvCacheManager::create(Options options) {
  const bool grouped = !options.layer_groups.empty();
  if (grouped && (options.num_blocks != 0 || options.num_host_blocks != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCacheManager: num_blocks ", options.num_blocks, " and num_host_blocks ",
        options.num_host_blocks, " must be 0 with layer_groups (each group has its own)"));
  }
  if (!grouped && options.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: num_blocks ", options.num_blocks, " must be > 0"));
  }
  if (options.num_host_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: num_host_blocks ", options.num_host_blocks, " must be >= 0"));
  }
  if (options.max_model_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: max_model_len ", options.max_model_len, " must be > 0"));
  }
  if (options.hash_fn == nullptr) {
    return absl::InvalidArgumentError("KvCacheManager: hash_fn must not be null");
  }
  if (options.state_checkpoint_interval_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: state_checkpoint_interval_blocks ",
                     options.state_checkpoint_interval_blocks, " must be >= 0"));
  }
  if (options.window_checkpoint_tokens < 0 || options.window_checkpoint_levels < 0 ||
      options.window_checkpoint_levels > kMaxCheckpointLevels) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: window_checkpoint_tokens ", options.window_checkpoint_tokens,
                     " must be >= 0 and window_checkpoint_levels ",
                     options.window_checkpoint_levels, " in [0, ", kMaxCheckpointLevels, "]"));
  }
  if (options.enable_host_cache &&
      (!options.enable_prefix_caching || (!grouped && options.num_host_blocks == 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: enable_host_cache needs enable_prefix_caching (",
                     options.enable_prefix_caching ? "true" : "false",
                     ") and num_host_blocks > 0 (", options.num_host_blocks, ")"));
  }
  if (options.host_admission != HostAdmission::kAll &&
      options.host_admission != HostAdmission::kReused) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheManager: host_admission ",
                                                   static_cast<int>(options.host_admission),
                                                   " is neither kAll (0) nor kReused (1)"));
  }
  if (options.eviction_policy != EvictionPolicy::kLru &&
      options.eviction_policy != EvictionPolicy::kAdaptive) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheManager: eviction_policy ",
                                                   static_cast<int>(options.eviction_policy),
                                                   " is neither kLru (0) nor kAdaptive (1)"));
  }
  std::vector<LayerGroup> layer_groups =
      grouped ? options.layer_groups
              : std::vector<LayerGroup>{{.kind = AttentionKind::kFull,
                                         .num_blocks = options.num_blocks,
                                         .num_host_blocks = options.num_host_blocks}};
  if (grouped) PAGEDKV_RETURN_IF_ERROR(check_groups(options, layer_groups));
  const int32_t first_blocks = layer_groups[0].num_blocks;
  if (options.watermark_blocks < 0 || options.watermark_blocks >= first_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: watermark_blocks ", options.watermark_blocks,
                     " must be in [0, num_blocks ", first_blocks, ")"));
  }
  // With windowed groups that cache, the anchor reports contents it loses, and the
  // windowed pools drop the blocks cached after them (docs/allocator.md).
  // So do state groups: their checkpoints verify after the anchor's blocks too.
  auto follows_anchor = [](const LayerGroup& g) { return g.kind != AttentionKind::kFull; };
  const bool windowed_caching =
      options.enable_prefix_caching &&
      std::any_of(layer_groups.begin(), layer_groups.end(), follows_anchor);
  const auto anchor = static_cast<size_t>(
      std::find_if(layer_groups.begin(), layer_groups.end(),
                   [](const LayerGroup& g) { return g.kind == AttentionKind::kFull; }) -
      layer_groups.begin());
  try {
    std::vector<GroupPools> groups;
    for (size_t i = 0; i < layer_groups.size(); ++i) {
      const LayerGroup& spec = layer_groups[i];
      const bool full = spec.kind == AttentionKind::kFull;
      const bool holds_state = spec.kind == AttentionKind::kState;
      const bool logs_deaths = windowed_caching && i == anchor;
      // A state group's tier holds checkpoints (demoted when evicted, restored from the
      // host): its host pool serves swapping and the tier, as an attention group's does.
      const bool host_tier = options.enable_host_cache;
      // The events of a hybrid model name their group (docs/events.md, "Layer groups");
      // those of one group are as they were without groups.
      const std::optional<EventGroup> event_group =
          layer_groups.size() > 1 ? std::optional<EventGroup>(
                                        EventGroup{static_cast<int32_t>(i), spec.kind, spec.window})
                                  : std::nullopt;
      // A state group's checkpoints are its cached blocks: BlockStored names the block a
      // checkpoint ends (docs/events.md, "State groups"); its slots are never hashed.
      auto device = BlockPool::create(
          {.num_blocks = spec.num_blocks,
           .block_size = options.block_size,
           .enable_caching = options.enable_prefix_caching,
           .event_sink = options.event_sink,
           .event_group = event_group,
           .clock = options.clock,
           .log_evictions = host_tier,
           .index_partial_prefixes = options.enable_partial_block_reuse,
           .log_dead_contents = logs_deaths,
           .index_children = windowed_caching && !full,
           .eviction_policy = full ? options.eviction_policy : EvictionPolicy::kLru});
      if (!device.ok()) return device.status();
      auto host = BlockPool::create(
          {.num_blocks = spec.num_host_blocks,
           .block_size = options.block_size,
           .enable_caching = host_tier,
           .event_sink = holds_state && !host_tier ? nullptr : options.event_sink,
           .medium = Medium::kHost,
           .event_group = event_group,
           .clock = options.clock,
           // Its evictions become ghosts (HostTier).
           .log_evictions = host_tier && options.host_admission == HostAdmission::kReused,
           // Host blocks take the content keys of the device blocks they copy: the
           // host's own keys (blocks renewed for swapping) are drawn apart from the
           // device's.
           .first_content_key = uint64_t{1} << 63,
           .log_dead_contents = logs_deaths,
           .index_children = windowed_caching && !full});
      if (!host.ok()) return host.status();
      // The watermark scaled to the group's pool, rounded up: the same headroom share.
      const int64_t watermark =
          div_ceil(int64_t{options.watermark_blocks} * spec.num_blocks, first_blocks);
      groups.push_back({.spec = spec,
                        .index = static_cast<int32_t>(i),
                        .watermark_blocks =
                            static_cast<int32_t>(std::min<int64_t>(watermark, spec.num_blocks - 1)),
                        .device = *std::move(device),
                        .host = *std::move(host),
                        .host_tier = host_tier ? std::make_unique<internal::HostTier>(
                                                     options.host_admission, spec.num_blocks,
                                                     spec.num_host_blocks)
                                               : nullptr,
                        .match = {}});
    }
    return KvCacheManager(std::move(options), std::move(layer_groups), std::move(groups));
  } catch (const std::bad_alloc&) {  // no exception leaves the library
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvCacheManager: cannot allocate the host bookkeeping for ", first_blocks, " blocks"));
  }
}

KvCacheManager::KvCacheManager(Options options, std::vector<LayerGroup> layer_groups,
                               std::vector<GroupPools> groups)
    : options_(std::move(options)),
      layer_groups_(std::move(layer_groups)),
      groups_(std::move(groups)),
      ledger_(std::make_unique<internal::StepLedger>(layer_groups_)) {
  for (const GroupPools& g : groups_) {
    if (g.full()) {
      anchor_ = g.index;
      break;
    }
  }
  windowed_ =
      std::any_of(groups_.begin(), groups_.end(), [](const GroupPools& g) { return g.windowed(); });
  has_state_ = std::any_of(groups_.begin(), groups_.end(),
                           [](const GroupPools& g) { return g.holds_state(); });
  buries_ = (windowed_ || has_state_) && anchor_ >= 0;
  group_counters_.resize(groups_.size());
  plans_.resize(groups_.size());
}

KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

}  // namespace pagedkv
