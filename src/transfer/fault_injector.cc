#include "transfer/fault_injector.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pagedkv::internal {
namespace {

// The frame carries the checksum of its true bytes and a flipped copy of them.
void corrupt_byte(OutgoingFrame& frame, int64_t offset) {
  frame.fields.payload_checksum = payload_checksum(frame.payload);
  frame.checksum_known = true;
  std::vector<std::byte> copy;
  copy.reserve(frame.fields.payload_bytes);
  for (const ConstByteSpan part : frame.payload) copy.insert(copy.end(), part.begin(), part.end());
  if (!copy.empty()) {
    std::byte& victim = copy[static_cast<size_t>(offset) % copy.size()];
    victim = ~victim;
  }
  frame.owned = std::move(copy);
  frame.payload = {ConstByteSpan(frame.owned)};
}

}  // namespace

absl::Status FaultInjector::check(const std::vector<KvTransferFault>& faults) {
  for (size_t i = 0; i < faults.size(); ++i) {
    const KvTransferFault& fault = faults[i];
    if (fault.block < 0 || fault.byte_offset < 0 || fault.delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault ", i, ": block ", fault.block, ", byte_offset ", fault.byte_offset,
                       " and delay ", absl::FormatDuration(fault.delay), " must be >= 0"));
    }
  }
  return absl::OkStatus();
}

bool FaultInjector::apply(KvTransferId transfer, int32_t block, OutgoingFrame& frame) const {
  for (const KvTransferFault& fault : faults_) {
    if (fault.transfer != transfer || fault.block != block) continue;
    switch (fault.kind) {
      case KvTransferFault::Kind::kDrop:
        return false;
      case KvTransferFault::Kind::kCorruptByte:
        corrupt_byte(frame, fault.byte_offset);
        break;
      case KvTransferFault::Kind::kDelay:
        frame.not_before = absl::Now() + fault.delay;
        break;
      case KvTransferFault::Kind::kCloseConnection:
        frame.close_after_payload_bytes = fault.byte_offset;
        break;
    }
  }
  return true;
}

}  // namespace pagedkv::internal
