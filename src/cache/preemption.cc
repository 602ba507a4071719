// KvCacheManager: making room under memory pressure. Claims released, sequences preempted
// by recompute or swapped to the host pool, and swapped ones brought back. Whom to choose
// is the preemption policy's (preemption_policy.h); carrying it out is here.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/preemption_policy.h"
#include "cache/sequence.h"
#include "cache/step_ledger.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "pagedkv/kv_cache_manager.h"

namespace pagedkv {

using internal::Sequence;
using internal::state_name;

absl::StatusOr<std::span<const int64_t>> KvCacheManager::allocate_slots_or_preempt(
    SeqId seq, int32_t num_new_tokens, int32_t num_lookahead) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "allocate_slots_or_preempt"));
  while (true) {
    auto slots = allocate_slots_impl(*s, num_new_tokens, num_lookahead);
    if (slots.ok() || !absl::IsResourceExhausted(slots.status())) return slots;
    if (release_one_claim(seq)) continue;
    const std::optional<Preemption> choice = choose_victim(seq);
    if (!choice.has_value()) return slots.status();
    PAGEDKV_RETURN_IF_ERROR(preempt(choice->victim, choice->mode));
  }
}

// --- preemption ------------------------------------------------------------------------

bool KvCacheManager::release_one_claim(SeqId requester) {
  Sequence* chosen = internal::claim_to_release(sequences_, requester, device_pool_);
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
  return internal::choose_victim(candidates, requester, options_.victim_policy,
                                 options_.preemption_mode, host_pool_.num_free_blocks(),
                                 options_.block_size);
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
  const int32_t bs = options_.block_size;
  if (mode == PreemptionMode::kSwap) {
    const auto needed = num_blocks_for_tokens(s->num_computed, bs);
    if (needed > host_pool_.num_free_blocks()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("preempt(seq ", seq, ", swap): need ", needed, " host blocks, ",
                       host_pool_.num_free_blocks(), " free of ", options_.num_host_blocks));
    }
    s->host_blocks.resize(needed);
    PAGEDKV_CHECK(host_pool_.allocate(s->host_blocks).ok());
    for (int32_t i = 0; i < needed; ++i) {
      const int32_t valid = std::min(bs, s->num_computed - i * bs);
      // The device source is released below on purpose: swap-out runs first in a step.
      ledger_->record(internal::kSwapOut, {s->blocks[i], s->host_blocks[i], valid});
    }
    counters_.blocks_swapped_out += needed;
    ++counters_.preemptions_swap;
    release_device_blocks(*s);
    set_state(*s, SequenceState::kSwapped);
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

absl::Status KvCacheManager::swap_in(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "swap_in"));
  if (s->state != SequenceState::kSwapped) {
    return absl::FailedPreconditionError(absl::StrCat("swap_in(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not swapped"));
  }
  const auto needed = static_cast<int32_t>(s->host_blocks.size());
  if (needed > device_pool_.num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("swap_in(seq ", seq, "): need ", needed,
                                                     " blocks, ", device_pool_.num_free_blocks(),
                                                     " free of ", options_.num_blocks));
  }
  s->blocks.resize(needed);
  allocate_device_blocks(s->blocks);
  const int32_t bs = options_.block_size;
  for (int32_t i = 0; i < needed; ++i) {
    const int32_t valid = std::min(bs, s->num_computed - i * bs);
    ledger_->record(internal::kSwapIn, {s->host_blocks[i], s->blocks[i], valid});
    ledger_->mark_filled_by_copy(s->blocks[i]);
  }
  counters_.blocks_swapped_in += needed;
  release_host_blocks(*s);
  set_state(*s, SequenceState::kRunning);
  ledger_->mark_scheduled(*s, /*settled_tokens=*/0);  // nothing is on the device before swap-in
  offer_computed_blocks(*s);
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
  counters_.claims_released += !seq.blocks.empty();
  unshare_unwritten_blocks(seq);
  release_device_blocks(seq);
  seq.num_computed = 0;
  seq.num_offered_blocks = 0;
  seq.kv_before_reset = false;
  internal::StepLedger::unschedule(seq);
}

}  // namespace pagedkv
