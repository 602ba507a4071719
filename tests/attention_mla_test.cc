// Paged MLA decode (paged_mla_decode in pagedkv/attention.h) on each backend
// (support/backends.h) against the fp64 dense computation: scores over the whole latent
// (kv_lora_rank + rope dims), outputs the probability-weighted first kv_lora_rank
// elements; CUDA's outputs against the CPU run too. Block ids are a random permutation of
// a pool twice the needed size; unused slots, blocks and padding entries hold NaN.
// The CPU reference takes any latent dims and q dtype; CUDA 512 + 64 with fp16 or bf16 q,
// and refuses the rest (checked here with the same cases).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention.h"
#include "support/backends.h"

namespace pagedkv {
namespace {

using testing::BackendMemory;
using testing::check_mla;
using testing::MlaCase;
using testing::MlaFixture;
using testing::Run;

// True when `device` runs MLA of the dims and q dtype of `c`.
bool runs_mla(Device device, const MlaCase& c) {
  return device == Device::kCpu ||
         (c.kv_lora_rank == 512 && c.rope_dim == 64 && c.q_dtype != DType::kFloat32);
}

// check_mla() where `device` runs `c`; elsewhere (CUDA, other dims or fp32 q) the refusal,
// naming what CUDA takes.
void check_mla_or_refusal(Device device, const MlaCase& c, const std::vector<int32_t>& splits) {
  if (runs_mla(device, c)) {
    check_mla(device, c, splits);
    return;
  }
  MlaFixture f = testing::make_mla_fixture(c);
  Run unused;
  const absl::Status s = testing::try_mla(device, f, 1, &unused);
  INFO(c.name() << ": " << s.ToString());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find(c.q_dtype == DType::kFloat32 && c.kv_lora_rank == 512 && c.rope_dim == 64
                             ? "CUDA needs q/out in fp16 or bf16"
                             : "CUDA supports kv_lora_rank 512 + qk_rope_head_dim 64") !=
        std::string::npos);
}

BACKEND_TEST_CASE("MLA decode (DeepSeek 512 + 64) equals the dense latent attention",
                  "[attention]") {
  // CUDA: fp16 q too, and every head count tensor parallelism leaves of 128 and padded ones
  // (8, 40, 96), each a CTA shape; the CPU: 16 and 128 heads, and fp32 q (the CPU's alone).
  const std::vector<std::pair<DType, DType>> dtypes =
      device == Device::kCuda
          ? std::vector<std::pair<DType, DType>>{{DType::kBFloat16, DType::kBFloat16},
                                                 {DType::kBFloat16, DType::kFloat8E4M3},
                                                 {DType::kFloat16, DType::kFloat16},
                                                 {DType::kFloat16, DType::kFloat8E4M3}}
          : std::vector<std::pair<DType, DType>>{{DType::kBFloat16, DType::kBFloat16},
                                                 {DType::kBFloat16, DType::kFloat8E4M3},
                                                 {DType::kFloat32, DType::kFloat32}};
  const std::vector<int32_t> heads = device == Device::kCuda
                                         ? std::vector<int32_t>{16, 32, 64, 128, 8, 40, 96}
                                         : std::vector<int32_t>{16, 128};
  uint64_t seed = 1;
  for (auto [q_dtype, kv_dtype] : dtypes) {
    for (int32_t h : heads) {
      for (int32_t bs : {16, 64}) {
        check_mla(device,
                  {.num_heads = h,
                   .block_size = bs,
                   .q_dtype = q_dtype,
                   .kv_dtype = kv_dtype,
                   .lens = {1, bs - 1, bs, bs + 1, 31, 33, 500, 0},
                   .seed = seed++},
                  {1, 5, 0});
      }
    }
  }
}

BACKEND_TEST_CASE("MLA decode takes any latent dims, head count and block size on the CPU",
                  "[attention]") {
  // The decode loop's tiny MLA model and odd shapes: dims not multiples of 8, no rope, one
  // head, head counts tensor parallelism leaves; and fp32 q at 512 + 64. CUDA refuses
  // each of them.
  const int32_t dims[][2] = {{32, 16}, {64, 8}, {13, 3}, {24, 0}};
  uint64_t seed = 100;
  for (const auto& d : dims) {
    for (int32_t heads : {1, 3, 16, 32, 64}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        check_mla_or_refusal(device,
                             {.kv_lora_rank = d[0],
                              .rope_dim = d[1],
                              .num_heads = heads,
                              .block_size = 16,
                              .q_dtype = dtype,
                              .kv_dtype = dtype,
                              .lens = {1, 15, 16, 17, 200, 0, 33},
                              .seed = seed++},
                             {1, 3, 16});
      }
    }
  }
  check_mla_or_refusal(device,
                       {.num_heads = 16,
                        .q_dtype = DType::kFloat32,
                        .kv_dtype = DType::kFloat32,
                        .lens = {20},
                        .seed = seed++},
                       {1});
}

