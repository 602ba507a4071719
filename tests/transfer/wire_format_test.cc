// The transfer's frame header: a round trip of every field, and every single-bit flip of
// an encoded header refused (the receiver then drops the connection, never misreads).
#include <catch2/catch.hpp>

#include "transfer/wire_format.h"

namespace pagedkv::internal {
namespace {

const FrameHeader kBlockHeader{.kind = FrameKind::kBlock,
                               .outcome = KvTransferOutcome::kComplete,
                               .transfer = 0x1122334455667788,
                               .group = 3,
                               .index = 70000,
                               .hash = {.lo = 0xa1a2a3a4a5a6a7a8, .hi = 0xb1b2b3b4b5b6b7b8},
                               .payload_bytes = 2 << 20,
                               .payload_checksum = 0xc1c2c3c4c5c6c7c8,
                               .blocks = 12};

TEST_CASE("a frame header round-trips every field", "[transfer][wire]") {
  const EncodedHeader bytes = encode_frame_header(kBlockHeader);
  const absl::StatusOr<FrameHeader> decoded = decode_frame_header(bytes);
  REQUIRE(decoded.ok());
  CHECK(decoded->kind == kBlockHeader.kind);
  CHECK(decoded->transfer == kBlockHeader.transfer);
  CHECK(decoded->group == kBlockHeader.group);
  CHECK(decoded->index == kBlockHeader.index);
  CHECK(decoded->hash == kBlockHeader.hash);
  CHECK(decoded->payload_bytes == kBlockHeader.payload_bytes);
  CHECK(decoded->payload_checksum == kBlockHeader.payload_checksum);
  CHECK(decoded->blocks == kBlockHeader.blocks);
}

TEST_CASE("every single-bit flip of a frame header is refused", "[transfer][wire]") {
  const EncodedHeader good = encode_frame_header(kBlockHeader);
  for (size_t bit = 0; bit < 8 * kFrameHeaderBytes; ++bit) {
    EncodedHeader bad = good;
    bad[bit / 8] ^= std::byte{1} << (bit % 8);
    const absl::StatusCode code = decode_frame_header(bad).status().code();
    INFO("bit " << bit);
    CHECK(code == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("a control frame over the limit and the handshake payload are checked",
          "[transfer][wire]") {
  FrameHeader ack{.kind = FrameKind::kAck, .payload_bytes = kMaxControlPayloadBytes + 1};
  CHECK(std::string(decode_frame_header(encode_frame_header(ack)).status().message()) ==
        "control frame of 65537 payload bytes; the limit is 65536");
  const HelloPayload hello{.namespace_digest = "ns", .block_bytes = {2048, 512}};
  const std::string encoded = encode_hello(hello);
  const auto bytes = std::as_bytes(std::span(encoded));
  const absl::StatusOr<HelloPayload> decoded = decode_hello(bytes);
  REQUIRE(decoded.ok());
  CHECK(decoded->namespace_digest == "ns");
  CHECK(decoded->block_bytes == hello.block_bytes);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    CHECK(decode_hello(bytes.first(cut)).status().code() == absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace pagedkv::internal
