// CacheCoordinator's batched step calls: one call per step for every running sequence,
// each sequence succeeding or failing on its own as the single call would.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

namespace {

// `indptr`: num_seqs + 1 ascending offsets into a list of `size` tokens.
absl::Status check_indptr(const char* caller, size_t num_seqs, std::span<const int32_t> indptr,
                          size_t size) {
  if (indptr.size() != num_seqs + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": ", indptr.size(), " indptr entries for ", num_seqs, " sequences"));
  }
  for (size_t i = 0; i < num_seqs; ++i) {
    if (indptr[i] < 0 || indptr[i] > indptr[i + 1] || static_cast<size_t>(indptr[i + 1]) > size) {
      return absl::InvalidArgumentError(absl::StrCat(caller, ": indptr[", i, ":", i + 2, "] = [",
                                                     indptr[i], ", ", indptr[i + 1],
                                                     "] is not a range of the ", size, " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CacheCoordinator::check_batch_counts(const char* caller, std::span<const SeqId> seqs,
                                                  std::span<const int32_t> counts) const {
  if (counts.size() != 1 && counts.size() != seqs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": ", counts.size(), " num_new_tokens for ", seqs.size(),
                     " sequences; give one per sequence or one for all"));
  }
  // No sequence holds more than max_model_len tokens, so a larger count could never
  // succeed: refused before the slot buffer is sized.
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t count = counts[counts.size() == 1 ? 0 : i];
    if (count > shared_.options.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat(caller, "(seq ", seqs[i], "): num_new_tokens ",
                                                     count, " exceeds max_model_len ",
                                                     shared_.options.max_model_len));
    }
  }
  return absl::OkStatus();
}

template <typename Entries, typename Allocate>
absl::StatusOr<KvCacheManager::SlotBatch> CacheCoordinator::slot_batch(std::span<const SeqId> seqs,
                                                                       const char* batch_caller,
                                                                       const char* caller,
                                                                       Entries entries,
                                                                       Allocate allocate) {
  const size_t n = seqs.size();
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += entries(i);
  const size_t num_groups = groups_.size();
  batch_slots_.resize(static_cast<size_t>(total) * num_groups);
  batch_statuses_.assign(n, absl::OkStatus());
  ++shared_.batch_id;  // sequences preempted from here on carry this id
  int32_t num_failed = 0;
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    // One lookup per sequence: the single calls' errors for an unknown one.
    Sequence* s = find(seqs[i]);
    absl::StatusOr<std::span<const int64_t>> slots =
        s == nullptr ? find_or_error(seqs[i], caller).status()
        : s->preempted_batch == shared_.batch_id
            ? absl::FailedPreconditionError(
                  absl::StrCat(batch_caller, "(seq ", seqs[i],
                               "): preempted by an earlier sequence of this batch"))
            : allocate(i, *s);
    // Each group's slots go to its part of batch_slots_; slot_mapping_ holds them group
    // after group, `mine` each (group 0's are the call's result).
    const auto mine = static_cast<size_t>(entries(i));
    int64_t* out = batch_slots_.data() + offset;
    if (slots.ok()) {
      std::copy(slots->begin(), slots->end(), out);
      for (size_t g = 1; g < num_groups; ++g) {
        std::copy_n(slot_mapping_.data() + g * mine, mine, out + static_cast<int64_t>(g) * total);
      }
    } else {
      for (size_t g = 0; g < num_groups; ++g, out += total) std::fill_n(out, mine, int64_t{-1});
      batch_statuses_[i] = std::move(slots).status();
      ++num_failed;
    }
    offset += static_cast<int64_t>(mine);
  }
  return KvCacheManager::SlotBatch{std::span<const int64_t>(batch_slots_).first(total),
                                   batch_statuses_, num_failed};
}

