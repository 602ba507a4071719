#include "events/wire_format.h"

#include <msgpack.hpp>
#include <string_view>

namespace pagedkv::internal {
namespace {

// msgpack-c writes through any type with write(const char*, size_t).
struct StringSink {
  std::string* out;
  void write(const char* data, size_t size) { out->append(data, size); }
};
using Packer = msgpack::packer<StringSink>;

void pack_str(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_hash(Packer& p, const BlockHash& hash) {
  const std::array<char, 16> bytes = hash_bytes(hash);
  p.pack_bin(bytes.size());
  p.pack_bin_body(bytes.data(), bytes.size());
}

void pack_medium(Packer& p, Medium medium, const WireOptions& options) {
  pack_str(p, medium == Medium::kHost ? std::string_view(kHostMedium) : options.device_medium);
}

void pack_hashes(Packer& p, std::span<const BlockHash> hashes) {
  p.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& h : hashes) pack_hash(p, h);
}

void pack_stored(Packer& p, const StagedEventView& v, const WireOptions& options) {
  // vLLM's fields in its order; the group's kind and window only on a group's events, the
  // window only for a sliding window (vLLM's get_kv_cache_spec_sliding_window()).
  const EventGroup& group = v.event.group;
  const bool has_window = v.event.has_group && group.kind == AttentionKind::kSlidingWindow;
  p.pack_map(10 + (v.event.has_group ? 1 : 0) + (has_window ? 1 : 0));
  pack_str(p, "type");
  pack_str(p, "BlockStored");
  pack_str(p, "block_hashes");
  pack_hashes(p, v.hashes);
  pack_str(p, "parent_block_hash");
  if (v.event.has_parent) {
    pack_hash(p, v.event.parent);
  } else {
    p.pack_nil();
  }
  pack_str(p, "token_ids");
  p.pack_array(static_cast<uint32_t>(v.tokens.size()));
  for (const TokenId t : v.tokens) p.pack_int32(t);
  pack_str(p, "block_size");
  p.pack_int32(v.event.block_size);
  pack_str(p, "lora_id");
  p.pack_nil();
  pack_str(p, "medium");
  pack_medium(p, v.event.medium, options);
  pack_str(p, "lora_name");
  p.pack_nil();
  // One entry per block, as vLLM sends them: our extra keys go into every block's hash.
  pack_str(p, "extra_keys");
  p.pack_array(static_cast<uint32_t>(v.hashes.size()));
  for (size_t i = 0; i < v.hashes.size(); ++i) {
    if (v.extra_keys.empty()) {
      p.pack_nil();
      continue;
    }
    p.pack_array(static_cast<uint32_t>(v.extra_keys.size()));
    for (const uint64_t k : v.extra_keys) p.pack_uint64(k);
  }
  pack_str(p, "group_idx");
  p.pack_int32(v.event.has_group ? group.index : 0);
  if (!v.event.has_group) return;
  pack_str(p, "kv_cache_spec_kind");
  pack_str(p, spec_kind_name(group.kind));
  if (!has_window) return;
  pack_str(p, "kv_cache_spec_sliding_window");
  p.pack_int32(group.window);
}

void pack_removed(Packer& p, const StagedEventView& v, const WireOptions& options) {
  p.pack_map(4);
  pack_str(p, "type");
  pack_str(p, "BlockRemoved");
  pack_str(p, "block_hashes");
  pack_hashes(p, v.hashes);
  pack_str(p, "medium");
  pack_medium(p, v.event.medium, options);
  pack_str(p, "group_idx");
  p.pack_int32(v.event.has_group ? v.event.group.index : 0);
}

void store_big_endian(uint64_t value, char* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(value & 0xff);
    value >>= 8;
  }
}

}  // namespace

const char* spec_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kFull:
      return "full_attention";
    case AttentionKind::kSlidingWindow:
      return "sliding_window";
    case AttentionKind::kChunkedLocal:
      return "chunked_local_attention";
    case AttentionKind::kState:
      return "mamba";  // vLLM's MambaSpec
  }
  return "unknown";  // vLLM's KVCacheSpecKind.UNKNOWN
}

std::array<char, 16> hash_bytes(const BlockHash& hash) {
  std::array<char, 16> bytes;
  store_big_endian(hash.hi, bytes.data());
  store_big_endian(hash.lo, bytes.data() + 8);
  return bytes;
}

std::array<char, 8> seq_bytes(int64_t seq) {
  std::array<char, 8> bytes;
  store_big_endian(static_cast<uint64_t>(seq), bytes.data());
  return bytes;
}

void encode_batch(const StagedBatch& batch, const WireOptions& options, std::string* out) {
  out->clear();
  // Room for the whole batch up front (about 150 bytes per one-block BlockStored).
  out->reserve(16 + 140 * batch.events.size() + 18 * batch.hashes.size() + 5 * batch.tokens.size() +
               9 * batch.extra_keys.size());
  StringSink sink{out};
  Packer p(sink);
  p.pack_array(3);
  p.pack_double(batch.timestamp);
  p.pack_array(static_cast<uint32_t>(batch.events.size()));
  batch.for_each([&](const StagedEventView& v) {
    switch (v.event.kind) {
      case EventKind::kStored:
        pack_stored(p, v, options);
        break;
      case EventKind::kRemoved:
        pack_removed(p, v, options);
        break;
      case EventKind::kCleared:
        p.pack_map(1);
        pack_str(p, "type");
        pack_str(p, "AllBlocksCleared");
        break;
    }
  });
  p.pack_int32(options.data_parallel_rank);
}

}  // namespace pagedkv::internal
