// KvStorage (pagedkv/kv_storage.h) on each backend (support/backends.h): sizing, views,
// and byte-exact copy-on-write, swap, host-tier and state-slot copies, every case on the
// CPU and, where a device is usable, on CUDA (device pools, the pinned host pool, one
// kernel launch per batch). The pools are filled and read through copies from and to the
// host, so each case checks the same bytes on both.
#include "pagedkv/kv_storage.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/backends.h"

namespace pagedkv {
namespace {

using testing::copy_from_backend;
using testing::copy_to_backend;

const KvCacheSpec kSpec{
    .num_layers = 3, .num_kv_heads = 2, .head_dim = 64, .dtype = DType::kBFloat16, .block_size = 8};

// Pool bytes are copied through the storage's device: on CUDA cudaMemcpy reads and writes
// device pools and the pinned host pool alike (and waits for the queued copies first).

// `bytes` bytes at `at`, memory of a storage on `device`.
std::vector<uint8_t> read_bytes(Device device, const void* at, int64_t bytes) {
  std::vector<uint8_t> out(bytes);
  copy_from_backend(device, out.data(), at, out.size());
  return out;
}

// Sets `bytes` bytes at `at`, memory of a storage on `device`, to `value`.
void set_bytes(Device device, void* at, uint8_t value, int64_t bytes) {
  const std::vector<uint8_t> fill(bytes, value);
  copy_to_backend(device, at, fill.data(), fill.size());
}

// Bytes of one token row (head_dim elements) of (layer, K or V, block, head, token).
std::vector<uint8_t> row(Device device, const KvCacheView& view, bool is_v, int32_t block,
                         int32_t head, int32_t token) {
  const int64_t elem = bytes_per_element(view.dtype);
  const uint8_t* base = static_cast<const uint8_t*>(is_v ? view.v : view.k);
  return read_bytes(device, base + elem_offset(view, block, head, token, 0) * elem,
                    view.head_dim * elem);
}

void fill_random(const KvStorage& s, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int32_t layer = 0; layer < s.spec().num_layers; ++layer) {
    for (const KvCacheView& v : {s.view(layer), s.host_view(layer)}) {
      std::vector<uint8_t> bytes(pool_elements(v) * bytes_per_element(v.dtype));
      for (void* pool : {v.k, v.v}) {
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        copy_to_backend(s.device(), pool, bytes.data(), bytes.size());
      }
    }
  }
}

std::vector<uint8_t> snapshot(const KvStorage& s, bool host) {
  std::vector<uint8_t> out;
  for (int32_t layer = 0; layer < s.spec().num_layers; ++layer) {
    const KvCacheView v = host ? s.host_view(layer) : s.view(layer);
    const int64_t bytes = pool_elements(v) * bytes_per_element(v.dtype);
    for (const void* pool : {v.k, v.v}) {
      const std::vector<uint8_t> p = read_bytes(s.device(), pool, bytes);
      out.insert(out.end(), p.begin(), p.end());
    }
  }
  return out;
}

KvStorage make(Device device, KvLayout layout, int32_t num_blocks = 10, int32_t host_blocks = 6) {
  absl::StatusOr<KvStorage> s = KvStorage::create(
      kSpec, num_blocks, {.device = device, .layout = layout, .num_host_blocks = host_blocks});
  REQUIRE(s.ok());
  return std::move(*s);
}

BACKEND_TEST_CASE("storage holds every layer's K and V pools, zero-filled", "[kv_storage]") {
  KvStorage s = make(device, KvLayout::kHND);
  CHECK(s.bytes() == kSpec.bytes_per_block() * 10);
  CHECK(s.host_bytes() == kSpec.bytes_per_block() * 6);
  const std::vector<uint8_t> all = snapshot(s, false);
  CHECK(static_cast<int64_t>(all.size()) == s.bytes());
  CHECK(std::all_of(all.begin(), all.end(), [](uint8_t b) { return b == 0; }));
  // Pools are disjoint and in [layer][K, V] order.
  const KvCacheView l0 = s.view(0), l1 = s.view(1);
  const int64_t pool = pool_elements(l0) * 2;
  CHECK(static_cast<char*>(l0.v) - static_cast<char*>(l0.k) == pool);
  CHECK(static_cast<char*>(l1.k) - static_cast<char*>(l0.k) == 2 * pool);
  CHECK(l0.block_stride == 2 * 8 * 64);
  CHECK(l0.head_stride == 8 * 64);
  CHECK(l0.token_stride == 64);
  KvStorage nhd = make(device, KvLayout::kNHD);
  CHECK(nhd.view(2).head_stride == 64);
  CHECK(nhd.view(2).token_stride == 2 * 64);
  CHECK(nhd.host_view(0).num_blocks == 6);
}

BACKEND_TEST_CASE("storage sized from a byte budget holds whole blocks", "[kv_storage]") {
  const int64_t budget = kSpec.bytes_per_block() * 7 + 100;
  absl::StatusOr<KvStorage> s = KvStorage::create_for_budget(kSpec, budget, {.device = device});
  REQUIRE(s.ok());
  CHECK(s->num_blocks() == 7);
  absl::StatusOr<KvStorage> tiny = KvStorage::create_for_budget(kSpec, 100, {.device = device});
  CHECK(tiny.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(tiny.status().message().find("does not hold one block") != std::string::npos);
  // A thousandth of the free memory (available physical memory on the CPU, cudaMemGetInfo
  // on CUDA) holds whole blocks of kSpec.
  absl::StatusOr<int64_t> free_budget = KvStorage::free_memory_budget(device, 0.001);
  REQUIRE(free_budget.ok());
  REQUIRE(*free_budget >= kSpec.bytes_per_block());
  absl::StatusOr<KvStorage> from_free =
      KvStorage::create_for_budget(kSpec, *free_budget, {.device = device});
  REQUIRE(from_free.ok());
  CHECK(from_free->num_blocks() == *kSpec.num_blocks_for_budget(*free_budget));
  CHECK(from_free->bytes() <= *free_budget);
  CHECK(KvStorage::free_memory_budget(device, 0.0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  if (device == Device::kCpu && !cuda_device_available()) {
    CHECK(KvStorage::create(kSpec, 4, {.device = Device::kCuda}).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  }
}

BACKEND_TEST_CASE("a latent (MLA) spec has one pool per layer, the latents, and no V",
                  "[kv_storage]") {
  const KvCacheSpec mla{.num_layers = 2,
                        .num_kv_heads = 1,
                        .head_dim = 40,  // e.g. kv_lora_rank 32 + rope 8
                        .dtype = DType::kBFloat16,
                        .block_size = 16,
                        .latent = true};
  absl::StatusOr<KvStorage> s = KvStorage::create(mla, 5, {.device = device, .num_host_blocks = 3});
  REQUIRE(s.ok());
  // 40 x 2 bytes per token and layer: 1,280 bytes per layer's block, 2,560 per block.
  CHECK(mla.bytes_per_block() == 2560);
  CHECK(s->bytes() == 5 * 2560);
  CHECK(s->host_bytes() == 3 * 2560);
  const KvCacheView l0 = s->view(0), l1 = s->view(1);
  CHECK(l0.v == nullptr);
  CHECK(l1.v == nullptr);
  CHECK(s->host_view(1).v == nullptr);
  CHECK(l0.num_kv_heads == 1);
  CHECK(l0.head_dim == 40);
  CHECK(static_cast<char*>(l1.k) - static_cast<char*>(l0.k) == 5 * 1280);
  CHECK(static_cast<char*>(s->host_view(1).k) - static_cast<char*>(s->host_view(0).k) == 3 * 1280);

  // Copies move the latents of every layer, and nothing past them.
  std::mt19937 rng(31);
  std::vector<uint8_t> random(5 * 1280);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (uint8_t& b : random) b = static_cast<uint8_t>(rng());
    copy_to_backend(device, s->view(layer).k, random.data(), random.size());
  }
  auto latents = [&](bool host) {
    std::vector<uint8_t> all;
    for (int32_t layer = 0; layer < 2; ++layer) {
      const KvCacheView v = host ? s->host_view(layer) : s->view(layer);
      const std::vector<uint8_t> pool = read_bytes(device, v.k, v.num_blocks * 1280);
      all.insert(all.end(), pool.begin(), pool.end());
    }
    return all;
  };
  const std::vector<uint8_t> before = latents(false);
  REQUIRE(s->copy_blocks(std::vector<BlockCopy>{{.src = 1, .dst = 4, .num_tokens = 5}}).ok());
  REQUIRE(s->swap_out(std::vector<BlockCopy>{{.src = 2, .dst = 0, .num_tokens = 16},
                                             {.src = 4, .dst = 2, .num_tokens = 16}})
              .ok());
  const std::vector<uint8_t> after_cow = latents(false);
  for (int32_t layer = 0; layer < 2; ++layer) {
    const int64_t base = layer * 5 * 1280;
    for (int32_t t = 0; t < 16; ++t) {
      const int64_t src = base + (t < 5 ? 1 : 4) * 1280 + t * 80;
      const int64_t dst = base + 4 * 1280 + t * 80;
      REQUIRE(
          std::equal(after_cow.begin() + dst, after_cow.begin() + dst + 80, before.begin() + src));
    }
  }
  set_bytes(device, s->view(0).k, 0x5a, 5 * 1280);
  set_bytes(device, s->view(1).k, 0xa5, 5 * 1280);
  REQUIRE(s->swap_in(std::vector<BlockCopy>{{.src = 0, .dst = 2, .num_tokens = 16},
                                            {.src = 2, .dst = 4, .num_tokens = 16}})
              .ok());
  const std::vector<uint8_t> back = latents(false);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t b : {2, 4}) {
      const int64_t at = layer * 5 * 1280 + b * 1280;
      REQUIRE(std::equal(back.begin() + at, back.begin() + at + 1280, after_cow.begin() + at));
    }
  }
}

// Two storages of one hybrid model: group 0 (2 layers of 2 KV heads) and group 1 (1 layer
// of 1 KV head), pools of their own sizes.
struct Groups {
  explicit Groups(Device device)
      : full(make_group(device,
                        {.num_layers = 2,
                         .num_kv_heads = 2,
                         .head_dim = 64,
                         .dtype = DType::kFloat32,
                         .block_size = 4},
                        6, 4, 0)),
        window(make_group(device,
                          {.num_layers = 1,
                           .num_kv_heads = 1,
                           .head_dim = 64,
                           .dtype = DType::kFloat32,
                           .block_size = 4},
                          3, 2, 1)) {}
  KvStorage full;
  KvStorage window;

  static KvStorage make_group(Device device, const KvCacheSpec& spec, int32_t blocks, int32_t host,
                              int32_t g) {
    absl::StatusOr<KvStorage> s = KvStorage::create(
        spec, blocks, {.device = device, .num_host_blocks = host, .layer_group = g});
    REQUIRE(s.ok());
    return std::move(*s);
  }
};

BACKEND_TEST_CASE("a storage per layer group: exact sizes, and each runs its own group's step ops",
                  "[kv_storage]") {
  Groups g(device);
  CHECK(g.full.layer_group() == 0);
  CHECK(g.window.layer_group() == 1);
  // 2 layers x (K, V) x 2 heads x 4 tokens x 64 x 4 bytes = 8 KiB per block; 1 x 2 x 1 x
  // 4 x 64 x 4 = 2 KiB.
  CHECK(g.full.bytes() == 6 * 8192);
  CHECK(g.full.host_bytes() == 4 * 8192);
  CHECK(g.window.bytes() == 3 * 2048);
  CHECK(g.window.host_bytes() == 2 * 2048);
  fill_random(g.full, 41);
  fill_random(g.window, 43);
  const std::vector<uint8_t> full_device = snapshot(g.full, false);
  const std::vector<uint8_t> window_device = snapshot(g.window, false);
  const std::vector<uint8_t> window_host = snapshot(g.window, true);
  // One step of both groups, the ids of each in its own pools: group 0's block 5 does not
  // exist in group 1's pool of 3, so running group 0's ops there would be refused.
  StepOps ops;
  ops.swap_out = {{.src = 5, .dst = 3, .num_tokens = 4, .group = 0},
                  {.src = 2, .dst = 1, .num_tokens = 4, .group = 1}};
  ops.copy_on_write = {{.src = 0, .dst = 1, .num_tokens = 2, .group = 1},
                       {.src = 4, .dst = 5, .num_tokens = 3, .group = 0}};
  ops.promote = {{.src = 0, .dst = 2, .num_tokens = 4, .group = 0}};
  // Expected: group 0 swaps block 5 out (before the copy overwrites it), copies 3 tokens
  // of block 4 into block 5, promotes host block 0 into block 2; group 1 swaps block 2 out
  // and copies 2 tokens of block 0 into block 1.
  REQUIRE(g.full.run_step_ops(ops).ok());
  REQUIRE(g.window.run_step_ops(ops).ok());
  for (int32_t layer = 0; layer < 2; ++layer) {
    const KvCacheView d = g.full.view(layer), h = g.full.host_view(layer);
    for (bool is_v : {false, true}) {
      const int64_t pool = (2 * layer + (is_v ? 1 : 0)) * 6 * 2048;  // one pool: 6 blocks
      for (int32_t head = 0; head < 2; ++head) {
        for (int32_t t = 0; t < 4; ++t) {
          auto original = [&](int32_t block) {
            const int64_t at = pool + elem_offset(d, block, head, t, 0) * 4;
            return std::vector<uint8_t>(full_device.begin() + at, full_device.begin() + at + 256);
          };
          REQUIRE(row(device, h, is_v, 3, head, t) == original(5));
          REQUIRE(row(device, d, is_v, 5, head, t) == original(t < 3 ? 4 : 5));
          REQUIRE(row(device, d, is_v, 2, head, t) == row(device, h, is_v, 0, head, t));
        }
      }
    }
  }
  const KvCacheView w = g.window.view(0), wh = g.window.host_view(0);
  for (bool is_v : {false, true}) {
    const int64_t pool = (is_v ? 1 : 0) * 3 * 1024;
    for (int32_t t = 0; t < 4; ++t) {
      auto original = [&](int32_t block) {
        const int64_t at = pool + elem_offset(w, block, 0, t, 0) * 4;
        return std::vector<uint8_t>(window_device.begin() + at, window_device.begin() + at + 256);
      };
      REQUIRE(row(device, wh, is_v, 1, 0, t) == original(2));
      REQUIRE(row(device, w, is_v, 1, 0, t) == original(t < 2 ? 0 : 1));
      REQUIRE(row(device, w, is_v, 0, 0, t) == original(0));
      REQUIRE(row(device, w, is_v, 2, 0, t) == original(2));  // group 0's promotion is not its own
    }
  }
  // Host block 0 of group 1 was not touched (group 0 promoted from its own host block 0).
  const std::vector<uint8_t> host_now = snapshot(g.window, true);
  const int64_t host_block = 1024;  // one pool's host block
  for (int64_t b = 0; b < static_cast<int64_t>(host_now.size()); ++b) {
    if (b / host_block % 2 != 1) REQUIRE(host_now[b] == window_host[b]);
  }
}

BACKEND_TEST_CASE("a storage refuses another layer group's copies, naming the group",
                  "[kv_storage]") {
  Groups g(device);
  fill_random(g.window, 47);
  const std::vector<uint8_t> device_bytes = snapshot(g.window, false),
                             host = snapshot(g.window, true);
  auto expect = [&](const absl::Status& st, const std::string& fragment) {
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(st.message().find(fragment) != std::string::npos);
    CHECK(snapshot(g.window, false) == device_bytes);  // the valid first op did not run either
    CHECK(snapshot(g.window, true) == host);
  };
  const BlockCopy own{.src = 0, .dst = 1, .num_tokens = 4, .group = 1};
  const BlockCopy other{.src = 1, .dst = 0, .num_tokens = 4, .group = 0};
  const std::string message = "op 1: layer group 0 is not this storage's (1)";
  expect(g.window.copy_blocks(std::vector<BlockCopy>{own, other}), "copy_blocks: " + message);
  expect(g.window.swap_out(std::vector<BlockCopy>{own, other}), "swap_out: " + message);
  expect(g.window.swap_in(std::vector<BlockCopy>{own, other}), "swap_in: " + message);
  expect(g.window.demote(std::vector<BlockCopy>{own, other}), "demote: " + message);
  expect(g.window.promote(std::vector<BlockCopy>{own, other}), "promote: " + message);
  expect(g.window.exchange(std::vector<BlockCopy>{own, other}), "exchange: " + message);
  // Group 0's storage (the default group) refuses group 1's.
  CHECK(g.full.copy_blocks(std::vector<BlockCopy>{own})
            .message()
            .find("copy_blocks: op 0: layer group 1 is not this storage's (0)") !=
        std::string::npos);
  absl::StatusOr<KvStorage> negative =
      KvStorage::create(kSpec, 2, {.device = device, .layer_group = -1});
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(negative.status().message().find("layer_group -1 must be >= 0") != std::string::npos);
}

BACKEND_TEST_CASE("copy-on-write copies the first num_tokens tokens of every layer exactly",
                  "[kv_storage]") {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    KvStorage s = make(device, layout);
    fill_random(s, 7);
    const std::vector<uint8_t> before = snapshot(s, false);
    const std::vector<BlockCopy> ops = {{.src = 1, .dst = 4, .num_tokens = 3},
                                        {.src = 2, .dst = 5, .num_tokens = 8},
                                        {.src = 1, .dst = 6, .num_tokens = 0}};
    // Expected rows, computed before the copy.
    std::vector<std::vector<uint8_t>> expected;
    for (int32_t layer = 0; layer < 3; ++layer) {
      for (bool is_v : {false, true}) {
        for (const BlockCopy& op : ops) {
          for (int32_t h = 0; h < 2; ++h) {
            for (int32_t t = 0; t < 8; ++t) {
              expected.push_back(
                  row(device, s.view(layer), is_v, t < op.num_tokens ? op.src : op.dst, h, t));
            }
          }
        }
      }
    }
    REQUIRE(s.copy_blocks(ops).ok());
    size_t i = 0;
    for (int32_t layer = 0; layer < 3; ++layer) {
      for (bool is_v : {false, true}) {
        for (const BlockCopy& op : ops) {
          for (int32_t h = 0; h < 2; ++h) {
            for (int32_t t = 0; t < 8; ++t) {
              REQUIRE(row(device, s.view(layer), is_v, op.dst, h, t) == expected[i++]);
            }
          }
        }
      }
    }
    // Blocks other than the dsts are unchanged.
    const std::vector<uint8_t> after = snapshot(s, false);
    const int64_t block = kSpec.bytes_per_block() / 3 / 2;  // one pool's block
    int64_t changed = 0;
    for (size_t b = 0; b < after.size(); ++b) {
      const int64_t id = static_cast<int64_t>(b) / block % 10;
      if (id != 4 && id != 5 && after[b] != before[b]) ++changed;
    }
    CHECK(changed == 0);
  }
}

BACKEND_TEST_CASE("swap out then swap in restores the blocks bit for bit", "[kv_storage]") {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    KvStorage s = make(device, layout);
    fill_random(s, 11);
    const std::vector<uint8_t> original = snapshot(s, false);
    const std::vector<BlockCopy> out = {{.src = 3, .dst = 0, .num_tokens = 8},
                                        {.src = 9, .dst = 5, .num_tokens = 8},
                                        {.src = 0, .dst = 2, .num_tokens = 8}};
    REQUIRE(s.swap_out(out).ok());
    for (int32_t layer = 0; layer < 3; ++layer) {  // the blocks are reused meanwhile
      for (int32_t b : {3, 9, 0}) {
        KvCacheView v = s.view(layer);
        const int64_t bytes = v.block_stride * 2;
        set_bytes(device, static_cast<char*>(v.k) + b * bytes, 0x5a, bytes);
        set_bytes(device, static_cast<char*>(v.v) + b * bytes, 0xa5, bytes);
      }
    }
    CHECK(snapshot(s, false) != original);
    const std::vector<BlockCopy> in = {{.src = 0, .dst = 3, .num_tokens = 8},
                                       {.src = 5, .dst = 9, .num_tokens = 8},
                                       {.src = 2, .dst = 0, .num_tokens = 8}};
    REQUIRE(s.swap_in(in).ok());
    CHECK(snapshot(s, false) == original);
  }
}

