// CacheCoordinator::check_invariants(): every clause of DESIGN.md's invariants that spans
// sequences and pools, one clause at a time and group by group (each group checks its
// tables and pools: group_cache.h), then the step ledger's.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

namespace {

template <typename... Parts>
absl::Status broken(const Parts&... parts) {
  return absl::InternalError(absl::StrCat("KvCacheManager invariant: ", parts...));
}

absl::Status check_tokens(const Sequence& s, int32_t block_size, int32_t max_model_len) {
  const auto num_tokens = static_cast<int64_t>(s.tokens.size());
  if (num_tokens < 1 || num_tokens > max_model_len) {
    return broken("seq ", s.id, ": ", num_tokens, " tokens outside [1, ", max_model_len, "]");
  }
  if (s.num_computed < 0 || s.num_computed > num_tokens) {
    return broken("seq ", s.id, ": ", s.num_computed, " computed of ", num_tokens, " tokens");
  }
  if (s.num_draft < 0 || s.num_draft > s.num_computed ||
      (s.num_draft > 0 && s.state != SequenceState::kRunning)) {
    return broken("seq ", s.id, " ", state_name(s.state), ": ", s.num_draft, " drafts of ",
                  s.num_computed, " computed tokens");
  }
  // A pending import is running, holds no drafts and is not yet verified (offers stop
  // before it, below).
  if (s.num_importing < 0 || s.num_importing > s.num_computed ||
      (s.num_importing > 0 && (s.state != SequenceState::kRunning || s.num_draft > 0))) {
    return broken("seq ", s.id, " ", state_name(s.state), ": ", s.num_importing,
                  " imported tokens pending of ", s.num_computed, " computed, ", s.num_draft,
                  " drafts");
  }
  // Drafts and pending imports are never offered: only verified full blocks are.
  if (s.num_offered_blocks > verified_tokens(s) / block_size) {
    return broken("seq ", s.id, ": ", s.num_offered_blocks, " blocks offered to the index but ",
                  verified_tokens(s) / block_size, " full verified blocks");
  }
  return absl::OkStatus();
}

}  // namespace

// What decode_in_place() trusts without reading the ref count: a block a sequence found
// unshared at the device pool's current share epoch, and still holds, is held once.
absl::Status CacheCoordinator::check_exclusive_block(const Sequence& s) const {
  const BlockPoolCore& pool = groups_[0]->device();
  if (s.exclusive_epoch != pool.share_epoch()) return absl::OkStatus();
  const std::vector<BlockId>& blocks = s.tables[0].blocks;
  if (std::find(blocks.begin(), blocks.end(), s.exclusive_block) == blocks.end()) {
    return absl::OkStatus();
  }
  if (pool.ref_count_unchecked(s.exclusive_block) != 1) {
    return broken("seq ", s.id, ": block ", s.exclusive_block, " found unshared at share epoch ",
                  s.exclusive_epoch, " has ref_count ",
                  pool.ref_count_unchecked(s.exclusive_block));
  }
  return absl::OkStatus();
}

absl::Status CacheCoordinator::check_invariants() const {
  for (const auto& g : groups_) {
    // A shared pool is checked once, with its first group.
    if (!shared_.options.shared_block_pool || g->index() == 0) {
      PAGEDKV_RETURN_IF_ERROR(g->device().check_invariants());
    }
    PAGEDKV_RETURN_IF_ERROR(g->host().check_invariants());
  }
  std::vector<const Sequence*> sequences;
  sequences.reserve(sequences_.size());
  for (const auto& [id, s] : sequences_) {
    if (s->id != id) return broken("sequence stored under id ", id, " has id ", s->id);
    if (s->tables.size() != groups_.size()) {
      return broken("seq ", id, ": ", s->tables.size(), " tables for ", groups_.size(), " groups");
    }
    PAGEDKV_RETURN_IF_ERROR(check_tokens(*s, shared_.block_size, shared_.options.max_model_len));
    PAGEDKV_RETURN_IF_ERROR(check_exclusive_block(*s));
    for (const auto& g : groups_) PAGEDKV_RETURN_IF_ERROR(g->check_table(*s));
    sequences.push_back(s.get());
  }
  const auto running = std::count_if(sequences.begin(), sequences.end(), [](const Sequence* s) {
    return s->state == SequenceState::kRunning;
  });
  if (running != shared_.num_running) {
    return broken("num_running ", shared_.num_running, " but ", running, " sequences running");
  }
  std::vector<const GroupCache*> all_groups;
  for (const auto& g : groups_) all_groups.push_back(g.get());
  for (const auto& g : groups_) {
    const GroupCache* self = g.get();
    const std::span<const GroupCache* const> device_sharers =
        !shared_.options.shared_block_pool ? std::span<const GroupCache* const>(&self, 1)
        : g->index() == 0                  ? std::span<const GroupCache* const>(all_groups)
                                           : std::span<const GroupCache* const>();
    PAGEDKV_RETURN_IF_ERROR(g->check_pools(sequences, device_sharers));
  }
  return shared_.ledger.check_invariants(
      [this](int32_t group) -> const BlockPoolCore& { return groups_[group]->device(); });
}

}  // namespace pagedkv::internal
