// File: src/transfer/fault_injector.h
//
// FaultInjector: applies KvTransferFaults (kv_transfer_faults.h) to a sender's block frames
// as they are queued. The checksum is taken first, so that a corrupted frame arrives as a
// faulty link would deliver it.
#ifndef PAGEDKV_TRANSFER_FAULT_INJECTOR_H_
#define PAGEDKV_TRANSFER_FAULT_INJECTOR_H_

#include <vector>

#include "absl/status/status.h"
#include "pagedkv/kv_transfer_faults.h"
#include "transfer/frame_stream.h"

namespace pagedkv::internal {

class FaultInjector {
 public:
  FaultInjector() = default;
  explicit FaultInjector(std::vector<KvTransferFault> faults) : faults_(std::move(faults)) {}

  // InvalidArgument for a negative block, byte offset or delay, naming the fault.
  static absl::Status check(const std::vector<KvTransferFault>& faults);

  // Applies the faults of block `block` of `transfer` to its frame. Returns false when the
  // frame is dropped.
  bool apply(KvTransferId transfer, int32_t block, OutgoingFrame& frame) const;

 private:
  std::vector<KvTransferFault> faults_;
};

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_FAULT_INJECTOR_H_