BACKEND_TEST_CASE(
    "read_block then write_block into another block copies it bit for bit, all layers",
    "[kv_storage]") {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    KvStorage s = make(device, layout);
    fill_random(s, 23);
    std::vector<std::byte> payload(static_cast<size_t>(kSpec.bytes_per_block()));
    REQUIRE(s.read_block(4, payload).ok());
    REQUIRE(s.write_block(7, payload).ok());
    for (int32_t layer = 0; layer < kSpec.num_layers; ++layer) {
      for (const bool is_v : {false, true}) {
        for (int32_t head = 0; head < kSpec.num_kv_heads; ++head) {
          for (int32_t token = 0; token < kSpec.block_size; ++token) {
            CHECK(row(device, s.view(layer), is_v, 7, head, token) ==
                  row(device, s.view(layer), is_v, 4, head, token));
          }
        }
      }
    }
    // The payload is the pools' bytes in order: layer 0's K block first.
    const KvCacheView v0 = s.view(0);
    const std::vector<uint8_t> k_block =
        read_bytes(device, static_cast<const char*>(v0.k) + 4 * v0.block_stride * 2,
                   kSpec.bytes_per_block() / 6);
    CHECK(std::memcmp(payload.data(), k_block.data(), k_block.size()) == 0);
  }
}

