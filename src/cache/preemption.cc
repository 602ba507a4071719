// KvCacheManager: making room under memory pressure. Claims released, sequences preempted
// by recompute or swapped to the host pool, and swapped ones brought back. Whom to choose
// is the preemption policy's (preemption_policy.h); carrying it out is here.
#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "cache/group_pools.h"
#include "cache/preemption_policy.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::GroupPools;
using internal::GroupTable;
using internal::Hold;
using internal::Sequence;
using internal::state_name;

namespace {

// The entries of `s`'s table in `g` that a swap copies to host blocks: those holding
// computed tokens, or a state group's slot.
int32_t held_entries(const Sequence& s, const GroupPools& g, int32_t block_size) {
  const GroupTable& t = s.tables[g.index];
  if (g.holds_state()) return static_cast<int32_t>(t.blocks.size());
  return num_blocks_for_tokens(s.num_computed, block_size) - t.first_held;
}

}  // namespace

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots_or_preempt(
    SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "allocate_slots_or_preempt"));
  return allocate_or_preempt_impl(*s, num_new_tokens, num_lookahead);
}

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_or_preempt_impl(
    Sequence& seq, int32_t num_new_tokens, int32_t num_lookahead) {
  while (true) {
    auto slots = allocate_slots_impl(seq, num_new_tokens, num_lookahead);
    if (slots.ok() || !absl::IsResourceExhausted(slots.status())) return slots;
    if (release_one_claim(seq.id)) continue;
    const std::optional<Preemption> choice = choose_victim(seq.id);
    if (!choice.has_value()) return slots.status();
    PAGEDKV_RETURN_IF_ERROR(preempt(choice->victim, choice->mode));
  }
}

// --- preemption ------------------------------------------------------------------------

bool KvCacheManager::release_one_claim(SeqId requester) {
  Sequence* chosen = internal::claim_to_release(sequences_, requester, groups_);
  if (chosen == nullptr) return false;
  drop_claim(*chosen);
  if (options_.preemption_hooks != nullptr)
    options_.preemption_hooks->on_claim_released(chosen->id);
  return true;
}

std::optional<Preemption> KvCacheManager::choose_victim(SeqId requester) const {
  std::vector<SequenceInfo> candidates = running_sequences();
  std::erase_if(candidates, [&](const SequenceInfo& info) {
    return info.id == requester || ledger_->scheduled(*find(info.id));
  });
  // Whether every group's host pool can take the sequence's held blocks.
  auto fits_host = [this](SeqId id) {
    const Sequence& s = *find(id);
    return std::all_of(groups_.begin(), groups_.end(), [&](const GroupPools& g) {
      return held_entries(s, g, options_.block_size) <= g.host.num_free_blocks();
    });
  };
  return internal::choose_victim(candidates, requester, options_.victim_policy,
                                 options_.preemption_mode, fits_host);
}

absl::Status KvCacheManager::preempt(SeqId seq, PreemptionMode mode) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "preempt"));
  if (s->state != SequenceState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat("preempt(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not running"));
  }
  if (ledger_->scheduled(*s)) {
    return absl::FailedPreconditionError(
        absl::StrCat("preempt(seq ", seq,
                     "): sequence was scheduled in this step and its K/V "
                     "is not written yet; preempt it before scheduling it, or in a later step"));
  }
  if (mode == PreemptionMode::kSwap) {
    PAGEDKV_RETURN_IF_ERROR(swap_out(*s));
  } else {
    release_device_blocks(*s);
    s->num_computed = 0;
    s->kv_before_reset = false;  // recomputed from scratch
    set_state(*s, SequenceState::kWaiting);
    ++counters_.preemptions_recompute;
  }
  s->num_offered_blocks = 0;
  s->preempted_batch = batch_id_;
  if (options_.preemption_hooks != nullptr) options_.preemption_hooks->on_preempt(seq, mode);
  return absl::OkStatus();
}

