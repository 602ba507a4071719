#include "pagedkv/remote_block_format.h"

// The streaming state lives on the stack, which needs its definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstring>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pagedkv {
namespace {

// Header layout (little-endian; docs/remote.md draws it). The first 16 bytes and the
// header checksum in the last 8 header bytes keep their place in every format version, so
// any version's header is verified before its version is read.
constexpr char kMagic[8] = {'P', 'K', 'V', 'B', 'L', 'O', 'C', 'K'};
constexpr size_t kMagicAt = 0;              // 8 bytes
constexpr size_t kVersionAt = 8;            // u32
constexpr size_t kHeaderBytesAt = 12;       // u32: kFixed + 4 x num_tokens
constexpr size_t kNamespaceAt = 16;         // 32 ASCII hex digits
constexpr size_t kHashAt = 48;              // u64 lo, u64 hi
constexpr size_t kParentAt = 64;            // u64 lo, u64 hi; zero without a parent
constexpr size_t kFlagsAt = 80;             // u32
constexpr size_t kNumTokensAt = 84;         // u32
constexpr size_t kExtraDigestAt = 88;       // u64 lo, u64 hi
constexpr size_t kPayloadBytesAt = 104;     // u64
constexpr size_t kPayloadChecksumAt = 112;  // u64: XXH3-64 of the payload
constexpr size_t kTokensAt = 120;           // num_tokens x i32, then the u64 header checksum
constexpr size_t kStableBytes = 16;         // magic, version, header size
constexpr size_t kFixed = static_cast<size_t>(kRemoteBlockFixedHeaderBytes);
static_assert(kTokensAt + 8 == kFixed);

constexpr uint32_t kFlagHasParent = 1;
constexpr uint32_t kKnownFlags = kFlagHasParent;

// --- little-endian access ----------------------------------------------------------------

void put_u32(char* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(char* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t get_u32(const char* at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(at[i])} << (8 * i);
  return v;
}
uint64_t get_u64(const char* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(at[i])} << (8 * i);
  return v;
}
void put_hash(char* at, const BlockHash& h) {
  put_u64(at, h.lo);
  put_u64(at + 8, h.hi);
}
BlockHash get_hash(const char* at) { return BlockHash{get_u64(at), get_u64(at + 8)}; }

uint64_t checksum(const char* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::string hash_text(const BlockHash& h) { return absl::StrFormat("%016x%016x", h.hi, h.lo); }
std::string parent_text(const std::optional<BlockHash>& h) {
  return h.has_value() ? hash_text(*h) : std::string("none");
}

// Any bytes, printable (a stored digest may be garbage). Debian's Abseil has its own
// string_view type.
std::string escaped(std::string_view bytes) {
  return absl::CHexEscape(absl::string_view(bytes.data(), bytes.size()));
}

// --- encode ------------------------------------------------------------------------------

uint64_t payload_checksum(std::span<const std::span<const std::byte>> parts) {
  if (parts.size() == 1) return XXH3_64bits(parts[0].data(), parts[0].size());
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (const auto& part : parts) XXH3_64bits_update(&state, part.data(), part.size());
  return XXH3_64bits_digest(&state);
}

void write_header(const RemoteBlockIdentity& block, uint64_t payload_bytes, uint64_t payload_sum,
                  char* header) {
  const size_t header_bytes = kFixed + 4 * block.tokens.size();
  std::memcpy(header + kMagicAt, kMagic, sizeof(kMagic));
  put_u32(header + kVersionAt, kRemoteBlockFormatVersion);
  put_u32(header + kHeaderBytesAt, static_cast<uint32_t>(header_bytes));
  std::memcpy(header + kNamespaceAt, block.namespace_digest.data(), kRemoteNamespaceDigestChars);
  put_hash(header + kHashAt, block.hash);
  put_hash(header + kParentAt, block.parent.value_or(BlockHash{}));
  put_u32(header + kFlagsAt, block.parent.has_value() ? kFlagHasParent : 0);
  put_u32(header + kNumTokensAt, static_cast<uint32_t>(block.tokens.size()));
  put_hash(header + kExtraDigestAt, remote_extra_keys_digest(block.extra_keys));
  put_u64(header + kPayloadBytesAt, payload_bytes);
  put_u64(header + kPayloadChecksumAt, payload_sum);
  for (size_t i = 0; i < block.tokens.size(); ++i) {
    put_u32(header + kTokensAt + 4 * i, static_cast<uint32_t>(block.tokens[i]));
  }
  put_u64(header + header_bytes - 8, checksum(header, header_bytes - 8));
}

// --- decode ------------------------------------------------------------------------------

// Integrity: the value is a whole block as some writer encoded it. On success the header
// is trusted and its sizes agree with value.size().
absl::Status verify_integrity(std::string_view value) {
  const char* v = value.data();
  if (value.size() < kStableBytes) {
    return absl::DataLossError(
        absl::StrCat("value of ", value.size(), " bytes is shorter than a block header"));
  }
  if (std::memcmp(v + kMagicAt, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("value does not start with the block magic \"PKVBLOCK\"");
  }
  const uint64_t header_bytes = get_u32(v + kHeaderBytesAt);
  if (header_bytes < kFixed || header_bytes > value.size()) {
    return absl::DataLossError(absl::StrCat("header size ", header_bytes, " is outside [", kFixed,
                                            ", ", value.size(), "] (the value's length)"));
  }
  const uint64_t stored_sum = get_u64(v + header_bytes - 8);
  const uint64_t actual_sum = checksum(v, header_bytes - 8);
  if (stored_sum != actual_sum) {
    return absl::DataLossError(
        absl::StrFormat("header checksum %016x != %016x stored", actual_sum, stored_sum));
  }
  return absl::OkStatus();
}

// The rest of integrity, for a format-version-1 header whose checksum matched.
absl::Status verify_sizes_and_payload(std::string_view value) {
  const char* v = value.data();
  const uint64_t header_bytes = get_u32(v + kHeaderBytesAt);
  const uint64_t num_tokens = get_u32(v + kNumTokensAt);
  if (header_bytes != kFixed + 4 * num_tokens) {
    return absl::DataLossError(absl::StrCat("header size ", header_bytes, " does not hold ",
                                            num_tokens, " tokens (", kFixed + 4 * num_tokens,
                                            " bytes)"));
  }
  const uint32_t flags = get_u32(v + kFlagsAt);
  if ((flags & ~kKnownFlags) != 0) {
    return absl::DataLossError(absl::StrFormat("unknown header flags 0x%x", flags));
  }
  const uint64_t payload_bytes = get_u64(v + kPayloadBytesAt);
  if (payload_bytes != value.size() - header_bytes) {
    return absl::DataLossError(absl::StrCat("header says ", payload_bytes,
                                            " payload bytes, the value holds ",
                                            value.size() - header_bytes));
  }
  const uint64_t stored_sum = get_u64(v + kPayloadChecksumAt);
  const uint64_t actual_sum = checksum(v + header_bytes, payload_bytes);
  if (stored_sum != actual_sum) {
    return absl::DataLossError(
        absl::StrFormat("payload checksum %016x != %016x stored", actual_sum, stored_sum));
  }
  return absl::OkStatus();
}

// Compatibility: written by an engine whose blocks this reader can use.
absl::Status verify_compatible(std::string_view value, const RemoteBlockIdentity& expected,
                               int64_t expected_payload_bytes) {
  const char* v = value.data();
  const std::string_view digest(v + kNamespaceAt, kRemoteNamespaceDigestChars);
  if (digest != expected.namespace_digest) {
    // The stored digest may be any bytes: print it escaped.
    return absl::FailedPreconditionError(absl::StrCat(
        "namespace ", escaped(digest), ", the reader's is ", escaped(expected.namespace_digest)));
  }
  const uint64_t payload_bytes = get_u64(v + kPayloadBytesAt);
  if (expected_payload_bytes < 0 ||
      payload_bytes != static_cast<uint64_t>(expected_payload_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "payload of ", payload_bytes, " bytes, the reader's blocks hold ", expected_payload_bytes));
  }
  return absl::OkStatus();
}

// Identity: the very block the reader's sequence has at this position.
absl::Status verify_identity(std::string_view value, const RemoteBlockIdentity& expected) {
  const char* v = value.data();
  const BlockHash hash = get_hash(v + kHashAt);
  if (hash != expected.hash) {
    return absl::NotFoundError(absl::StrCat("block hash ", hash_text(hash), ", the sequence has ",
                                            hash_text(expected.hash)));
  }
  const std::optional<BlockHash> parent = (get_u32(v + kFlagsAt) & kFlagHasParent) != 0
                                              ? std::optional(get_hash(v + kParentAt))
                                              : std::nullopt;
  if (parent != expected.parent) {
    return absl::NotFoundError(absl::StrCat("parent ", parent_text(parent), ", the sequence has ",
                                            parent_text(expected.parent)));
  }
  const BlockHash extra = get_hash(v + kExtraDigestAt);
  const BlockHash expected_extra = remote_extra_keys_digest(expected.extra_keys);
  if (extra != expected_extra) {
    return absl::NotFoundError(absl::StrCat("extra-key digest ", hash_text(extra),
                                            ", the sequence's is ", hash_text(expected_extra)));
  }
  const uint64_t num_tokens = get_u32(v + kNumTokensAt);
  if (num_tokens != expected.tokens.size()) {
    return absl::NotFoundError(
        absl::StrCat(num_tokens, " tokens, the sequence's block has ", expected.tokens.size()));
  }
  for (size_t i = 0; i < num_tokens; ++i) {
    const auto token = static_cast<TokenId>(get_u32(v + kTokensAt + 4 * i));
    if (token != expected.tokens[i]) {
      return absl::NotFoundError(
          absl::StrCat("token ", i, " is ", token, ", the sequence has ", expected.tokens[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

BlockHash remote_extra_keys_digest(std::span<const uint64_t> extra_keys) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  for (const uint64_t key : extra_keys) {
    char bytes[8];
    put_u64(bytes, key);
    XXH3_128bits_update(&state, bytes, sizeof(bytes));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

absl::Status encode_remote_block(const RemoteBlockIdentity& block,
                                 std::span<const std::span<const std::byte>> payload_parts,
                                 std::string* out) {
  if (!is_remote_namespace_digest(block.namespace_digest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace digest ", escaped(block.namespace_digest), " is not ",
                     kRemoteNamespaceDigestChars, " lowercase hex digits"));
  }
  if (block.tokens.empty()) {
    return absl::InvalidArgumentError("a block of no tokens has no remote value");
  }
  constexpr size_t kMaxTokens = (std::numeric_limits<uint32_t>::max() - kFixed) / 4;
  if (block.tokens.size() > kMaxTokens) {  // the header size must fit its u32 field
    return absl::InvalidArgumentError(absl::StrCat("a block of ", block.tokens.size(),
                                                   " tokens; a header holds at most ", kMaxTokens));
  }
  uint64_t payload_bytes = 0;
  for (const auto& part : payload_parts) payload_bytes += part.size();
  const size_t header_bytes = kFixed + 4 * block.tokens.size();
  out->resize(header_bytes + payload_bytes);  // the one allocation
  char* dst = out->data();
  write_header(block, payload_bytes, payload_checksum(payload_parts), dst);
  dst += header_bytes;
  for (const auto& part : payload_parts) {
    if (part.empty()) continue;  // an empty span may have a null data()
    std::memcpy(dst, part.data(), part.size());
    dst += part.size();
  }
  return absl::OkStatus();
}

absl::Status encode_remote_block(const RemoteBlockIdentity& block,
                                 std::span<const std::byte> payload, std::string* out) {
  const std::span<const std::byte> parts[] = {payload};
  return encode_remote_block(block, parts, out);
}

absl::StatusOr<std::span<const std::byte>> decode_remote_block(std::string_view value,
                                                               const RemoteBlockIdentity& expected,
                                                               int64_t expected_payload_bytes) {
  if (absl::Status s = verify_integrity(value); !s.ok()) return s;
  const uint32_t version = get_u32(value.data() + kVersionAt);
  if (version != kRemoteBlockFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "format version ", version, ", this reader reads ", kRemoteBlockFormatVersion));
  }
  if (absl::Status s = verify_sizes_and_payload(value); !s.ok()) return s;
  if (absl::Status s = verify_compatible(value, expected, expected_payload_bytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = verify_identity(value, expected); !s.ok()) return s;
  const size_t header_bytes = get_u32(value.data() + kHeaderBytesAt);
  return std::as_bytes(std::span(value.substr(header_bytes)));
}

}  // namespace pagedkv