BACKEND_TEST_CASE("read_block and write_block refuse a bad block or size, copying nothing",
                  "[kv_storage]") {
  KvStorage s = make(device, KvLayout::kHND);
  fill_random(s, 29);
  const std::vector<uint8_t> before = snapshot(s, false);
  std::vector<std::byte> payload(static_cast<size_t>(kSpec.bytes_per_block()));
  const absl::Status outside = s.write_block(10, payload);
  CHECK(absl::IsInvalidArgument(outside));
  CHECK_THAT(std::string(outside.message()), Catch::Contains("block 10 outside [0, 10)"));
  const absl::Status short_span = s.write_block(1, std::span(payload).first(100));
  CHECK(absl::IsInvalidArgument(short_span));
  CHECK_THAT(std::string(short_span.message()), Catch::Contains("100 bytes for a block of"));
  CHECK(absl::IsInvalidArgument(s.read_block(-1, payload)));
  CHECK(snapshot(s, false) == before);
}

// A state group's storage: 2 layers, each slot 4 fp32 conv elements then 8 bf16
// recurrent ones (32 bytes); 5 device slots, 2 host slots.
constexpr StateShape kState{.num_layers = 2,
                            .conv_elements = 4,
                            .recurrent_elements = 8,
                            .conv_dtype = DType::kFloat32,
                            .recurrent_dtype = DType::kBFloat16};