// Copies the held blocks of every group that hold computed tokens to host blocks of the
// same group, then frees the device blocks: the sequence is swapped.
absl::Status KvCacheManager::swap_out(Sequence& s) {
  const int32_t bs = options_.block_size;
  for (const GroupPools& g : groups_) {
    const int32_t needed = held_entries(s, g, options_.block_size);
    if (needed > g.host.num_free_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("preempt(seq ", s.id, ", swap): need ", needed, " host blocks",
                       groups_.size() > 1 ? absl::StrCat(" in group ", g.index) : "", ", ",
                       g.host.num_free_blocks(), " free of ", g.spec.num_host_blocks));
    }
  }
  for (GroupPools& g : groups_) {
    GroupTable& t = s.tables[g.index];
    t.host_blocks.resize(held_entries(s, g, options_.block_size));
    g.host.allocate_unchecked(t.host_blocks);
    const int32_t end = t.first_held + static_cast<int32_t>(t.host_blocks.size());
    for (int32_t i = t.first_held; i < end; ++i) {
      const int32_t valid = g.holds_state() ? bs : std::min(bs, s.num_computed - i * bs);
      // The device source is released below on purpose: swap-out runs first in a step.
      ledger_->record(internal::kSwapOut,
                      {t.blocks[i], t.host_blocks[i - t.first_held], valid, g.index});
    }
    counters_.blocks_swapped_out += std::ssize(t.host_blocks);
  }
  ++counters_.preemptions_swap;
  // release_device_blocks() forgets where the tables started; swap_in() needs it.
  absl::InlinedVector<int32_t, 2> first_held;
  for (const GroupTable& t : s.tables) first_held.push_back(t.first_held);
  release_device_blocks(s);
  for (size_t g = 0; g < groups_.size(); ++g) s.tables[g].first_held = first_held[g];
  set_state(s, SequenceState::kSwapped);
  return absl::OkStatus();
}

absl::Status KvCacheManager::swap_in(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "swap_in"));
  if (s->state != SequenceState::kSwapped) {
    return absl::FailedPreconditionError(absl::StrCat("swap_in(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not swapped"));
  }
  for (const GroupPools& g : groups_) {
    const auto needed = static_cast<int32_t>(s->tables[g.index].host_blocks.size());
    if (needed > g.device.num_free_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("swap_in(seq ", seq, "): need ", needed, " blocks",
                       groups_.size() > 1 ? absl::StrCat(" in group ", g.index) : "", ", ",
                       g.device.num_free_blocks(), " free of ", g.spec.num_blocks));
    }
  }
  const int32_t bs = options_.block_size;
  for (GroupPools& g : groups_) {
    GroupTable& t = s->tables[g.index];
    const auto needed = static_cast<int32_t>(t.host_blocks.size());
    t.blocks.assign(t.first_held + needed, kNoBlock);
    allocate_device_blocks(g, std::span(t.blocks).subspan(t.first_held));
    for (int32_t j = 0; j < needed; ++j) {
      const int32_t i = t.first_held + j;
      const int32_t valid = g.holds_state() ? bs : std::min(bs, s->num_computed - i * bs);
      ledger_->record(internal::kSwapIn, {t.host_blocks[j], t.blocks[i], valid, g.index});
      ledger_->mark_filled_by_copy(g.index, t.blocks[i]);
    }
    counters_.blocks_swapped_in += needed;
  }
  release_host_blocks(*s);
  set_state(*s, SequenceState::kRunning);
  ledger_->mark_scheduled(*s, /*settled_tokens=*/0);  // nothing is on the device before swap-in
  offer_computed_blocks(*s);
  if (buries_) bury_dead_windows();
  return absl::OkStatus();
}

absl::Status KvCacheManager::release_claim(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "release_claim"));
  if (s->state != SequenceState::kWaiting) {
    return absl::FailedPreconditionError(absl::StrCat("release_claim(seq ", seq, "): sequence is ",
                                                      state_name(s->state),
                                                      "; only a waiting sequence holds a claim"));
  }
  drop_claim(*s);
  return absl::OkStatus();
}

void KvCacheManager::drop_claim(Sequence& seq) {
  counters_.claims_released += !seq.tables[0].blocks.empty();
  unshare_unwritten_blocks(seq);
  release_device_blocks(seq);
  seq.num_computed = 0;
  seq.num_offered_blocks = 0;
  seq.kv_before_reset = false;
  internal::StepLedger::unschedule(seq);
  if (buries_) bury_dead_windows();
}

}  // namespace pagedkv
