// Internal: builds one layer group of a manager: its pools (with the roles its kind and
// place give them), its host tier, its share of the watermark and the class of its kind
// (group_cache.h). CacheCoordinator builds its groups with it, and the kinds' tests theirs.
#ifndef PAGEDKV_CACHE_GROUP_FACTORY_H_
#define PAGEDKV_CACHE_GROUP_FACTORY_H_

#include <cstddef>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "cache/full_attention_group.h"
#include "cache/group_cache.h"
#include "pagedkv/layer_group.h"

namespace pagedkv::internal {

// Group `i` of `groups`, sharing `shared` (whose options are the manager's, validated).
// `anchor`: the model's first full-attention group, built before the others (null when
// building it, and in a model without one). Errors: ResourceExhausted or InvalidArgument
// from the pools' creation (BlockPool's limits).
absl::StatusOr<std::unique_ptr<GroupCache>> make_group_cache(std::span<const LayerGroup> groups,
                                                             size_t i, SharedState& shared,
                                                             const FullAttentionGroup* anchor);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_CACHE_GROUP_FACTORY_H_
