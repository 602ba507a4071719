// The remote block value format: exact round trips; every field that differs, every
// single-bit flip and every truncation refused with its named error; random bytes never
// crash or read outside the value (run under ASan to see the latter).
#include "pagedkv/remote_block_format.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/remote_namespace.h"
#include "support/remote_block_checks.h"
#include "xxhash.h"

namespace pagedkv {
namespace {

constexpr const char* kDigest = "0123456789abcdef0123456789abcdef";

// A small block: 4 tokens, two extra keys, a parent, and a payload of `payload_bytes`
// bytes with distinct values.
struct TestBlock {
  std::vector<TokenId> tokens = {812, 7, -1, 2147483647};
  std::vector<uint64_t> extra_keys = {0x5a17ull, 0xfeedfacecafebeefull};
  std::vector<std::byte> payload;
  BlockHash hash{0x1111222233334444ull, 0x5555666677778888ull};
  std::optional<BlockHash> parent = BlockHash{0x9999aaaabbbbccccull, 0xddddeeeeffff0000ull};

  explicit TestBlock(size_t payload_bytes = 64) {
    for (size_t i = 0; i < payload_bytes; ++i) payload.push_back(std::byte(i * 37 + 11));
  }
  RemoteBlockIdentity identity() const {
    return RemoteBlockIdentity{.namespace_digest = kDigest,
                               .hash = hash,
                               .parent = parent,
                               .extra_keys = extra_keys,
                               .tokens = tokens};
  }
  int64_t payload_bytes() const { return static_cast<int64_t>(payload.size()); }
  std::string encode() const {
    std::string value;
    const absl::Status s = encode_remote_block(identity(), payload, &value);
    INFO(s.ToString());
    REQUIRE(s.ok());
    return value;
  }
};

uint32_t read_u32(const std::string& value, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(value[at + i])} << (8 * i);
  return v;
}
uint64_t read_u64(const std::string& value, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(value[at + i])} << (8 * i);
  return v;
}

void check_error(const absl::StatusOr<std::span<const std::byte>>& result, absl::StatusCode code,
                 const std::string& fragment) {
  INFO(result.status().ToString());
  REQUIRE(!result.ok());
  CHECK(result.status().code() == code);
  CHECK(std::string(result.status().message()).find(fragment) != std::string::npos);
}

TEST_CASE("a block round-trips with its exact payload, as a view into the value") {
  const TestBlock block;
  const std::string value = block.encode();
  REQUIRE(static_cast<int64_t>(value.size()) ==
          remote_block_value_bytes(block.tokens.size(), block.payload_bytes()));
  const auto payload = decode_remote_block(value, block.identity(), block.payload_bytes());
  INFO(payload.status().ToString());
  REQUIRE(payload.ok());
  REQUIRE(payload->size() == block.payload.size());
  CHECK(std::memcmp(payload->data(), block.payload.data(), block.payload.size()) == 0);
  CHECK(reinterpret_cast<const char*>(payload->data()) ==
        value.data() + value.size() - block.payload.size());
}

TEST_CASE("the header is little-endian at the documented offsets") {
  const TestBlock block;
  const std::string value = block.encode();
  CHECK(value.substr(0, 8) == "PKVBLOCK");
  CHECK(read_u32(value, 8) == kRemoteBlockFormatVersion);
  CHECK(read_u32(value, 12) == 128 + 4 * 4);
  CHECK(value.substr(16, 32) == kDigest);
  CHECK(read_u64(value, 48) == block.hash.lo);
  CHECK(read_u64(value, 56) == block.hash.hi);
  CHECK(read_u64(value, 64) == block.parent->lo);
  CHECK(read_u64(value, 72) == block.parent->hi);
  CHECK(read_u32(value, 80) == 1);  // has a parent
  CHECK(read_u32(value, 84) == 4);
  const BlockHash extra = remote_extra_keys_digest(block.extra_keys);
  CHECK(read_u64(value, 88) == extra.lo);
  CHECK(read_u64(value, 96) == extra.hi);
  CHECK(read_u64(value, 104) == 64);
  for (size_t i = 0; i < block.tokens.size(); ++i) {
    CHECK(static_cast<TokenId>(read_u32(value, 120 + 4 * i)) == block.tokens[i]);
  }
}

TEST_CASE("a first block (no parent) round-trips and differs from a zero parent") {
  TestBlock first;
  first.parent = std::nullopt;
  const std::string value = first.encode();
  CHECK(decode_remote_block(value, first.identity(), first.payload_bytes()).ok());
  TestBlock zero_parent = first;
  zero_parent.parent = BlockHash{};
  check_error(decode_remote_block(value, zero_parent.identity(), first.payload_bytes()),
              absl::StatusCode::kNotFound, "parent none, the sequence has 0000");
}

TEST_CASE("payload parts are concatenated, empty parts included") {
  const TestBlock block;
  const std::span<const std::byte> all(block.payload);
  const std::span<const std::byte> parts[] = {
      all.subspan(0, 10), {}, all.subspan(10, 30), all.subspan(40)};
  std::string value;
  REQUIRE(encode_remote_block(block.identity(), parts, &value).ok());
  CHECK(value == block.encode());
}

