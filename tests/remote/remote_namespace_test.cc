// RemoteNamespace digests: printable key text, deterministic, and different for every
// field that differs.
#include "pagedkv/remote_namespace.h"

#include <catch2/catch.hpp>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "pagedkv/remote_kv_store.h"

namespace pagedkv {
namespace {

KvCacheSpec llama_8b_spec() {
  return KvCacheSpec{.num_layers = 32,
                     .num_kv_heads = 8,
                     .head_dim = 128,
                     .dtype = DType::kBFloat16,
                     .block_size = 16};
}

RemoteNamespace llama_8b() {
  return remote_namespace_for(llama_8b_spec(), "meta-llama/Llama-3.1-8B@rev1", KvLayout::kHND,
                              /*tp_rank=*/0, /*tp_size=*/1);
}

TEST_CASE("remote_namespace_for takes every shape field of the spec") {
  KvCacheSpec spec = llama_8b_spec();
  spec.latent = true;
  spec.num_kv_heads = 1;
  const RemoteNamespace ns = remote_namespace_for(spec, "m", KvLayout::kNHD, 3, 4);
  CHECK(ns.model_id == "m");
  CHECK(ns.dtype == DType::kBFloat16);
  CHECK(ns.layout == KvLayout::kNHD);
  CHECK(ns.latent);
  CHECK(ns.block_size == 16);
  CHECK(ns.num_layers == 32);
  CHECK(ns.num_kv_heads == 1);
  CHECK(ns.head_dim == 128);
  CHECK(ns.tp_rank == 3);
  CHECK(ns.tp_size == 4);
  CHECK(ns.format_version == kRemoteBlockFormatVersion);
}

TEST_CASE("a namespace digest is 32 lowercase hex digits, usable in a block key") {
  const std::string digest = remote_namespace_digest(llama_8b());
  REQUIRE(digest.size() == static_cast<size_t>(kRemoteNamespaceDigestChars));
  for (const char c : digest) CHECK(((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')));
  const std::string key = remote_block_key(digest, BlockHash{1, 2});
  // append(), not operator+: GCC 12's -Wrestrict misfires on "..." + std::string at -O3.
  std::string expected = "pagedkv:";
  expected.append(digest).append(":00000000000000020000000000000001");
  CHECK(key == expected);
}

TEST_CASE("a namespace digest is deterministic") {
  CHECK(remote_namespace_digest(llama_8b()) == remote_namespace_digest(llama_8b()));
  // Pinned: a change of the canonical bytes would orphan every block already stored.
  CHECK(remote_namespace_digest(llama_8b()) == "15ea6d4b0182ba4288d63ce4dd4d17b6");
}

TEST_CASE("a namespace digest changes with each field") {
  const std::vector<std::pair<const char*, std::function<void(RemoteNamespace&)>>> changes = {
      {"model_id", [](RemoteNamespace& ns) { ns.model_id += "x"; }},
      {"model_id empty", [](RemoteNamespace& ns) { ns.model_id.clear(); }},
      {"dtype", [](RemoteNamespace& ns) { ns.dtype = DType::kFloat16; }},
      {"layout", [](RemoteNamespace& ns) { ns.layout = KvLayout::kNHD; }},
      {"latent", [](RemoteNamespace& ns) { ns.latent = true; }},
      {"block_size", [](RemoteNamespace& ns) { ns.block_size = 32; }},
      {"num_layers", [](RemoteNamespace& ns) { ns.num_layers = 31; }},
      {"num_kv_heads", [](RemoteNamespace& ns) { ns.num_kv_heads = 4; }},
      {"head_dim", [](RemoteNamespace& ns) { ns.head_dim = 64; }},
      {"tp_rank", [](RemoteNamespace& ns) { ns.tp_rank = 1; }},
      {"tp_size", [](RemoteNamespace& ns) { ns.tp_size = 2; }},
      {"format_version", [](RemoteNamespace& ns) { ns.format_version += 1; }},
  };
  std::set<std::string> digests = {remote_namespace_digest(llama_8b())};
  for (const auto& [field, change] : changes) {
    RemoteNamespace ns = llama_8b();
    change(ns);
    INFO("changed " << field);
    CHECK(digests.insert(remote_namespace_digest(ns)).second);
  }
}

}  // namespace
}  // namespace pagedkv