// Every byte of (layer, slot) set to a value naming both.
void fill_slots(const KvStorage& s) {
  for (int32_t layer = 0; layer < s.spec().num_layers; ++layer) {
    for (int32_t slot = 0; slot < s.num_blocks(); ++slot) {
      set_bytes(s.device(), s.state(layer, slot), static_cast<uint8_t>(16 * layer + slot + 1), 32);
    }
  }
}

// The byte every position of (layer, slot) holds, or -1 when they differ.
int slot_byte(const KvStorage& s, int32_t layer, int32_t slot) {
  const std::vector<uint8_t> p = read_bytes(s.device(), s.state(layer, slot), 32);
  for (int i = 1; i < 32; ++i) {
    if (p[i] != p[0]) return -1;
  }
  return p[0];
}

BACKEND_TEST_CASE("a state storage holds slots per layer and runs its group's state copies",
                  "[kv_storage]") {
  absl::StatusOr<KvStorage> created = KvStorage::create_state(
      kState, 5, {.device = device, .num_host_blocks = 2, .layer_group = 1});
  REQUIRE(created.ok());
  KvStorage& s = *created;
  CHECK(s.holds_state());
  CHECK(s.bytes() == 2 * 5 * 32);
  CHECK(s.host_bytes() == 2 * 2 * 32);
  CHECK(s.state(1, 0) - s.state(0, 0) == 5 * 32);  // a pool per layer
  CHECK(s.state(0, 3) - s.state(0, 2) == 32);
  CHECK(slot_byte(s, 1, 4) == 0);  // zero-filled
  fill_slots(s);
  // Step 1: slot 2 swapped out to host slot 0 (it runs first, before slot 2 is refilled
  // by the checkpoint copy 3 -> 2); slot 1 restored into slot 4; a KV group's op skipped.
  StepOps step;
  step.swap_out = {{.src = 2, .dst = 0, .num_tokens = 16, .group = 1}};
  step.copy_state = {{.src = 3, .dst = 2, .num_tokens = 16, .group = 1},
                     {.src = 1, .dst = 4, .num_tokens = 16, .group = 1},
                     {.src = 0, .dst = 7, .num_tokens = 16, .group = 0}};
  REQUIRE(s.run_step_ops(step).ok());
  for (int32_t layer = 0; layer < 2; ++layer) {
    const int base = 16 * layer + 1;
    CHECK(slot_byte(s, layer, 0) == base + 0);
    CHECK(slot_byte(s, layer, 1) == base + 1);
    CHECK(slot_byte(s, layer, 2) == base + 3);
    CHECK(slot_byte(s, layer, 3) == base + 3);
    CHECK(slot_byte(s, layer, 4) == base + 1);
  }
  // Step 2: host slot 0 (the old slot 2) swapped into slot 0; a zero-token op copies
  // nothing.
  StepOps back;
  back.swap_in = {{.src = 0, .dst = 0, .num_tokens = 16, .group = 1}};
  back.copy_state = {{.src = 4, .dst = 3, .num_tokens = 0, .group = 1}};
  REQUIRE(s.run_step_ops(back).ok());
  for (int32_t layer = 0; layer < 2; ++layer) {
    CHECK(slot_byte(s, layer, 0) == 16 * layer + 1 + 2);
    CHECK(slot_byte(s, layer, 3) == 16 * layer + 1 + 3);
  }
}

