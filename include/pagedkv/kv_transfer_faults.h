// File: pagedkv/kv_transfer_faults.h
//
// Faults injected into a KvTransferSender's block frames on their way out, so that tests
// of a receiver (and of the engine code that truncates a request to its verified prefix)
// see each failure deterministically. The frames are changed after their checksum is
// computed, as a faulty link would change them.
//
// Example (a test; `transport` from connect_kv_transport()):
//   auto sender = create_fault_injecting_kv_transfer_sender(
//       std::move(transport), options,
//       {{.kind = KvTransferFault::Kind::kCorruptByte, .transfer = 7, .block = 2}});
//   // the receiver of transfer 7 reports its block 2 kCorrupt, the others kVerified
#ifndef PAGEDKV_KV_TRANSFER_FAULTS_H_
#define PAGEDKV_KV_TRANSFER_FAULTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pagedkv/kv_transfer.h"
#include "pagedkv/kv_transport.h"

namespace pagedkv {

struct KvTransferFault {
  enum class Kind : uint8_t {
    kDrop,             // the block's frame is never written
    kCorruptByte,      // payload byte `byte_offset` is flipped (bitwise not)
    kDelay,            // the frame, and so every frame after it, leaves `delay` late
    kCloseConnection,  // the header and `byte_offset` payload bytes are written, then the
                       // connection is closed (a sender dying mid-block)
  };
  Kind kind = Kind::kDrop;
  KvTransferId transfer = 0;
  int32_t block = 0;  // the block's position in send()'s list
  int64_t byte_offset = 0;
  absl::Duration delay = absl::ZeroDuration();
};

// A sender, as create_kv_transfer_sender(), whose block frames suffer `faults`.
// Errors: those of create_kv_transfer_sender(); InvalidArgument for a negative block or
// byte_offset, or a negative delay.
[[nodiscard]] absl::StatusOr<std::unique_ptr<KvTransferSender>>
create_fault_injecting_kv_transfer_sender(std::unique_ptr<KvTransport> transport,
                                          KvTransferOptions options,
                                          std::vector<KvTransferFault> faults);

}  // namespace pagedkv

#endif  // PAGEDKV_KV_TRANSFER_FAULTS_H_