absl::StatusOr<KvCacheManager::SlotBatch> CacheCoordinator::allocate_slots_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens, int32_t num_lookahead,
    bool preempt) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  PAGEDKV_RETURN_IF_ERROR(check_batch_counts("allocate_slots_batch", seqs, num_new_tokens));
  const auto count_of = [&](size_t i) {
    return num_new_tokens[num_new_tokens.size() == 1 ? 0 : i];
  };
  return slot_batch(
      seqs, "allocate_slots_batch", preempt ? "allocate_slots_or_preempt" : "allocate_slots",
      [&](size_t i) { return std::max(count_of(i), 0); },
      [&](size_t i, Sequence& s) {
        return preempt ? allocate_or_preempt_impl(s, count_of(i), num_lookahead)
                       : allocate_slots_impl(s, count_of(i), num_lookahead);
      });
}

absl::StatusOr<KvCacheManager::SlotBatch> CacheCoordinator::allocate_draft_slots_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens,
    std::span<const TokenId> draft_tokens, std::span<const int32_t> draft_indptr) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  const size_t n = seqs.size();
  PAGEDKV_RETURN_IF_ERROR(check_batch_counts("allocate_draft_slots_batch", seqs, num_new_tokens));
  PAGEDKV_RETURN_IF_ERROR(
      check_indptr("allocate_draft_slots_batch", n, draft_indptr, draft_tokens.size()));
  const auto count_of = [&](size_t i) {
    return num_new_tokens[num_new_tokens.size() == 1 ? 0 : i];
  };
  const auto draft_of = [&](size_t i) {
    return draft_tokens.subspan(draft_indptr[i], draft_indptr[i + 1] - draft_indptr[i]);
  };
  return slot_batch(
      seqs, "allocate_draft_slots_batch", "allocate_draft_slots",
      [&](size_t i) { return std::max(count_of(i), 0) + std::ssize(draft_of(i)); },
      [&](size_t i, Sequence& s) {
        return allocate_draft_slots_impl(s, count_of(i), draft_of(i));
      });
}

absl::StatusOr<std::span<const absl::Status>> CacheCoordinator::accept_draft_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_accepted) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  if (num_accepted.size() != seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("accept_draft_batch: ", num_accepted.size(),
                                                   " num_accepted for ", seqs.size(),
                                                   " sequences"));
  }
  batch_statuses_.assign(seqs.size(), absl::OkStatus());
  for (size_t i = 0; i < seqs.size(); ++i) {
    batch_statuses_[i] = accept_draft(seqs[i], num_accepted[i]);
  }
  return std::span<const absl::Status>(batch_statuses_);
}

absl::StatusOr<std::span<const int64_t>> CacheCoordinator::batch_slot_mapping(int32_t group) const {
  PAGEDKV_RETURN_IF_ERROR(check_group(group, "batch_slot_mapping"));
  const size_t n = batch_slots_.size() / groups_.size();
  return std::span<const int64_t>(batch_slots_).subspan(n * group, n);
}

absl::StatusOr<std::span<const absl::Status>> CacheCoordinator::append_tokens_batch(
    std::span<const SeqId> seqs, std::span<const TokenId> tokens, std::span<const int32_t> indptr) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  const size_t n = seqs.size();
  if (indptr.empty() && tokens.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("append_tokens_batch: ", tokens.size(),
                                                   " tokens for ", n,
                                                   " sequences (one each without indptr)"));
  }
  if (!indptr.empty()) {
    PAGEDKV_RETURN_IF_ERROR(check_indptr("append_tokens_batch", n, indptr, tokens.size()));
  }
  batch_statuses_.assign(n, absl::OkStatus());
  for (size_t i = 0; i < n; ++i) {
    const std::span<const TokenId> mine =
        indptr.empty() ? tokens.subspan(i, 1)
                       : tokens.subspan(indptr[i], indptr[i + 1] - indptr[i]);
    batch_statuses_[i] = append_tokens(seqs[i], mine);
  }
  return std::span<const absl::Status>(batch_statuses_);
}

}  // namespace pagedkv::internal
