// CacheCoordinator: making room under memory pressure. Claims released, sequences preempted
// by recompute or swapped to the host pools, and swapped ones brought back. Whom to choose
// is the preemption policy's (preemption_policy.h); carrying it out is here.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "cache/preemption_policy.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::allocate_slots_or_preempt(
    SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "allocate_slots_or_preempt"));
  return allocate_or_preempt_impl(*s, num_new_tokens, num_lookahead);
}

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::allocate_or_preempt_impl(
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

// --- preemption ----------------------------------------------------------------------------

bool CacheCoordinator::release_one_claim(SeqId requester) {
  Sequence* chosen = claim_to_release(sequences_, requester, [this](const Sequence& s) {
    return std::any_of(groups_.begin(), groups_.end(),
                       [&](const auto& g) { return g->holds_a_block_alone(s); });
  });
  if (chosen == nullptr) return false;
  drop_claim(*chosen);
  if (shared_.options.preemption_hooks != nullptr) {
    shared_.options.preemption_hooks->on_claim_released(chosen->id);
  }
  return true;
}

std::optional<Preemption> CacheCoordinator::choose_victim(SeqId requester) const {
  std::vector<SequenceInfo> candidates = running_sequences();
  std::erase_if(candidates, [&](const SequenceInfo& info) {
    const Sequence& s = *find(info.id);
    return info.id == requester || shared_.ledger.scheduled(s) || awaits_verdict(s);
  });
  // Whether every group's host pool can take the sequence's held blocks.
  auto fits_host = [this](SeqId id) {
    const Sequence& s = *find(id);
    return std::all_of(groups_.begin(), groups_.end(), [&](const auto& g) {
      return g->held_entries(s) <= g->host().num_free_blocks();
    });
  };
  return internal::choose_victim(candidates, requester, shared_.options.victim_policy,
                                 shared_.options.preemption_mode, fits_host);
}

absl::Status CacheCoordinator::preempt(SeqId seq, PreemptionMode mode) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "preempt"));
  if (s->state != SequenceState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat("preempt(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not running"));
  }
  if (awaits_verdict(*s)) return verdict_wait(*s, "preempt");
  if (shared_.ledger.scheduled(*s)) {
    return absl::FailedPreconditionError(
        absl::StrCat("preempt(seq ", seq,
                     "): sequence was scheduled in this step and its K/V "
                     "is not written yet; preempt it before scheduling it, or in a later step"));
  }
  if (mode == PreemptionMode::kSwap) {
    PAGEDKV_RETURN_IF_ERROR(swap_out(*s));
  } else {
    release(*s);
    s->num_computed = 0;
    s->kv_before_reset = false;  // recomputed from scratch
    set_state(*s, SequenceState::kWaiting);
    ++shared_.counters.preemptions_recompute;
  }
  s->num_offered_blocks = 0;
  s->preempted_batch = shared_.batch_id;
  if (shared_.options.preemption_hooks != nullptr) {
    shared_.options.preemption_hooks->on_preempt(seq, mode);
  }
  return absl::OkStatus();
}

// Copies the held blocks of every group that hold computed tokens to host blocks of the
// same group, then frees the device blocks: the sequence is swapped.
absl::Status CacheCoordinator::swap_out(Sequence& s) {
  for (const auto& g : groups_) {
    const int32_t needed = g->held_entries(s);
    if (needed > g->host().num_free_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("preempt(seq ", s.id, ", swap): need ", needed, " host blocks",
                       num_groups() > 1 ? absl::StrCat(" in group ", g->index()) : "", ", ",
                       g->host().num_free_blocks(), " free of ", g->spec().num_host_blocks));
    }
  }
  for (const auto& g : groups_) g->swap_out(s);
  ++shared_.counters.preemptions_swap;
  set_state(s, SequenceState::kSwapped);
  return absl::OkStatus();
}

absl::Status CacheCoordinator::swap_in(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "swap_in"));
  if (s->state != SequenceState::kSwapped) {
    return absl::FailedPreconditionError(absl::StrCat("swap_in(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not swapped"));
  }
  for (const auto& g : groups_) {
    const auto needed = static_cast<int32_t>(s->tables[g->index()].host_blocks.size());
    if (needed > g->device().num_free_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("swap_in(seq ", seq, "): need ", needed, " blocks",
                       num_groups() > 1 ? absl::StrCat(" in group ", g->index()) : "", ", ",
                       g->device().num_free_blocks(), " free of ", g->spec().num_blocks));
    }
  }
  for (const auto& g : groups_) g->swap_in(*s);
  for (const auto& g : groups_) g->release_host(*s);
  set_state(*s, SequenceState::kRunning);
  shared_.ledger.mark_scheduled(*s, /*settled_tokens=*/0);  // nothing is on the device before
  offer_computed_blocks(*s);
  if (buries_) bury_dead_contents();
  return absl::OkStatus();
}

// --- claims --------------------------------------------------------------------------------

absl::Status CacheCoordinator::release_claim(SeqId seq) {
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

void CacheCoordinator::drop_claim(Sequence& seq) {
  shared_.counters.claims_released += !seq.tables[0].blocks.empty();
  uncache_unwritten(seq);
  release(seq);
  seq.num_computed = 0;
  seq.num_offered_blocks = 0;
  seq.kv_before_reset = false;
  StepLedger::unschedule(seq);
  if (buries_) bury_dead_contents();
}

}  // namespace pagedkv::internal