BACKEND_TEST_CASE("MLA decode over long and skewed contexts with split-K", "[attention]") {
  check_mla(device,
            {.num_heads = 32,
             .block_size = 64,
             .q_dtype = DType::kBFloat16,
             .kv_dtype = DType::kFloat8E4M3,
             .lens = {2048, 1, 700, 64},
             .seed = 200},
            {1, 7, 0});
  // CUDA's automatic plan splits a 16K context among short ones; the CPU never splits, and
  // 2K gives it the same batch shape.
  check_mla(device,
            {.num_heads = 128,
             .block_size = 64,
             .q_dtype = DType::kBFloat16,
             .kv_dtype = DType::kFloat8E4M3,
             .lens = device == Device::kCuda ? std::vector<int32_t>{1, 16384, 3, 8000}
                                             : std::vector<int32_t>{1, 2048, 3, 1000},
             .seed = 1500},
            {0, 1});
  // Every forced split count of a 1024-token sequence, and one leaving most splits empty.
  std::vector<int32_t> splits;
  for (int32_t s = 1; s <= 20; ++s) splits.push_back(s);
  splits.push_back(200);
  check_mla(device,
            {.num_heads = 16,
             .block_size = 16,
             .q_dtype = DType::kBFloat16,
             .kv_dtype = DType::kBFloat16,
             .lens = {1024, 1, 700, 0},
             .seed = 1501},
            splits);
}

BACKEND_TEST_CASE("write_kv with v null writes an MLA cache's latents, which MLA decode reads",
                  "[attention]") {
  // Latents written through write_kv (K only, the V pool null) give the same output as the
  // fixture's directly stored ones; in small fp32 dims (the CPU) and DeepSeek's bf16 ones.
  const MlaCase cases[] = {{.kv_lora_rank = 32,
                            .rope_dim = 16,
                            .num_heads = 4,
                            .block_size = 16,
                            .q_dtype = DType::kFloat32,
                            .kv_dtype = DType::kFloat32,
                            .lens = {20, 3},
                            .seed = 300},
                           {.num_heads = 16,
                            .block_size = 16,
                            .q_dtype = DType::kBFloat16,
                            .kv_dtype = DType::kBFloat16,
                            .lens = {20, 3},
                            .seed = 301}};
  for (const MlaCase& c : cases) {
    if (!runs_mla(device, c)) continue;
    INFO(c.name());
    MlaFixture f = testing::make_mla_fixture(c);
    const Run expected = testing::run_mla(device, f, 1);
    std::vector<float> latents;
    std::vector<int64_t> slots;
    for (int32_t s = 0; s < f.num_seqs(); ++s) {
      for (int32_t t = 0; t < f.lens[s]; ++t) {
        for (int32_t d = 0; d < c.dim(); ++d) {
          latents.push_back(static_cast<float>(f.latent(s, t, d)));
        }
        slots.push_back(f.index(s, t, 0) / c.dim());  // block * block_size + offset
      }
    }
    std::fill(f.pool.begin(), f.pool.end(), 0);
    {
      BackendMemory mem(device);
      KvCacheView view = f.view();
      view.k = mem.place(f.pool);
      const absl::Status status = write_kv(device, view,
                                           {.k = mem.place(latents),
                                            .v = nullptr,
                                            .src_dtype = DType::kFloat32,
                                            .slot_mapping = mem.place(slots),
                                            .num_tokens = static_cast<int32_t>(slots.size())});
      INFO(status.ToString());
      REQUIRE(status.ok());
      f.pool = mem.read(static_cast<const uint8_t*>(view.k), f.pool.size());
    }
    const Run written = testing::run_mla(device, f, 1);
    CHECK(written.out == expected.out);
    CHECK(written.lse == expected.lse);
  }
}

