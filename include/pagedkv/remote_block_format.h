// File: pagedkv/remote_block_format.h
//
// The value stored for one KV block in a remote store (RemoteKvStore), and its
// verification. A value is a fixed little-endian header naming the block (namespace,
// chained hash, parent hash, extra-key digest, token ids) with two checksums, followed by
// the payload: every layer's K and V of the block in the storage layout. A reader accepts
// a value only if it is intact and is exactly the block its sequence needs, as the device
// prefix cache verifies a hash hit (tokens, parent, extra keys) before sharing a block.
// docs/remote.md ("Value format") draws the header.
//
// Pure computation: no I/O, no allocation beyond the output string; decode never reads
// outside `value`, whatever its bytes (library pagedkv::remote_format, no hiredis).
//
// Example (in a function returning a Status; `payload` is the block's K/V bytes):
//   RemoteBlockIdentity id{.namespace_digest = digest, .hash = hash, .parent = parent,
//                          .extra_keys = extra_keys, .tokens = block_tokens};
//   std::string value;
//   PAGEDKV_RETURN_IF_ERROR(encode_remote_block(id, payload, &value));
//   // ... store->put() it under remote_block_key(digest, hash); later a get() of that
//   // key returns `fetched`, which is verified against the block the sequence needs:
//   absl::StatusOr<std::span<const std::byte>> verified =
//       decode_remote_block(fetched, id, spec.bytes_per_block());
//   if (absl::IsDataLoss(verified.status())) ++corrupt;  // else a miss of another kind
#ifndef PAGEDKV_REMOTE_BLOCK_FORMAT_H_
#define PAGEDKV_REMOTE_BLOCK_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/remote_namespace.h"
#include "pagedkv/types.h"

namespace pagedkv {

// Bytes of a header without token ids; the header holds 4 more per token.
inline constexpr int64_t kRemoteBlockFixedHeaderBytes = 128;

// What names one block: the writer describes the block it stores, the reader the block its
// sequence needs at that position. Views: the spans must outlive the call.
struct RemoteBlockIdentity {
  std::string_view namespace_digest;     // remote_namespace_digest(): 32 lowercase hex digits
  BlockHash hash;                        // the block's chained hash
  std::optional<BlockHash> parent;       // the previous block's hash; none for a first block
  std::span<const uint64_t> extra_keys;  // as given to hash_block (salt, adapter, mm hashes)
  std::span<const TokenId> tokens;       // the block's token ids, in order
};

// XXH3-128 of `extra_keys` (each little-endian): what a header stores in their place.
BlockHash remote_extra_keys_digest(std::span<const uint64_t> extra_keys);

// Bytes of the encoded value of a block of `num_tokens` tokens and `payload_bytes` bytes.
constexpr int64_t remote_block_value_bytes(int64_t num_tokens, int64_t payload_bytes) {
  return kRemoteBlockFixedHeaderBytes + 4 * num_tokens + payload_bytes;
}

// encode_remote_block()
//
// Writes the value of block `block` with the concatenation of `payload_parts` as its
// payload (e.g. one part per layer and K/V) into `*out`, replacing its contents, with at
// most one allocation (none when `*out` has the capacity).
// Errors (`*out` unchanged): InvalidArgument when `block.namespace_digest` is not 32
// lowercase hex digits or the block has no tokens.
[[nodiscard]] absl::Status encode_remote_block(
    const RemoteBlockIdentity& block, std::span<const std::span<const std::byte>> payload_parts,
    std::string* out);

// The same with the payload in one span.
[[nodiscard]] absl::Status encode_remote_block(const RemoteBlockIdentity& block,
                                               std::span<const std::byte> payload,
                                               std::string* out);

// decode_remote_block()
//
// Verifies that `value` is an intact encoded block and is exactly the block `expected`
// names with a payload of `expected_payload_bytes` (KvCacheSpec::bytes_per_block() of the
// reader's shard), and returns a view of its payload inside `value`. Never reads outside
// `value`, for any bytes. Errors, by what the caller does next (the message names the
// field and both values, e.g. "token 5 is 812, the sequence has 813"):
//   DataLoss            the value is corrupt or cut: shorter than its header, bad magic,
//                       header size, token count, flags or payload size inconsistent with
//                       the value's length, header or payload checksum mismatch. Count as
//                       corrupt; the key may be overwritten.
//   FailedPrecondition  an intact value written by an incompatible engine: another format
//                       version, namespace digest or payload size. Count as a
//                       configuration mismatch.
//   NotFound            an intact value of another block: hash, parent (or its absence),
//                       extra-key digest, token count or a token id differ (a hash
//                       collision or a misfiled key). Treat as a miss.
// Checks run in that order: integrity (header checksum before any field is trusted),
// then compatibility, then identity.
[[nodiscard]] absl::StatusOr<std::span<const std::byte>> decode_remote_block(
    std::string_view value, const RemoteBlockIdentity& expected, int64_t expected_payload_bytes);

}  // namespace pagedkv

#endif  // PAGEDKV_REMOTE_BLOCK_FORMAT_H_