BACKEND_TEST_CASE("a state storage demotes checkpoints to host slots and restores them from there",
                  "[kv_storage]") {
  absl::StatusOr<KvStorage> created = KvStorage::create_state(
      kState, 5, {.device = device, .num_host_blocks = 2, .layer_group = 1});
  REQUIRE(created.ok());
  KvStorage& s = *created;
  fill_slots(s);
  // One step, in run order: checkpoint slot 3 demoted into host slot 1 before a restore
  // refills slot 3 from slot 1; then host slot 1 (what the demotion wrote) restored
  // straight into slot 4 (a promote of the state group).
  StepOps step;
  step.demote = {{.src = 3, .dst = 1, .num_tokens = 16, .group = 1}};
  step.copy_state = {{.src = 1, .dst = 3, .num_tokens = 16, .group = 1}};
  step.promote = {{.src = 1, .dst = 4, .num_tokens = 16, .group = 1}};
  REQUIRE(s.run_step_ops(step).ok());
  for (int32_t layer = 0; layer < 2; ++layer) {
    const int base = 16 * layer + 1;
    CHECK(slot_byte(s, layer, 1) == base + 1);
    CHECK(slot_byte(s, layer, 3) == base + 1);
    CHECK(slot_byte(s, layer, 4) == base + 3);
  }
}

