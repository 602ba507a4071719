// CacheCoordinator's speculative decoding: slots for a step's draft tokens, and the verdict
// that keeps the accepted ones and rolls the rest back. Drafts count as computed for the
// step (their K/V is written) but are never verified until accepted: offers, events and
// checkpoints stop before them (verified_tokens()).
#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::allocate_draft_slots(
    SeqId seq, int32_t num_new_tokens, std::span<const TokenId> draft) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "allocate_draft_slots"));
  return allocate_draft_slots_impl(*s, num_new_tokens, draft);
}

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::allocate_draft_slots_impl(
    Sequence& s, int32_t num_new_tokens, std::span<const TokenId> draft) {
  if (awaits_verdict(s)) return verdict_wait(s, "allocate_draft_slots");
  const auto num_tokens = static_cast<int64_t>(s.tokens.size());
  // The drafts follow the sequence's last token, which this step computes.
  if (num_new_tokens < 1 || draft.empty() ||
      s.num_computed + int64_t{num_new_tokens} != num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_draft_slots(seq ", s.id, "): ", num_new_tokens, " new tokens and ",
                     draft.size(), " drafts; need the sequence's ", num_tokens - s.num_computed,
                     " uncomputed tokens (at least 1) and at least 1 draft after them"));
  }
  if (num_tokens + std::ssize(draft) > shared_.options.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_draft_slots(seq ", s.id, "): ", num_tokens, " + ", draft.size(),
                     " drafts exceeds max_model_len ", shared_.options.max_model_len));
  }
  s.tokens.insert(s.tokens.end(), draft.begin(), draft.end());
  const auto num_draft = static_cast<int32_t>(draft.size());
  auto slots = allocate_slots_impl(s, num_new_tokens + num_draft, 0, num_draft);
  if (!slots.ok()) {
    s.tokens.resize(static_cast<size_t>(num_tokens));  // nothing else changed
    return slots.status();
  }
  shared_.counters.draft_tokens += num_draft;
  return slots;
}

absl::Status CacheCoordinator::accept_draft(SeqId seq, int32_t num_accepted) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "accept_draft"));
  if (s->num_draft == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("accept_draft(seq ", seq, "): the sequence holds no drafts"));
  }
  // Rejected drafts' blocks are released: their K/V must be written before another
  // sequence can get them.
  if (shared_.ledger.scheduled(*s)) {
    return absl::FailedPreconditionError(
        absl::StrCat("accept_draft(seq ", seq,
                     "): the step that writes its drafts' K/V has not ended; "
                     "accept after take_step_ops()"));
  }
  if (num_accepted < 0 || num_accepted > s->num_draft) {
    return absl::InvalidArgumentError(absl::StrCat("accept_draft(seq ", seq, "): num_accepted ",
                                                   num_accepted, " outside [0, ", s->num_draft,
                                                   "]"));
  }
  const int32_t rejected = s->num_draft - num_accepted;
  s->tokens.resize(s->tokens.size() - static_cast<size_t>(rejected));
  s->num_computed -= rejected;
  s->num_draft = 0;
  for (const auto& g : groups_) g->roll_back(*s, num_accepted);
  shared_.counters.accepted_draft_tokens += num_accepted;
  offer_computed_blocks(*s);
  if (buries_) bury_dead_contents();
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
