// CacheCoordinator's hand-offs (pagedkv/kv_handoff.h): an export pins a finished
// sequence's blocks for the transfer that reads them; an import admits a sequence whose
// first tokens a transfer fills, unverified (like drafts: verified_tokens()) until
// complete_import() counts the longest prefix every group serves and releases the rest.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/arithmetic.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

// --- the sender ----------------------------------------------------------------------------

absl::StatusOr<KvExport> CacheCoordinator::export_sequence(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "export_sequence"));
  if (shared_.pins.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "export_sequence(seq ", seq, "): an export of it is pinned; release_export() first"));
  }
  if (s->state != SequenceState::kRunning || s->num_computed == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("export_sequence(seq ", seq, "): sequence is ", state_name(s->state), " with ",
                     s->num_computed, " computed tokens"));
  }
  if (awaits_verdict(*s)) return verdict_wait(*s, "export_sequence");
  if (shared_.ledger.scheduled(*s)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export_sequence(seq ", seq,
        "): the step that writes its K/V has not ended; export after take_step_ops()"));
  }
  const int32_t bs = shared_.block_size;
  hash_full_blocks(*s, s->num_computed / bs, bs, shared_.options.hash_fn);
  KvExport out{
      .seq = seq,
      .tokens = {s->tokens.begin(), s->tokens.begin() + s->num_computed},
      .block_hashes = {s->block_hashes.begin(), s->block_hashes.begin() + s->num_computed / bs},
      .groups = {}};
  for (const auto& g : groups_) {
    out.groups.push_back(g->export_entries(*s));
    for (const BlockId b : out.groups.back().blocks) g->device().touch_unchecked(b);
  }
  shared_.pins.emplace(seq, out.groups);
  ++shared_.counters.exported_sequences;
  // The sequence ends as free() ends it; the pins keep its blocks.
  release(*s);
  set_state(*s, SequenceState::kWaiting);
  if (last_appended_ == s) last_appended_ = nullptr;
  sequences_.erase(seq);
  if (buries_) bury_dead_contents();
  return out;
}

absl::Status CacheCoordinator::release_export(SeqId seq) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  const auto it = shared_.pins.find(seq);
  if (it == shared_.pins.end()) {
    return absl::NotFoundError(absl::StrCat("release_export(seq ", seq, "): no export pinned"));
  }
  for (const auto& g : groups_) g->release_blocks(it->second[g->index()].blocks);
  shared_.pins.erase(it);
  if (buries_) bury_dead_contents();
  return absl::OkStatus();
}

// --- the receiver --------------------------------------------------------------------------

absl::StatusOr<KvImport> CacheCoordinator::import_slots(SeqId seq, int32_t num_tokens) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "import_slots"));
  if (s->state != SequenceState::kWaiting) {
    return absl::FailedPreconditionError(absl::StrCat("import_slots(seq ", seq, "): sequence is ",
                                                      state_name(s->state), ", not waiting"));
  }
  const int32_t local = s->num_computed;  // match_prefix()'s claim
  if (num_tokens <= local || num_tokens > std::ssize(s->tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("import_slots(seq ", seq, "): num_tokens ",
                                                   num_tokens, " outside (", local, ", ",
                                                   s->tokens.size(), "]: (claimed, tokens]"));
  }
  PAGEDKV_RETURN_IF_ERROR(
      allocate_slots_impl(*s, num_tokens - local, 0, /*num_draft=*/0, /*import=*/true).status());
  KvImport out{.num_local_tokens = local, .num_tokens = num_tokens, .groups = {}};
  for (const auto& g : groups_) {
    g->release_unimported(*s);
    out.groups.push_back(g->import_entries(*s));
  }
  return out;
}

int32_t CacheCoordinator::servable_import_prefix(const Sequence& seq,
                                                 std::span<const int32_t> verified_blocks) const {
  const int32_t bs = shared_.block_size;
  auto served = [&](int32_t p) {
    return std::all_of(groups_.begin(), groups_.end(), [&](const auto& g) {
      return g->serves_import(seq, p, verified_blocks[g->index()]);
    });
  };
  if (served(seq.num_computed)) return seq.num_computed;
  // Else block boundaries, longest first; 0 serves always.
  for (int32_t p = (seq.num_computed - 1) / bs * bs; p > 0; p -= bs) {
    if (served(p)) return p;
  }
  return 0;
}

absl::StatusOr<int32_t> CacheCoordinator::complete_import(
    SeqId seq, std::span<const int32_t> verified_blocks) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_ASSIGN_OR_RETURN(Sequence * s, find_or_error(seq, "complete_import"));
  if (s->num_importing == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("complete_import(seq ", seq, "): no import is pending"));
  }
  // Released blocks must have been filled by nothing the step's ops still do.
  if (shared_.ledger.scheduled(*s)) {
    return absl::FailedPreconditionError(
        absl::StrCat("complete_import(seq ", seq,
                     "): the step of its import_slots() has not ended; the transfer starts "
                     "after take_step_ops()"));
  }
  if (std::ssize(verified_blocks) != num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("complete_import(seq ", seq, "): ", verified_blocks.size(),
                     " verified counts for ", num_groups(), " layer groups"));
  }
  for (const auto& g : groups_) {
    const int32_t verified = verified_blocks[g->index()];
    const auto entries = static_cast<int32_t>(g->import_entries(*s).blocks.size());
    if (verified < 0 || verified > entries) {
      return absl::InvalidArgumentError(
          absl::StrCat("complete_import(seq ", seq, "): ", verified, " verified blocks in group ",
                       g->index(), " outside [0, ", entries, "], the entries it imports"));
    }
  }
  const int32_t brought = s->num_importing;
  const int32_t local = s->num_computed - brought;
  const int32_t p = servable_import_prefix(*s, verified_blocks);
  s->num_importing = 0;
  if (p == 0) {
    // Nothing is held that computing from the start would use: waiting, as after a
    // preemption by recompute (a local claim is given back too).
    release(*s);
    s->num_computed = 0;
    s->num_offered_blocks = 0;
    set_state(*s, SequenceState::kWaiting);
  } else {
    s->num_computed = p;
    for (const auto& g : groups_) g->roll_back(*s, 0);
    offer_computed_blocks(*s);
  }
  const int32_t counted = std::max(0, p - local);
  shared_.counters.imported_tokens += counted;
  shared_.counters.discarded_import_tokens += brought - counted;
  if (buries_) bury_dead_contents();
  return p;
}

}  // namespace pagedkv::internal
