#include "pagedkv/remote_namespace.h"

#include <xxhash.h>

#include <utility>

namespace pagedkv {
namespace {

// The canonical bytes that the digest covers: fixed-width little-endian integers, so the
// digest is the same on every machine and build.
class CanonicalBytes {
 public:
  void add_u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void add_i32(int32_t v) { add_u32(static_cast<uint32_t>(v)); }
  void add_text(const std::string& text) {  // length-prefixed: "ab"+"c" != "a"+"bc"
    const uint64_t size = text.size();
    add_u32(static_cast<uint32_t>(size));
    add_u32(static_cast<uint32_t>(size >> 32));
    bytes_.append(text);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

std::string lowercase_hex(const XXH128_hash_t& h) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(kRemoteNamespaceDigestChars);
  for (const uint64_t half : {h.high64, h.low64}) {
    for (int shift = 60; shift >= 0; shift -= 4) text.push_back(kHex[(half >> shift) & 0xf]);
  }
  return text;
}

}  // namespace

RemoteNamespace remote_namespace_for(const KvCacheSpec& spec, std::string model_id, KvLayout layout,
                                     int32_t tp_rank, int32_t tp_size) {
  RemoteNamespace ns;
  ns.model_id = std::move(model_id);
  ns.dtype = spec.dtype;
  ns.layout = layout;
  ns.latent = spec.latent;
  ns.block_size = spec.block_size;
  ns.num_layers = spec.num_layers;
  ns.num_kv_heads = spec.num_kv_heads;
  ns.head_dim = spec.head_dim;
  ns.tp_rank = tp_rank;
  ns.tp_size = tp_size;
  return ns;
}

bool is_remote_namespace_digest(std::string_view text) {
  if (text.size() != static_cast<size_t>(kRemoteNamespaceDigestChars)) return false;
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string remote_namespace_digest(const RemoteNamespace& ns) {
  CanonicalBytes c;
  c.add_u32(ns.format_version);  // first, so a later version may reorder the rest
  c.add_text(ns.model_id);
  c.add_u32(static_cast<uint32_t>(ns.dtype));
  c.add_u32(static_cast<uint32_t>(ns.layout));
  c.add_u32(ns.latent ? 1 : 0);
  c.add_i32(ns.block_size);
  c.add_i32(ns.num_layers);
  c.add_i32(ns.num_kv_heads);
  c.add_i32(ns.head_dim);
  c.add_i32(ns.tp_rank);
  c.add_i32(ns.tp_size);
  return lowercase_hex(XXH3_128bits(c.bytes().data(), c.bytes().size()));
}

}  // namespace pagedkv
