// vLLM's KV event wire format (vllm/distributed/kv_events.py, vLLM 0.33.0), encoded with
// msgpack-c. docs/events.md lists every field.
//
//   message  = [topic, seq (8 bytes, big-endian), payload]
//   payload  = KVEventBatch, a msgpack array [ts (float64), events, data_parallel_rank]
//   event    = a msgpack map whose first key "type" names the event:
//     {"type": "BlockStored", "block_hashes": [bin16...], "parent_block_hash": bin16|nil,
//      "token_ids": [int...], "block_size": int, "lora_id": nil, "medium": str,
//      "lora_name": nil, "extra_keys": [nil | [uint...]] (one per block), "group_idx": 0}
//     {"type": "BlockRemoved", "block_hashes": [bin16...], "medium": str, "group_idx": 0}
//   layer group = on events with a group (a manager with more than one layer group):
//              "group_idx" is its index, and BlockStored adds after it
//              "kv_cache_spec_kind": str (vLLM's KVCacheSpecKind value) and, for a sliding
//              window, "kv_cache_spec_sliding_window": int (its window in tokens)
//   medium   = each event's own tier: device blocks WireOptions::device_medium ("GPU"),
//              host-tier blocks "CPU" (vLLM's MEDIUM_GPU and MEDIUM_CPU)
//     {"type": "AllBlocksCleared"}
// A 128-bit BlockHash is sent as 16 bytes: hi then lo, each big-endian (XXH3-128's
// canonical form, XXH128_canonical_t).
#ifndef PAGEDKV_EVENTS_WIRE_FORMAT_H_
#define PAGEDKV_EVENTS_WIRE_FORMAT_H_

#include <array>
#include <cstdint>
#include <string>

#include "events/staged_batch.h"
#include "pagedkv/types.h"

namespace pagedkv::internal {

// The "medium" string of host-tier blocks (vLLM's offloading connector sends the same).
inline constexpr char kHostMedium[] = "CPU";

struct WireOptions {
  std::string device_medium = "GPU";  // the "medium" string of device blocks
  int32_t data_parallel_rank = 0;
};

// vLLM's KVCacheSpecKind value of a group kind: "full_attention", "sliding_window",
// "chunked_local_attention".
const char* spec_kind_name(AttentionKind kind);

// The 16 bytes a hash is sent as.
std::array<char, 16> hash_bytes(const BlockHash& hash);

// An 8-byte big-endian sequence number (END is -1, two's complement).
std::array<char, 8> seq_bytes(int64_t seq);

// Replaces `out` with the msgpack KVEventBatch of `batch`.
void encode_batch(const StagedBatch& batch, const WireOptions& options, std::string* out);

}  // namespace pagedkv::internal

#endif  // PAGEDKV_EVENTS_WIRE_FORMAT_H_