BACKEND_TEST_CASE("MLA decode refuses bad arguments with the value and the limit", "[attention]") {
  MlaFixture f =
      testing::make_mla_fixture({.num_heads = 4, .block_size = 16, .lens = {20, 3}, .seed = 7});
  BackendMemory mem(device);
  const auto [cache, table] = testing::place_cache(mem, f);
  MlaDecodeArgs args = testing::mla_args(f);
  args.q = mem.place(f.q);
  args.out = mem.filled<uint8_t>(size_t{2} * 4 * 512 * 2, 0);
  args.sm_scale = 0.1f;
  REQUIRE(paged_mla_decode(device, cache, table, args).ok());
  auto expect = [&](const absl::Status& s, const std::string& fragment) {
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(fragment) != std::string::npos);
  };
  MlaDecodeArgs bad = args;
  bad.qk_rope_head_dim = 8;
  expect(paged_mla_decode(device, cache, table, bad),
         "kv_lora_rank 512 + qk_rope_head_dim 8 must equal the cache head_dim 576");
  bad = args;
  bad.sm_scale = 0.0f;
  expect(paged_mla_decode(device, cache, table, bad), "sm_scale 0 must be finite and > 0");
  bad = args;
  bad.num_heads = 0;
  expect(paged_mla_decode(device, cache, table, bad), "num_heads is 0");
  bad = args;
  bad.dtype = DType::kFloat16;
  expect(paged_mla_decode(device, cache, table, bad),
         "cache dtype bf16 must be the q dtype (fp16) or fp8_e4m3");
  const KvCacheView two_heads =
      make_kv_cache_view(cache.k, nullptr, DType::kBFloat16, f.num_blocks / 2, 2, 16, 576);
  expect(paged_mla_decode(device, two_heads, table, args),
         "cache num_kv_heads is 2; an MLA cache holds one latent per token (1)");
  if (device == Device::kCuda) return;  // the table is the caller's contract there
  std::vector<int32_t> bad_table = f.table;
  bad_table[1] = -1;  // sequence 0 (20 tokens) reads entries 0 and 1
  BlockTableView tv = table;
  tv.block_table = bad_table.data();
  expect(paged_mla_decode(device, cache, tv, args), "sequence 0: block table entry 1 is -1");
}

BACKEND_TEST_CASE("MLA variants on small shapes (the compute-sanitizer set)",
                  "[attention][sanitize]") {
  // Every MLA kernel variant (16, 32, 64 heads per CTA; each dtype pair) split and not.
  uint64_t seed = 1700;
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kBFloat16, DType::kFloat8E4M3},
                                   std::pair{DType::kFloat16, DType::kFloat16},
                                   std::pair{DType::kFloat16, DType::kFloat8E4M3}}) {
    for (int32_t heads : {16, 32, 128}) {
      check_mla(device,
                {.num_heads = heads,
                 .block_size = 16,
                 .q_dtype = q_dtype,
                 .kv_dtype = kv_dtype,
                 .lens = {70, 0, 9},
                 .seed = seed++},
                {1, 3});
    }
  }
}

}  // namespace
}  // namespace pagedkv
