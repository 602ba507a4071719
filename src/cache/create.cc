// CacheCoordinator::create(): options and layer groups validated, then every group built
// with its pools; nothing is allocated for a configuration that is refused.
#include <algorithm>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "cache/group_factory.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

namespace {

using Options = KvCacheManager::Options;

// Checkpoint levels are retention priorities below the default, one each: keep them few.
constexpr int32_t kMaxCheckpointLevels = 16;

absl::Status check_groups(const Options& options, std::span<const LayerGroup> groups) {
  bool has_full = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LayerGroup& g = groups[i];
    const std::string name =
        absl::StrCat("KvCacheManager: layer_groups[", i, "] (", attention_kind_name(g.kind), ")");
    if (g.kind > AttentionKind::kState) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": kind ", static_cast<int>(g.kind),
                                                     " is not an AttentionKind (0 to 3)"));
    }
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

// One pool for all groups: every group's blocks are the pool's (equal sizes), and what a
// pool of its own would keep per group (host blocks and their tier, a group's eviction
// policy, partial-block prefixes, state slots) has no shared form.
absl::Status check_shared_pool(const Options& options, std::span<const LayerGroup> groups) {
  if (!options.shared_block_pool) return absl::OkStatus();
  const auto refuse = [](const auto&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: shared_block_pool: ", parts...));
  };
  if (options.eviction_policy != EvictionPolicy::kLru) {
    return refuse("eviction_policy must be kLru (one LRU order for all groups)");
  }
  if (options.enable_partial_block_reuse)
    return refuse("enable_partial_block_reuse is not supported");
  if (options.enable_host_cache) {
    return refuse("enable_host_cache is not supported (host blocks keep a pool per group)");
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const LayerGroup& g = groups[i];
    if (g.kind == AttentionKind::kState) {
      return refuse("layer_groups[", i,
                    "] is a state group; state slots are not blocks of the pool");
    }
    if (g.num_blocks != groups[0].num_blocks) {
      return refuse("layer_groups[", i, "].num_blocks ", g.num_blocks, " != ", groups[0].num_blocks,
                    " of layer_groups[0]: every group's num_blocks is the one pool's size");
    }
    if (g.num_host_blocks != 0) {
      return refuse("layer_groups[", i, "].num_host_blocks ", g.num_host_blocks,
                    " must be 0 (host blocks, swapping and the host tier keep a pool per group)");
    }
  }
  return absl::OkStatus();
}

}  // namespace

// --- construct -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CacheCoordinator>> CacheCoordinator::create(Options options) {
  if (options.layer_groups.empty()) {
    return absl::InvalidArgumentError(
        "KvCacheManager: no layer_groups; a model of full-attention layers has one: "
        "full_attention(num_blocks)");
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
  if (options.enable_host_cache && !options.enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "KvCacheManager: enable_host_cache needs enable_prefix_caching");
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
  const std::vector<LayerGroup> layer_groups = options.layer_groups;
  PAGEDKV_RETURN_IF_ERROR(check_shared_pool(options, layer_groups));
  PAGEDKV_RETURN_IF_ERROR(check_groups(options, layer_groups));
  const int32_t first_blocks = layer_groups[0].num_blocks;
  if (options.watermark_blocks < 0 || options.watermark_blocks >= first_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheManager: watermark_blocks ", options.watermark_blocks,
                     " must be in [0, num_blocks ", first_blocks, ")"));
  }
  try {
    auto coordinator = std::make_unique<CacheCoordinator>(std::move(options), layer_groups);
    PAGEDKV_RETURN_IF_ERROR(coordinator->add_groups(layer_groups));
    return coordinator;
  } catch (const std::bad_alloc&) {  // no exception leaves the library
    return absl::ResourceExhaustedError(absl::StrCat(
        "KvCacheManager: cannot allocate the host bookkeeping for ", first_blocks, " blocks"));
  }
}

CacheCoordinator::CacheCoordinator(Options options, std::span<const LayerGroup> layer_groups)
    : shared_(std::move(options), static_cast<int32_t>(layer_groups.size())) {}

// Builds every group, the anchor first (the others verify along its chain), and the lists
// of groups by role.
absl::Status CacheCoordinator::add_groups(std::span<const LayerGroup> layer_groups) {
  const auto is_full = [](const LayerGroup& g) { return g.kind == AttentionKind::kFull; };
  const auto anchor = static_cast<size_t>(
      std::find_if(layer_groups.begin(), layer_groups.end(), is_full) - layer_groups.begin());
  groups_.resize(layer_groups.size());
  if (anchor < layer_groups.size()) {
    PAGEDKV_ASSIGN_OR_RETURN(groups_[anchor],
                             make_group_cache(layer_groups, anchor, shared_, nullptr));
    anchor_ = static_cast<FullAttentionGroup*>(groups_[anchor].get());
  }
  for (size_t i = 0; i < layer_groups.size(); ++i) {
    if (i == anchor) continue;
    PAGEDKV_ASSIGN_OR_RETURN(groups_[i], make_group_cache(layer_groups, i, shared_, anchor_));
  }
  for (const auto& g : groups_) {
    switch (g->kind()) {
      case AttentionKind::kFull:
        attention_.push_back(static_cast<AttentionGroup*>(g.get()));
        break;
      case AttentionKind::kSlidingWindow:
      case AttentionKind::kChunkedLocal:
        attention_.push_back(static_cast<AttentionGroup*>(g.get()));
        followers_.push_back(g.get());
        windowed_ = true;
        break;
      case AttentionKind::kState:
        followers_.push_back(g.get());
        state_.push_back(static_cast<StateGroup*>(g.get()));
        break;
    }
  }
  // Offers: the full groups first (a recomputed anchor block may become a standby and take
  // the indexed copy's key, which the others cache after).
  for (AttentionGroup* g : attention_) {
    if (g->kind() == AttentionKind::kFull) offer_order_.push_back(g);
  }
  for (AttentionGroup* g : attention_) {
    if (g->kind() != AttentionKind::kFull) offer_order_.push_back(g);
  }
  if (groups_.size() == 1 && groups_[0]->kind() == AttentionKind::kFull) {
    sole_full_pool_ = &anchor_->device();
  }
  buries_ = !followers_.empty() && anchor_ != nullptr;
  plans_.resize(groups_.size());
  shared_.ledger = StepLedger(layer_groups);
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