BACKEND_TEST_CASE("a state storage refuses bad shapes and bad slot ids, copying nothing",
                  "[kv_storage]") {
  auto refused = [&](const StateShape& shape, int32_t slots, const std::string& fragment) {
    absl::StatusOr<KvStorage> s = KvStorage::create_state(shape, slots, {.device = device});
    INFO(s.status().ToString());
    CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.status().message().find(fragment) != std::string::npos);
  };
  refused({.num_layers = 0, .conv_elements = 4}, 2, "a state shape of 0 layers");
  refused({.num_layers = 1}, 2, "need layers, state");
  refused({.num_layers = 1, .conv_elements = int64_t{1} << 40}, 2, "at most 68719476736");
  refused(kState, -1, "num_slots -1");
  refused({.num_layers = 1, .recurrent_elements = int64_t{1} << 36}, 1 << 30, "bytes per pool");
  absl::StatusOr<KvStorage> s =
      KvStorage::create_state(kState, 3, {.device = device, .num_host_blocks = 1});
  REQUIRE(s.ok());
  fill_slots(*s);
  const std::vector<BlockCopy> out_of_range = {{0, 1, 16}, {3, 2, 16}};
  absl::Status st = s->copy_blocks(out_of_range);
  CHECK(st.message() == "copy_blocks: op 1: src block 3 outside [0, 3) of the device pool");
  const std::vector<BlockCopy> host = {{0, 1, 16}};
  st = s->swap_out(host);
  CHECK(st.message() == "swap_out: op 0: dst block 1 outside [0, 1) of the host pool");
  for (int32_t slot = 0; slot < 3; ++slot) CHECK(slot_byte(*s, 0, slot) == slot + 1);
}

BACKEND_TEST_CASE("write_block then read_block round-trips a state slot, all layers in order",
                  "[kv_storage]") {
  absl::StatusOr<KvStorage> created =
      KvStorage::create_state(kState, 5, {.device = device, .num_host_blocks = 2});
  REQUIRE(created.ok());
  KvStorage& s = *created;
  fill_slots(s);
  // Distinct bytes, so a layer written to the wrong place or order shows.
  std::vector<std::byte> payload(static_cast<size_t>(kState.bytes()));
  REQUIRE(payload.size() == 2 * 32);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(0x80 + i);
  REQUIRE(s.write_block(3, payload).ok());
  for (int32_t layer = 0; layer < 2; ++layer) {
    const std::vector<uint8_t> got = read_bytes(device, s.state(layer, 3), 32);
    CHECK(std::memcmp(got.data(), payload.data() + layer * 32, 32) == 0);
    for (int32_t slot : {0, 1, 2, 4}) CHECK(slot_byte(s, layer, slot) == 16 * layer + slot + 1);
  }
  std::vector<std::byte> back(payload.size());
  REQUIRE(s.read_block(3, back).ok());
  CHECK(back == payload);
  REQUIRE(s.read_block(1, back).ok());  // layer 0's state, then layer 1's
  CHECK(back[0] == std::byte{2});
  CHECK(back[32] == std::byte{18});
  // A K/V block's size, or a slot outside the pool, is refused; nothing is written.
  const absl::Status wrong = s.write_block(0, std::span(payload).first(32));
  CHECK(absl::IsInvalidArgument(wrong));
  CHECK_THAT(std::string(wrong.message()),
             Catch::Contains("write_block: 32 bytes for a state slot of 64"));
  CHECK(absl::IsInvalidArgument(s.read_block(0, std::span(back).first(63))));
  const absl::Status outside = s.write_block(5, payload);
  CHECK_THAT(std::string(outside.message()), Catch::Contains("block 5 outside [0, 5)"));
  for (int32_t layer = 0; layer < 2; ++layer) CHECK(slot_byte(s, layer, 0) == 16 * layer + 1);
}

BACKEND_TEST_CASE("invalid copy batches are refused whole, naming the op", "[kv_storage]") {
  KvStorage s = make(device, KvLayout::kHND);
  fill_random(s, 3);
  const std::vector<uint8_t> main = snapshot(s, false), host = snapshot(s, true);
  auto expect = [&](const absl::Status& st, const std::string& fragment) {
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(st.message().find(fragment) != std::string::npos);
    CHECK(snapshot(s, false) == main);
    CHECK(snapshot(s, true) == host);
  };
  const std::vector<BlockCopy> twice = {{1, 2, 8}, {3, 2, 8}};
  expect(s.copy_blocks(twice), "copy_blocks: op 1: dst block 2 is written twice");
  const std::vector<BlockCopy> chain = {{1, 2, 8}, {2, 3, 8}};
  expect(s.copy_blocks(chain), "op 1: src block 2 is also a dst");
  const std::vector<BlockCopy> range = {{1, 2, 8}, {10, 3, 8}};
  expect(s.copy_blocks(range), "op 1: src block 10 outside [0, 10) of the device pool");
  const std::vector<BlockCopy> host_range = {{1, 6, 8}};
  expect(s.swap_out(host_range), "swap_out: op 0: dst block 6 outside [0, 6) of the host pool");
  const std::vector<BlockCopy> tokens = {{1, 2, 9}};
  expect(s.swap_in(tokens), "num_tokens 9 outside [0, block_size 8]");
}

