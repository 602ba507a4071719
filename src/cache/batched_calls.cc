// CacheCoordinator's batched step calls: one call per step for every running sequence,
// each sequence succeeding or failing on its own as the single call would.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/cache_coordinator.h"
#include "common/status_macros.h"

namespace pagedkv::internal {

absl::StatusOr<KvCacheManager::SlotBatch> CacheCoordinator::allocate_slots_batch(
    std::span<const SeqId> seqs, std::span<const int32_t> num_new_tokens, int32_t num_lookahead,
    bool preempt) {
  PAGEDKV_CHECK_INVARIANTS_ON_EXIT();
  const size_t n = seqs.size();
  if (num_new_tokens.size() != 1 && num_new_tokens.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocate_slots_batch: ", num_new_tokens.size(), " num_new_tokens for ", n,
                     " sequences; give one per sequence or one for all"));
  }
  const auto count_of = [&](size_t i) {
    return num_new_tokens[num_new_tokens.size() == 1 ? 0 : i];
  };
  // Every count is checked before the slot buffer is sized: no sequence holds more than
  // max_model_len tokens, so a larger count could never succeed.
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    if (count_of(i) > shared_.options.max_model_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("allocate_slots_batch(seq ", seqs[i], "): num_new_tokens ", count_of(i),
                       " exceeds max_model_len ", shared_.options.max_model_len));
    }
    total += std::max(count_of(i), 0);
  }
  const size_t num_groups = groups_.size();
  batch_slots_.resize(static_cast<size_t>(total) * num_groups);
  batch_statuses_.assign(n, absl::OkStatus());
  ++shared_.batch_id;  // sequences preempted from here on carry this id
  int32_t num_failed = 0;
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t count = count_of(i);
    // One lookup per sequence: the single calls' errors for an unknown one.
    Sequence* s = find(seqs[i]);
    absl::StatusOr<std::span<const int64_t>> slots =
        s == nullptr
            ? find_or_error(seqs[i], preempt ? "allocate_slots_or_preempt" : "allocate_slots")
                  .status()
        : s->preempted_batch == shared_.batch_id
            ? absl::FailedPreconditionError(
                  absl::StrCat("allocate_slots_batch(seq ", seqs[i],
                               "): preempted by an earlier sequence of this batch"))
        : preempt ? allocate_or_preempt_impl(*s, count, num_lookahead)
                  : allocate_slots_impl(*s, count, num_lookahead);
    // Each group's slots go to its part of batch_slots_; slot_mapping_ holds them group
    // after group, `n` each (group 0's are the call's result).
    const auto n = static_cast<size_t>(std::max(count, 0));
    int64_t* out = batch_slots_.data() + offset;
    if (slots.ok()) {
      std::copy(slots->begin(), slots->end(), out);
      for (size_t g = 1; g < num_groups; ++g) {
        std::copy_n(slot_mapping_.data() + g * n, n, out + static_cast<int64_t>(g) * total);
      }
    } else {
      for (size_t g = 0; g < num_groups; ++g, out += total) std::fill_n(out, n, int64_t{-1});
      batch_statuses_[i] = std::move(slots).status();
      ++num_failed;
    }
    offset += static_cast<int64_t>(n);
  }
  return KvCacheManager::SlotBatch{std::span<const int64_t>(batch_slots_).first(total),
                                   batch_statuses_, num_failed};
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
    if (indptr.size() != n + 1) {
      return absl::InvalidArgumentError(absl::StrCat("append_tokens_batch: ", indptr.size(),
                                                     " indptr entries for ", n, " sequences"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (indptr[i] < 0 || indptr[i] > indptr[i + 1] ||
          static_cast<size_t>(indptr[i + 1]) > tokens.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("append_tokens_batch: indptr[", i, ":", i + 2, "] = [", indptr[i], ", ",
                         indptr[i + 1], "] is not a range of the ", tokens.size(), " tokens"));
      }
    }
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