TEST_CASE("an empty payload round-trips") {
  const TestBlock block(0);
  const auto payload = decode_remote_block(block.encode(), block.identity(), 0);
  REQUIRE(payload.ok());
  CHECK(payload->empty());
}

TEST_CASE("encode refuses a malformed digest or an empty block and leaves the output") {
  TestBlock block;
  std::string value = "untouched";
  auto identity = block.identity();
  for (const std::string_view bad :
       {std::string_view("0123456789abcdef"), std::string_view("0123456789ABCDEF0123456789abcdef"),
        std::string_view("0123456789abcdef0123456789abcde:")}) {
    identity.namespace_digest = bad;
    const absl::Status s = encode_remote_block(identity, block.payload, &value);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(value == "untouched");
  }
  identity = block.identity();
  identity.tokens = {};
  CHECK(encode_remote_block(identity, block.payload, &value).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(value == "untouched");
}

TEST_CASE("each identity field that differs is named") {
  const TestBlock block;
  const std::string value = block.encode();
  struct Case {
    const char* field;
    std::function<void(TestBlock&)> change;
    absl::StatusCode code;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"namespace", [](TestBlock&) {}, absl::StatusCode::kFailedPrecondition, "namespace"},
      {"hash", [](TestBlock& b) { b.hash.lo ^= 1; }, absl::StatusCode::kNotFound,
       "block hash 55556666777788881111222233334444, the sequence has "
       "55556666777788881111222233334445"},
      {"parent", [](TestBlock& b) { b.parent->hi ^= 1; }, absl::StatusCode::kNotFound,
       "parent ddddeeeeffff00009999aaaabbbbcccc, the sequence has ddddeeeeffff0001"},
      {"no parent", [](TestBlock& b) { b.parent.reset(); }, absl::StatusCode::kNotFound,
       ", the sequence has none"},
      {"extra keys", [](TestBlock& b) { b.extra_keys[1] ^= 1; }, absl::StatusCode::kNotFound,
       "extra-key digest"},
      {"no extra keys", [](TestBlock& b) { b.extra_keys.clear(); }, absl::StatusCode::kNotFound,
       "extra-key digest"},
      {"token count", [](TestBlock& b) { b.tokens.pop_back(); }, absl::StatusCode::kNotFound,
       "4 tokens, the sequence's block has 3"},
      {"token 0", [](TestBlock& b) { b.tokens[0] = 813; }, absl::StatusCode::kNotFound,
       "token 0 is 812, the sequence has 813"},
      {"token 3", [](TestBlock& b) { b.tokens[3] = 0; }, absl::StatusCode::kNotFound,
       "token 3 is 2147483647, the sequence has 0"},
      {"payload size", [](TestBlock& b) { b.payload.pop_back(); },
       absl::StatusCode::kFailedPrecondition, "payload of 64 bytes, the reader's blocks hold 63"},
  };
  for (const Case& c : cases) {
    INFO("field " << c.field);
    TestBlock reader = block;
    c.change(reader);
    RemoteBlockIdentity expected = reader.identity();
    const std::string other_digest = "fedcba9876543210fedcba9876543210";
    if (std::string(c.field) == "namespace") expected.namespace_digest = other_digest;
    check_error(decode_remote_block(value, expected, reader.payload_bytes()), c.code, c.fragment);
  }
}

// Re-encodes `value` after `edit` changed header bytes, fixing the header checksum, so the
// edit reaches the checks behind it.
std::string with_header_edit(std::string value, const std::function<void(std::string&)>& edit) {
  edit(value);
  const size_t header_bytes = read_u32(value, 12);
  REQUIRE(header_bytes <= value.size());
  const uint64_t sum = XXH3_64bits(value.data(), header_bytes - 8);
  for (int i = 0; i < 8; ++i) value[header_bytes - 8 + i] = static_cast<char>(sum >> (8 * i));
  return value;
}

void put_u32(std::string& value, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) value[at + i] = static_cast<char>(v >> (8 * i));
}
void put_u64(std::string& value, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) value[at + i] = static_cast<char>(v >> (8 * i));
}

