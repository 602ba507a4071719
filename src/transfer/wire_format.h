// File: src/transfer/wire_format.h
//
// The frames of the KV transfer protocol. Every frame is a fixed 72-byte header, then
// `payload_bytes` bytes of payload. All integers little-endian.
//
//   offset  bytes  field
//   0       4      magic "PKVX"
//   4       1      version (kWireVersion)
//   5       1      kind (FrameKind)
//   6       1      outcome (kAck, kHelloReply: KvTransferOutcome; kComplete = accepted)
//   7       1      0
//   8       8      transfer id
//   16      4      group (kBlock)
//   20      4      index (kBlock)
//   24      16     hash: lo, hi (kBlock)
//   40      8      payload bytes
//   48      8      payload checksum: XXH3-64 of the payload (as the remote block format's)
//   56      4      blocks (kEnd: block frames sent; kAck: blocks verified)
//   60      4      0
//   64      8      header checksum: XXH3-64 of bytes [0, 64)
//
// Payloads: kHello the handshake (HelloPayload), kBlock the block's bytes, kHelloReply and
// kAck a reason in text (empty when accepted or complete), kEnd and kCancel none.
// A header whose checksum fails means the stream is out of step: the connection is
// dropped. A payload whose checksum fails damages its block only.
#ifndef PAGEDKV_TRANSFER_WIRE_FORMAT_H_
#define PAGEDKV_TRANSFER_WIRE_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/kv_transfer.h"

namespace pagedkv::internal {

inline constexpr size_t kFrameHeaderBytes = 72;
inline constexpr uint8_t kWireVersion = 1;
// Text and handshake payloads are at most this long; a longer one is a protocol error.
inline constexpr uint64_t kMaxControlPayloadBytes = 64 << 10;

enum class FrameKind : uint8_t {
  kHello = 1,       // sender -> receiver: namespace digest and block sizes
  kHelloReply = 2,  // receiver -> sender: accepted, or refused with the reason
  kBlock = 3,       // sender -> receiver: one block's bytes
  kEnd = 4,         // sender -> receiver: no more blocks of the transfer
  kCancel = 5,      // sender -> receiver: the sender gave the transfer up
  kAck = 6,         // receiver -> sender: the transfer's outcome
};

struct FrameHeader {
  FrameKind kind = FrameKind::kBlock;
  KvTransferOutcome outcome = KvTransferOutcome::kComplete;
  KvTransferId transfer = 0;
  int32_t group = 0;
  int32_t index = 0;
  BlockHash hash{};
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  int32_t blocks = 0;
};

using EncodedHeader = std::array<std::byte, kFrameHeaderBytes>;

EncodedHeader encode_frame_header(const FrameHeader& header);

// Errors: DataLoss for a bad magic or header checksum, an unknown kind or outcome, a
// control payload over kMaxControlPayloadBytes; FailedPrecondition for another version.
absl::StatusOr<FrameHeader> decode_frame_header(
    std::span<const std::byte, kFrameHeaderBytes> bytes);

// XXH3-64 of the concatenated parts.
uint64_t payload_checksum(std::span<const ConstByteSpan> parts);

// The handshake's payload: what both ends must agree on.
struct HelloPayload {
  std::string namespace_digest;
  std::vector<int64_t> block_bytes;
};
std::string encode_hello(const HelloPayload& hello);
// Errors: DataLoss when `bytes` is not an encoded HelloPayload.
absl::StatusOr<HelloPayload> decode_hello(std::span<const std::byte> bytes);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_TRANSFER_WIRE_FORMAT_H_
