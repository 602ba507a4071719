// StepLedger: sizing, ending a step and checking the step's bookkeeping.
#include "cache/step_ledger.h"

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {

StepLedger::StepLedger(std::span<const LayerGroup> groups) {
  size_t device_blocks = 0;
  size_t host_blocks = 0;
  for (const LayerGroup& g : groups) {
    device_offset_.push_back(device_blocks);
    host_offset_.push_back(host_blocks);
    device_blocks += static_cast<size_t>(g.num_blocks);
    host_blocks += static_cast<size_t>(g.num_host_blocks);
  }
  write_mark_.assign(device_blocks, 0);
  device_holds_.assign(device_blocks, 0);
  host_holds_.assign(host_blocks, 0);
}

void StepLedger::drop_holds_and_advance() {
  for_each_hold([this](Hold side, int32_t group, BlockId block) { hold(side, group, block, -1); });
  ++step_;
}

absl::Status StepLedger::check_holds() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("StepLedger invariant: ", parts...));
  };
  std::vector<int32_t> device_count(device_holds_.size(), 0);
  std::vector<int32_t> host_count(host_holds_.size(), 0);
  for_each_hold([&](Hold side, int32_t group, BlockId block) {
    if (side == Hold::kDevice) {
      ++device_count[device(group, block)];
    } else {
      ++host_count[host(group, block)];
    }
  });
  if (device_count != device_holds_) return broken("device holds disagree with the pending ops");
  int64_t total = 0;
  for (const int32_t n : device_holds_) total += n;
  if (total != num_device_holds_) {
    return broken("num_device_holds ", num_device_holds_, " but the holds add up to ", total);
  }
  if (host_count != host_holds_) return broken("host holds disagree with the pending ops");
  for (const Parked& p : deferred_device_) {
    if (!holds_device(p.group, p.block)) {
      return broken("group ", p.group, " device block ", p.block,
                    " parked but held by no pending copy");
    }
  }
  for (const Parked& p : deferred_host_) {
    if (!holds_host(p.group, p.block)) {
      return broken("group ", p.group, " host block ", p.block,
                    " parked but held by no pending copy");
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedkv::internal
