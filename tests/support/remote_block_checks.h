// The checks of fuzz/remote_block_fuzzer.cc on one input, shared with the replay of its
// corpus in tests/remote/remote_block_format_test.cc. Returns "" or what went wrong.
//
// Workload: (1) the input itself is decoded against a fixed expected block: it must be
// refused unless it is exactly that block's encoding; (2) a block is built from the input
// (token count, tokens, parent, extra keys, payload) and encoded: it must decode to the same
// payload, be refused as NotFound / FailedPrecondition when one identity field chosen by
// the input differs, and as DataLoss after a bit flip or a truncation the input chooses.
#ifndef PAGEDKV_TESTS_SUPPORT_REMOTE_BLOCK_CHECKS_H_
#define PAGEDKV_TESTS_SUPPORT_REMOTE_BLOCK_CHECKS_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pagedkv/remote_block_format.h"

namespace pagedkv::testing {

// Reads the input front to back; past its end every read is 0.
class InputReader {
 public:
  explicit InputReader(std::span<const uint8_t> data) : data_(data) {}
  uint8_t byte() { return pos_ < data_.size() ? data_[pos_++] : 0; }
  uint32_t u32() { return byte() | (byte() << 8) | (byte() << 16) | (uint32_t{byte()} << 24); }
  uint64_t u64() { return u32() | (uint64_t{u32()} << 32); }
  std::span<const uint8_t> rest() { return data_.subspan(std::min(pos_, data_.size())); }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

inline constexpr std::string_view kFuzzDigest = "00112233445566778899aabbccddeeff";

// A block built from the input, owning what its identity views.
struct FuzzBlock {
  std::vector<TokenId> tokens;
  std::vector<uint64_t> extra_keys;
  std::vector<std::byte> payload;
  BlockHash hash;
  std::optional<BlockHash> parent;

  RemoteBlockIdentity identity() const {
    return {.namespace_digest = kFuzzDigest,
            .hash = hash,
            .parent = parent,
            .extra_keys = extra_keys,
            .tokens = tokens};
  }
};

inline FuzzBlock fuzz_block_from(InputReader& in) {
  FuzzBlock b;
  const uint8_t shape = in.byte();
  b.tokens.resize(1 + shape % 32);
  for (TokenId& t : b.tokens) t = static_cast<TokenId>(in.u32());
  b.extra_keys.resize((shape >> 5) % 4);
  for (uint64_t& k : b.extra_keys) k = in.u64();
  b.hash = BlockHash{in.u64(), in.u64()};
  if ((shape & 0x80) != 0) b.parent = BlockHash{in.u64(), in.u64()};
  for (const uint8_t byte : in.rest()) b.payload.push_back(std::byte{byte});
  return b;
}

// (1): arbitrary bytes against a fixed block.
inline std::string check_arbitrary_value(std::span<const uint8_t> data) {
  const std::vector<TokenId> tokens = {1, 2, 3};
  const RemoteBlockIdentity expected{.namespace_digest = kFuzzDigest,
                                     .hash = BlockHash{1, 2},
                                     .parent = std::nullopt,
                                     .extra_keys = {},
                                     .tokens = tokens};
  const std::string_view value(reinterpret_cast<const char*>(data.data()), data.size());
  const auto result = decode_remote_block(value, expected, 8);
  if (!result.ok()) return "";
  std::string encoded;
  if (!encode_remote_block(expected, *result, &encoded).ok() || encoded != value) {
    return "decode accepted a value that is not the expected block's encoding";
  }
  return "";
}

// (2): a block from the input, and one change to it that must be refused.
inline std::string check_round_trip(std::span<const uint8_t> data) {
  InputReader in(data);
  const uint8_t mutation = in.byte();
  const uint32_t where = in.u32();
  const FuzzBlock block = fuzz_block_from(in);
  const auto payload_bytes = static_cast<int64_t>(block.payload.size());
  std::string value;
  if (absl::Status s = encode_remote_block(block.identity(), block.payload, &value); !s.ok()) {
    return absl::StrCat("encode failed: ", s.ToString());
  }
  const auto decoded = decode_remote_block(value, block.identity(), payload_bytes);
  if (!decoded.ok()) return absl::StrCat("round trip refused: ", decoded.status().ToString());
  if (decoded->size() != block.payload.size() ||
      (!block.payload.empty() &&
       std::memcmp(decoded->data(), block.payload.data(), block.payload.size()) != 0)) {
    return "round trip changed the payload";
  }

  FuzzBlock other = block;
  absl::StatusCode want = absl::StatusCode::kNotFound;
  std::string damaged = value;
  switch (mutation % 7) {
    case 0:
      other.hash.lo ^= uint64_t{1} << (where % 64);
      break;
    case 1:
      other.parent = block.parent ? std::nullopt : std::optional(BlockHash{});
      break;
    case 2:
      other.extra_keys.push_back(where);
      break;
    case 3:
      other.tokens[where % other.tokens.size()] ^= 1 << (where % 31);
      break;
    case 4:
      other.payload.push_back(std::byte{0});
      want = absl::StatusCode::kFailedPrecondition;
      break;
    case 5:
      damaged[where % damaged.size()] ^= static_cast<char>(1 << (mutation % 8));
      want = absl::StatusCode::kDataLoss;
      break;
    case 6:
      damaged.resize(where % damaged.size());
      want = absl::StatusCode::kDataLoss;
      break;
  }
  const auto refused =
      decode_remote_block(damaged, other.identity(), static_cast<int64_t>(other.payload.size()));
  if (refused.status().code() != want) {
    return absl::StrCat("mutation ", mutation % 7, " gave ", refused.status().ToString(),
                        ", expected code ", absl::StatusCodeToString(want));
  }
  return "";
}

inline std::string run_remote_block_checks(std::span<const uint8_t> data) {
  if (std::string error = check_arbitrary_value(data); !error.empty()) return error;
  return check_round_trip(data);
}

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_REMOTE_BLOCK_CHECKS_H_
