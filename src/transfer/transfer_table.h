// File: src/transfer/transfer_table.h
//
// What the sender and the receiver both do with the transfers they have in flight (a map
// from KvTransferId to a struct with a `deadline`) and the completions they have finished:
// which ids are due, the earliest deadline to wait for, and handing completions to poll().
#ifndef PAGEDKV_TRANSFER_TRANSFER_TABLE_H_
#define PAGEDKV_TRANSFER_TRANSFER_TABLE_H_

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transfer.h"

namespace pagedkv::internal {

// The ids of every transfer, and of those whose deadline is at or before `now`: the caller
// finishes them while iterating over the ids, not over the map it erases from.
template <typename Transfer>
std::vector<KvTransferId> transfer_ids(
    const absl::flat_hash_map<KvTransferId, Transfer>& transfers) {
  std::vector<KvTransferId> ids;
  for (const auto& [id, transfer] : transfers) ids.push_back(id);
  return ids;
}
template <typename Transfer>
std::vector<KvTransferId> due_transfer_ids(
    const absl::flat_hash_map<KvTransferId, Transfer>& transfers, absl::Time now) {
  std::vector<KvTransferId> ids;
  for (const auto& [id, transfer] : transfers) {
    if (transfer.deadline <= now) ids.push_back(id);
  }
  return ids;
}

// The earliest of `limit` and every transfer's deadline.
template <typename Transfer>
absl::Time earliest_deadline(const absl::flat_hash_map<KvTransferId, Transfer>& transfers,
                             absl::Time limit) {
  for (const auto& [id, transfer] : transfers) limit = std::min(limit, transfer.deadline);
  return limit;
}

// Moves the finished completions to `out`; returns how many.
template <typename Completion>
size_t hand_over(std::vector<Completion>& finished, std::vector<Completion>* out) {
  const size_t count = finished.size();
  for (Completion& done : finished) out->push_back(std::move(done));
  finished.clear();
  return count;
}

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_TRANSFER_TABLE_H_
