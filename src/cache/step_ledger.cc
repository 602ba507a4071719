// StepLedger: ending a step and checking the step's bookkeeping.
#include "cache/step_ledger.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

StepLedger::StepLedger(int32_t num_device_blocks, int32_t num_host_blocks)
    : write_mark_(num_device_blocks, 0),
      device_holds_(num_device_blocks, 0),
      host_holds_(num_host_blocks, 0) {}

StepOps StepLedger::take(BlockPool& device, BlockPool& host) {
  for_each_hold([this](Hold side, BlockId block) { hold(side, block, -1); });
  // Each as a free of its own: a clean one goes to the head of the free queue.
  auto release_parked = [](std::vector<BlockId>& parked, BlockPool& pool) {
    for (const BlockId b : parked) {
      BlockId last_clean = kNoBlock;
      pool.release_unchecked(b, last_clean);
    }
    parked.clear();
  };
  // Every hold is dropped, so every parked block goes.
  release_parked(deferred_device_, device);
  release_parked(deferred_host_, host);
  ++step_;
  return std::exchange(pending_, {});
}

absl::Status StepLedger::check_invariants(const BlockPool& device) const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("StepLedger invariant: ", parts...));
  };
  std::vector<int32_t> device_count(device_holds_.size(), 0);
  std::vector<int32_t> host_count(host_holds_.size(), 0);
  for_each_hold([&](Hold side, BlockId block) {
    ++(side == Hold::kDevice ? device_count : host_count)[block];
  });
  if (device_count != device_holds_) return broken("device holds disagree with the pending ops");
  int64_t total = 0;
  for (const int32_t n : device_holds_) total += n;
  if (total != num_device_holds_) {
    return broken("num_device_holds ", num_device_holds_, " but the holds add up to ", total);
  }
  if (host_count != host_holds_) return broken("host holds disagree with the pending ops");
  for (const BlockId b : deferred_device_) {
    if (!holds_device(b)) return broken("device block ", b, " parked but held by no pending copy");
  }
  for (const BlockId b : deferred_host_) {
    if (!holds_host(b)) return broken("host block ", b, " parked but held by no pending copy");
  }
  for (const OpList& list : kOpLists) {
    if (list.dst != Hold::kDevice) continue;
    for (const BlockCopy& op : pending_.*list.ops) {
      if (device.ref_count_unchecked(op.dst) == 0) {
        return broken("pending copy into device block ", op.dst, ", which is free");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
