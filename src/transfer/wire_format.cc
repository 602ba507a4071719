#include "transfer/wire_format.h"

// The streaming state lives on the stack, which needs its definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pagedkv::internal {
namespace {

// Integers are copied as they lie in memory: the wire is little-endian, like every host
// this library builds for.
static_assert(std::endian::native == std::endian::little);

constexpr char kMagic[4] = {'P', 'K', 'V', 'X'};
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 4;
constexpr size_t kKindAt = 5;
constexpr size_t kOutcomeAt = 6;
constexpr size_t kTransferAt = 8;
constexpr size_t kGroupAt = 16;
constexpr size_t kIndexAt = 20;
constexpr size_t kHashAt = 24;
constexpr size_t kPayloadBytesAt = 40;
constexpr size_t kPayloadChecksumAt = 48;
constexpr size_t kBlocksAt = 56;
constexpr size_t kHeaderChecksumAt = 64;
static_assert(kHeaderChecksumAt + 8 == kFrameHeaderBytes);

template <typename T>
void put(std::byte* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
}
template <typename T>
T get(const std::byte* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

bool known_kind(uint8_t kind) {
  return kind >= static_cast<uint8_t>(FrameKind::kHello) &&
         kind <= static_cast<uint8_t>(FrameKind::kAck);
}

}  // namespace

EncodedHeader encode_frame_header(const FrameHeader& header) {
  EncodedHeader out{};
  std::byte* at = out.data();
  std::memcpy(at + kMagicAt, kMagic, sizeof(kMagic));
  put<uint8_t>(at, kVersionAt, kWireVersion);
  put<uint8_t>(at, kKindAt, static_cast<uint8_t>(header.kind));
  put<uint8_t>(at, kOutcomeAt, static_cast<uint8_t>(header.outcome));
  put<uint64_t>(at, kTransferAt, header.transfer);
  put<int32_t>(at, kGroupAt, header.group);
  put<int32_t>(at, kIndexAt, header.index);
  put<uint64_t>(at, kHashAt, header.hash.lo);
  put<uint64_t>(at, kHashAt + 8, header.hash.hi);
  put<uint64_t>(at, kPayloadBytesAt, header.payload_bytes);
  put<uint64_t>(at, kPayloadChecksumAt, header.payload_checksum);
  put<int32_t>(at, kBlocksAt, header.blocks);
  put<uint64_t>(at, kHeaderChecksumAt, XXH3_64bits(at, kHeaderChecksumAt));
  return out;
}

absl::StatusOr<FrameHeader> decode_frame_header(
    std::span<const std::byte, kFrameHeaderBytes> bytes) {
  const std::byte* at = bytes.data();
  if (std::memcmp(at + kMagicAt, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("frame does not start with the magic \"PKVX\"");
  }
  const uint64_t stored_sum = get<uint64_t>(at, kHeaderChecksumAt);
  const uint64_t actual_sum = XXH3_64bits(at, kHeaderChecksumAt);
  if (stored_sum != actual_sum) {
    return absl::DataLossError(
        absl::StrFormat("frame header checksum %016x != %016x stored", actual_sum, stored_sum));
  }
  if (const uint8_t version = get<uint8_t>(at, kVersionAt); version != kWireVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("frame of wire version ", version, "; this end speaks ", kWireVersion));
  }
  const uint8_t kind = get<uint8_t>(at, kKindAt);
  const uint8_t outcome = get<uint8_t>(at, kOutcomeAt);
  if (!known_kind(kind) || outcome > static_cast<uint8_t>(KvTransferOutcome::kTimedOut)) {
    return absl::DataLossError(
        absl::StrCat("frame of unknown kind ", kind, " or outcome ", outcome));
  }
  FrameHeader header{
      .kind = static_cast<FrameKind>(kind),
      .outcome = static_cast<KvTransferOutcome>(outcome),
      .transfer = get<uint64_t>(at, kTransferAt),
      .group = get<int32_t>(at, kGroupAt),
      .index = get<int32_t>(at, kIndexAt),
      .hash = BlockHash{get<uint64_t>(at, kHashAt), get<uint64_t>(at, kHashAt + 8)},
      .payload_bytes = get<uint64_t>(at, kPayloadBytesAt),
      .payload_checksum = get<uint64_t>(at, kPayloadChecksumAt),
      .blocks = get<int32_t>(at, kBlocksAt),
  };
  if (header.kind != FrameKind::kBlock && header.payload_bytes > kMaxControlPayloadBytes) {
    return absl::DataLossError(absl::StrCat("control frame of ", header.payload_bytes,
                                            " payload bytes; the limit is ",
                                            kMaxControlPayloadBytes));
  }
  return header;
}

uint64_t payload_checksum(std::span<const ConstByteSpan> parts) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (const ConstByteSpan part : parts) XXH3_64bits_update(&state, part.data(), part.size());
  return XXH3_64bits_digest(&state);
}

// Layout: u32 digest length, the digest, u32 group count, one i64 per group.
std::string encode_hello(const HelloPayload& hello) {
  std::string out(4 + hello.namespace_digest.size() + 4 + 8 * hello.block_bytes.size(), '\0');
  auto* at = reinterpret_cast<std::byte*>(out.data());
  put<uint32_t>(at, 0, static_cast<uint32_t>(hello.namespace_digest.size()));
  std::memcpy(at + 4, hello.namespace_digest.data(), hello.namespace_digest.size());
  const size_t groups_at = 4 + hello.namespace_digest.size();
  put<uint32_t>(at, groups_at, static_cast<uint32_t>(hello.block_bytes.size()));
  for (size_t g = 0; g < hello.block_bytes.size(); ++g) {
    put<int64_t>(at, groups_at + 4 + 8 * g, hello.block_bytes[g]);
  }
  return out;
}

absl::StatusOr<HelloPayload> decode_hello(std::span<const std::byte> bytes) {
  auto malformed = [&] {
    return absl::DataLossError(
        absl::StrCat("handshake payload of ", bytes.size(), " bytes is malformed"));
  };
  if (bytes.size() < 8) return malformed();
  const uint64_t digest_bytes = get<uint32_t>(bytes.data(), 0);
  if (digest_bytes > bytes.size() - 8) return malformed();
  const size_t groups_at = 4 + digest_bytes;
  const uint64_t groups = get<uint32_t>(bytes.data(), groups_at);
  if (groups_at + 4 + 8 * groups != bytes.size()) return malformed();
  HelloPayload hello;
  hello.namespace_digest.assign(reinterpret_cast<const char*>(bytes.data()) + 4, digest_bytes);
  for (uint64_t g = 0; g < groups; ++g) {
    hello.block_bytes.push_back(get<int64_t>(bytes.data(), groups_at + 4 + 8 * g));
  }
  return hello;
}

}  // namespace pagedkv::internal