TEST_CASE("each integrity field that is wrong is named, even under a valid header checksum") {
  const TestBlock block;
  const std::string value = block.encode();
  const auto decode = [&](const std::string& v) {
    return decode_remote_block(v, block.identity(), block.payload_bytes());
  };
  using absl::StatusCode;
  check_error(decode(with_header_edit(value, [](std::string& v) { put_u32(v, 8, 2); })),
              StatusCode::kFailedPrecondition, "format version 2, this reader reads 1");
  check_error(decode(with_header_edit(value, [](std::string& v) { put_u32(v, 84, 5); })),
              StatusCode::kDataLoss, "header size 144 does not hold 5 tokens (148 bytes)");
  check_error(decode(with_header_edit(value, [](std::string& v) { put_u32(v, 80, 3); })),
              StatusCode::kDataLoss, "unknown header flags 0x3");
  check_error(decode(with_header_edit(value, [](std::string& v) { put_u64(v, 104, 65); })),
              StatusCode::kDataLoss, "header says 65 payload bytes, the value holds 64");
  check_error(decode(with_header_edit(value, [](std::string& v) { put_u64(v, 104, ~0ull); })),
              StatusCode::kDataLoss, "payload bytes, the value holds 64");
  check_error(decode(with_header_edit(value, [](std::string& v) { v[112] ^= 1; })),
              StatusCode::kDataLoss, "payload checksum");
  std::string v = value;  // a header size past the value: no checksum to fix
  put_u32(v, 12, 1u << 31);
  check_error(decode(v), StatusCode::kDataLoss, "header size 2147483648 is outside [128, 208]");
}

TEST_CASE("a wrong magic, header checksum, payload byte or trailing byte is data loss") {
  const TestBlock block;
  const std::string value = block.encode();
  const auto decode = [&](const std::string& v) {
    return decode_remote_block(v, block.identity(), block.payload_bytes());
  };
  std::string v = value;
  v[0] = 'X';
  check_error(decode(v), absl::StatusCode::kDataLoss, "magic");
  v = value;
  v[143] ^= 0x80;  // the last byte of the header checksum
  check_error(decode(v), absl::StatusCode::kDataLoss, "header checksum");
  v = value;
  v[20] = 'f';  // a namespace digit: covered by the header checksum
  check_error(decode(v), absl::StatusCode::kDataLoss, "header checksum");
  v = value;
  v.back() ^= 1;
  check_error(decode(v), absl::StatusCode::kDataLoss, "payload checksum");
  check_error(decode(value + '\0'), absl::StatusCode::kDataLoss,
              "header says 64 payload bytes, the value holds 65");
}

TEST_CASE("every single-bit flip of an encoded block is detected as data loss") {
  const TestBlock block(24);
  const std::string value = block.encode();
  int64_t flips = 0;
  for (size_t byte = 0; byte < value.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = value;
      flipped[byte] = static_cast<char>(flipped[byte] ^ (1 << bit));
      const auto result = decode_remote_block(flipped, block.identity(), block.payload_bytes());
      INFO("byte " << byte << " bit " << bit << ": " << result.status().ToString());
      REQUIRE(result.status().code() == absl::StatusCode::kDataLoss);
      ++flips;
    }
  }
  CHECK(flips == static_cast<int64_t>(value.size()) * 8);
}

TEST_CASE("every truncation of an encoded block is refused as data loss") {
  const TestBlock block(24);
  const std::string value = block.encode();
  for (size_t length = 0; length < value.size(); ++length) {
    // A copy of exactly `length` bytes, so ASan sees any read past it.
    const std::vector<char> cut(value.begin(), value.begin() + static_cast<ptrdiff_t>(length));
    const auto result = decode_remote_block(std::string_view(cut.data(), cut.size()),
                                            block.identity(), block.payload_bytes());
    INFO("length " << length << ": " << result.status().ToString());
    REQUIRE(result.status().code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("random bytes never crash and are refused as data loss") {
  const TestBlock block(24);
  const std::string valid = block.encode();
  const uint32_t seed = 20261203;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    // Half pure noise, half a valid block with noise over part of it, so the checks
    // behind the magic and the header size are reached too.
    std::vector<char> bytes;
    if (i % 2 == 0) {
      bytes.resize(rng() % 300);
      for (char& b : bytes) b = static_cast<char>(rng());
    } else {
      bytes.assign(valid.begin(), valid.end());
      bytes.resize(rng() % (valid.size() + 16));
      const size_t noise = 1 + rng() % 8;
      for (size_t n = 0; n < noise && !bytes.empty(); ++n) {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      }
    }
    const std::string_view value(bytes.data(), bytes.size());
    if (value == valid) continue;  // the noise happened to rewrite the same bytes
    const auto result = decode_remote_block(value, block.identity(), block.payload_bytes());
    INFO("input " << i);
    // Any change to a valid value breaks a checksum, a size or the magic.
    REQUIRE(result.status().code() == absl::StatusCode::kDataLoss);
  }
}

// fuzz/remote_block_fuzzer.cc's seed corpus and saved crashes, through the same checks.
TEST_CASE("the remote block fuzzer's corpus and saved crashes replay cleanly", "[fuzz]") {
  namespace fs = std::filesystem;
  int replayed = 0;
  for (const char* folder : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(PAGEDKV_SOURCE_DIR) / "fuzz" / folder / "remote_block";
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes(std::istreambuf_iterator<char>(in), {});
      INFO(entry.path().string());
      CHECK(testing::run_remote_block_checks(bytes) == "");
      ++replayed;
    }
  }
  CHECK(replayed >= 8);  // the committed seeds
}

}  // namespace
}  // namespace pagedkv