BACKEND_TEST_CASE("demote then promote brings cached blocks back bit for bit", "[kv_storage]") {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    KvStorage s = make(device, layout);
    fill_random(s, 13);
    const std::vector<uint8_t> device_bytes = snapshot(s, false);
    // Evicted cached blocks 2, 7 and 4 go to host blocks 5, 1 and 3.
    const std::vector<BlockCopy> down = {{.src = 2, .dst = 5, .num_tokens = 8},
                                         {.src = 7, .dst = 1, .num_tokens = 8},
                                         {.src = 4, .dst = 3, .num_tokens = 8}};
    REQUIRE(s.demote(down).ok());
    for (int32_t layer = 0; layer < 3; ++layer) {
      for (bool is_v : {false, true}) {
        for (const BlockCopy& op : down) {
          for (int32_t h = 0; h < 2; ++h) {
            for (int32_t t = 0; t < 8; ++t) {
              REQUIRE(row(device, s.host_view(layer), is_v, op.dst, h, t) ==
                      row(device, s.view(layer), is_v, op.src, h, t));
            }
          }
        }
      }
    }
    CHECK(snapshot(s, false) == device_bytes);  // demotion only reads the device pool
    // The device blocks are reused; later prefix hits promote them into other blocks.
    const std::vector<uint8_t> host = snapshot(s, true);
    fill_random(s, 99);  // clobbers both pools
    for (int32_t layer = 0; layer < 3; ++layer) {
      const KvCacheView v = s.host_view(layer);
      const int64_t bytes = pool_elements(v) * bytes_per_element(v.dtype);
      copy_to_backend(device, v.k, host.data() + 2 * layer * bytes, bytes);
      copy_to_backend(device, v.v, host.data() + (2 * layer + 1) * bytes, bytes);
    }
    const std::vector<BlockCopy> up = {{.src = 5, .dst = 0, .num_tokens = 8},
                                       {.src = 1, .dst = 9, .num_tokens = 8},
                                       {.src = 3, .dst = 6, .num_tokens = 8}};
    REQUIRE(s.promote(up).ok());
    const int64_t elem = bytes_per_element(kSpec.dtype);
    for (int32_t layer = 0; layer < 3; ++layer) {
      const KvCacheView now = s.view(layer);
      for (bool is_v : {false, true}) {
        for (size_t i = 0; i < up.size(); ++i) {
          for (int32_t h = 0; h < 2; ++h) {
            for (int32_t t = 0; t < 8; ++t) {
              // The original row of device block down[i].src, from the first snapshot.
              const int64_t pool_bytes = pool_elements(now) * elem;
              const int64_t at = (2 * layer + (is_v ? 1 : 0)) * pool_bytes +
                                 elem_offset(now, down[i].src, h, t, 0) * elem;
              const std::vector<uint8_t> original(device_bytes.begin() + at,
                                                  device_bytes.begin() + at + now.head_dim * elem);
              REQUIRE(row(device, now, is_v, up[i].dst, h, t) == original);
            }
          }
        }
      }
    }
    CHECK(snapshot(s, true) == host);  // promotion only reads the host pool
  }
}

BACKEND_TEST_CASE("swapped blocks and the host tier share one host pool", "[kv_storage]") {
  // The same host block serves a swap, then (once swapped back in) the tier.
  KvStorage s = make(device, KvLayout::kHND, 10, 2);
  fill_random(s, 5);
  const std::vector<uint8_t> device_bytes = snapshot(s, false);
  const std::vector<BlockCopy> swap = {{.src = 3, .dst = 0, .num_tokens = 8}};
  const std::vector<BlockCopy> tier = {{.src = 8, .dst = 1, .num_tokens = 8}};
  REQUIRE(s.swap_out(swap).ok());
  REQUIRE(s.demote(tier).ok());
  REQUIRE(s.swap_in(std::vector<BlockCopy>{{.src = 0, .dst = 8, .num_tokens = 8}}).ok());
  REQUIRE(s.demote(std::vector<BlockCopy>{{.src = 2, .dst = 0, .num_tokens = 8}}).ok());
  REQUIRE(s.promote(std::vector<BlockCopy>{{.src = 1, .dst = 3, .num_tokens = 8},
                                           {.src = 0, .dst = 5, .num_tokens = 8}})
              .ok());
  // Device blocks now: 8 <- old 3, 3 <- old 8, 5 <- old 2; the rest unchanged.
  std::vector<int32_t> from(10);
  for (int32_t b = 0; b < 10; ++b) from[b] = b;
  from[8] = 3;
  from[3] = 8;
  from[5] = 2;
  const std::vector<uint8_t> now = snapshot(s, false);
  const int64_t block = kSpec.bytes_per_block() / 3 / 2;  // one pool's block
  int64_t wrong = 0;
  for (size_t b = 0; b < now.size(); ++b) {
    const int64_t pool = static_cast<int64_t>(b) / (10 * block);
    const int64_t id = static_cast<int64_t>(b) / block % 10;
    const int64_t in_block = static_cast<int64_t>(b) % block;
    if (now[b] != device_bytes[(pool * 10 + from[id]) * block + in_block]) ++wrong;
  }
  CHECK(wrong == 0);
}

