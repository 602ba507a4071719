// File: pagedkv/remote_namespace.h
//
// RemoteNamespace: everything that makes two engines' KV blocks interchangeable in a
// remote store (model, dtype, layout, block size, layers, KV heads, head dim, TP rank and
// size, value format version). Its digest is the namespace part of remote_block_key() and
// is stored in every block's header (remote_block_format.h), so two models, layouts or
// TP shards never read each other's blocks.
//
// Pure computation: no I/O, no hiredis (library pagedkv::remote_format).
//
// Example:
//   KvCacheSpec spec{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128,
//                    .dtype = DType::kBFloat16, .block_size = 16};
//   RemoteNamespace ns = remote_namespace_for(spec, "meta-llama/Llama-3.1-8B@5206a32",
//                                             KvLayout::kHND, /*tp_rank=*/0, /*tp_size=*/1);
//   std::string digest = remote_namespace_digest(ns);  // 32 lowercase hex digits
//   std::string key = remote_block_key(digest, hash);
#ifndef PAGEDKV_REMOTE_NAMESPACE_H_
#define PAGEDKV_REMOTE_NAMESPACE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_spec.h"
#include "pagedkv/kv_cache_view.h"

namespace pagedkv {

// Version of the block value format (remote_block_format.h). Part of the namespace, so a
// new format never reads an old one's blocks under the same key.
inline constexpr uint32_t kRemoteBlockFormatVersion = 1;

// Characters of a namespace digest: XXH3-128 as lowercase hex.
inline constexpr int kRemoteNamespaceDigestChars = 32;

struct RemoteNamespace {
  // The model's identity, exact weights included (e.g. "org/name@revision"): engines with
  // different weights must not share KV. Any bytes; compared exactly.
  std::string model_id;
  DType dtype = DType::kBFloat16;
  KvLayout layout = KvLayout::kHND;  // layout of the payload's per-layer K and V
  bool latent = false;               // MLA latent cache (KvCacheSpec::latent)
  int32_t block_size = 16;           // tokens per block
  int32_t num_layers = 1;
  int32_t num_kv_heads = 1;  // KV heads this TP rank holds
  int32_t head_dim = 128;
  int32_t tp_rank = 0;  // tensor-parallel rank, in [0, tp_size)
  int32_t tp_size = 1;
  uint32_t format_version = kRemoteBlockFormatVersion;
};

// The namespace of an engine's TP rank whose KV cache `spec` describes (num_kv_heads: the
// heads this rank holds). Takes every shape field of `spec`, latent included.
RemoteNamespace remote_namespace_for(const KvCacheSpec& spec, std::string model_id, KvLayout layout,
                                     int32_t tp_rank, int32_t tp_size);

// XXH3-128 of every field of `ns` (model_id length-prefixed, integers little-endian), as
// kRemoteNamespaceDigestChars lowercase hex digits: printable, without ':', fit for
// remote_block_key(). Any field that differs gives a different digest (up to hash
// collisions). Deterministic across machines and builds.
std::string remote_namespace_digest(const RemoteNamespace& ns);

// Whether `text` has a digest's form: kRemoteNamespaceDigestChars lowercase hex digits.
bool is_remote_namespace_digest(std::string_view text);

}  // namespace pagedkv

#endif  // PAGEDKV_REMOTE_NAMESPACE_H_