BACKEND_TEST_CASE("exchange swaps device and host blocks, and twice restores both",
                  "[kv_storage]") {
  for (KvLayout layout : {KvLayout::kHND, KvLayout::kNHD}) {
    KvStorage s = make(device, layout);
    fill_random(s, 23);
    const std::vector<uint8_t> device_bytes = snapshot(s, false), host = snapshot(s, true);
    const std::vector<BlockCopy> ops = {{.src = 4, .dst = 2, .num_tokens = 8},
                                        {.src = 9, .dst = 0, .num_tokens = 8}};
    REQUIRE(s.exchange(ops).ok());
    const int64_t elem = bytes_per_element(kSpec.dtype);
    for (int32_t layer = 0; layer < 3; ++layer) {
      const KvCacheView d = s.view(layer), h = s.host_view(layer);
      const int64_t device_pool = pool_elements(d) * elem, host_pool = pool_elements(h) * elem;
      for (bool is_v : {false, true}) {
        const int64_t pool = 2 * layer + (is_v ? 1 : 0);
        for (const BlockCopy& op : ops) {
          for (int32_t head = 0; head < 2; ++head) {
            for (int32_t t = 0; t < 8; ++t) {
              const int64_t at_d = pool * device_pool + elem_offset(d, op.src, head, t, 0) * elem;
              const int64_t at_h = pool * host_pool + elem_offset(h, op.dst, head, t, 0) * elem;
              const int64_t row_bytes = d.head_dim * elem;
              REQUIRE(row(device, d, is_v, op.src, head, t) ==
                      std::vector<uint8_t>(host.begin() + at_h, host.begin() + at_h + row_bytes));
              REQUIRE(row(device, h, is_v, op.dst, head, t) ==
                      std::vector<uint8_t>(device_bytes.begin() + at_d,
                                           device_bytes.begin() + at_d + row_bytes));
            }
          }
        }
      }
    }
    REQUIRE(s.exchange(ops).ok());
    CHECK(snapshot(s, false) == device_bytes);
    CHECK(snapshot(s, true) == host);
  }
}

BACKEND_TEST_CASE("invalid demote and promote batches are refused whole", "[kv_storage]") {
  KvStorage s = make(device, KvLayout::kNHD);
  fill_random(s, 17);
  const std::vector<uint8_t> main = snapshot(s, false), host = snapshot(s, true);
  auto expect = [&](const absl::Status& st, const std::string& fragment) {
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(st.message().find(fragment) != std::string::npos);
    CHECK(snapshot(s, false) == main);
    CHECK(snapshot(s, true) == host);
  };
  // Each batch starts with a valid op, which must not run either.
  const std::vector<BlockCopy> partial = {{1, 0, 8}, {2, 1, 5}};
  expect(s.demote(partial),
         "demote: op 1: num_tokens 5 is not a whole block (8); only full cached blocks");
  expect(s.promote(std::vector<BlockCopy>{{0, 1, 8}, {1, 2, 0}}),
         "promote: op 1: num_tokens 0 is not a whole block (8)");
  expect(s.demote(std::vector<BlockCopy>{{1, 0, 8}, {2, 6, 8}}),
         "demote: op 1: dst block 6 outside [0, 6) of the host pool");
  expect(s.demote(std::vector<BlockCopy>{{1, 0, 8}, {10, 2, 8}}),
         "demote: op 1: src block 10 outside [0, 10) of the device pool");
  expect(s.promote(std::vector<BlockCopy>{{0, 1, 8}, {6, 2, 8}}),
         "promote: op 1: src block 6 outside [0, 6) of the host pool");
  expect(s.promote(std::vector<BlockCopy>{{0, 1, 8}, {-1, 2, 8}}),
         "promote: op 1: src block -1 outside [0, 6)");
  expect(s.promote(std::vector<BlockCopy>{{0, 1, 8}, {2, 10, 8}}),
         "promote: op 1: dst block 10 outside [0, 10) of the device pool");
  expect(s.demote(std::vector<BlockCopy>{{1, 3, 8}, {2, 3, 8}}),
         "demote: op 1: dst block 3 is written twice in one batch");
  expect(s.promote(std::vector<BlockCopy>{{1, 3, 8}, {2, 3, 8}}),
         "promote: op 1: dst block 3 is written twice in one batch");
  expect(s.exchange(std::vector<BlockCopy>{{1, 3, 8}, {1, 4, 8}}),
         "exchange: op 1: src block 1 is written twice in one batch");
  expect(s.exchange(std::vector<BlockCopy>{{1, 3, 8}, {2, 4, 7}}),
         "exchange: op 1: num_tokens 7 is not a whole block (8)");
  expect(s.exchange(std::vector<BlockCopy>{{1, 3, 8}, {2, 6, 8}}),
         "exchange: op 1: dst block 6 outside [0, 6) of the host pool");
  // Without a host pool there is no tier to copy into.
  KvStorage none = make(device, KvLayout::kHND, 4, 0);
  CHECK(none.demote(std::vector<BlockCopy>{{0, 0, 8}}).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(none.demote({}).ok());  // an empty batch is fine
}

}  // namespace
}  // namespace pagedkv
