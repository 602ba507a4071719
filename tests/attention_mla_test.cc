// CPU paged MLA decode (paged_mla_decode in pagedkv/attention.h) against the fp64 dense
// computation: scores over the whole latent (kv_lora_rank + rope dims), outputs the
// probability-weighted first kv_lora_rank elements. Block ids are a random permutation of
// a pool twice the needed size; unused slots, blocks and padding entries hold NaN.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "pagedkv/attention.h"

namespace pagedkv {
namespace {

using testing::MlaCase;
using testing::MlaFixture;
using testing::Outputs;
using testing::Run;

Run run_mla_cpu(MlaFixture& f, int32_t num_splits) {
  const MlaCase& c = f.c;
  std::vector<uint8_t> out(
      int64_t{f.num_seqs()} * c.num_heads * c.kv_lora_rank * bytes_per_element(c.q_dtype), 0xff);
  std::vector<float> lse(int64_t{f.num_seqs()} * c.num_heads, 12345.0f);
  const absl::Status status = paged_mla_decode(Device::kCpu, f.view(), f.table_view(),
                                               {.q = f.q.data(),
                                                .out = out.data(),
                                                .maybe_lse = lse.data(),
                                                .dtype = c.q_dtype,
                                                .num_heads = c.num_heads,
                                                .kv_lora_rank = c.kv_lora_rank,
                                                .qk_rope_head_dim = c.rope_dim,
                                                .sm_scale = f.sm_scale,
                                                .maybe_kv_scale = f.kv_scale_ptr()},
                                               {.num_splits = num_splits});
  INFO(status.ToString());
  REQUIRE(status.ok());
  return {testing::to_doubles(out, c.q_dtype), lse};
}

void check_mla(const MlaCase& c, std::initializer_list<int32_t> splits) {
  MlaFixture f = testing::make_mla_fixture(c);
  const Outputs ref = testing::mla_reference(f);
  const double tol = testing::mla_tolerance(f, ref);
  for (int32_t s : splits) {
    INFO("num_splits " << s);
    testing::check_mla_run(f, run_mla_cpu(f, s), ref, tol);
  }
}

TEST_CASE("MLA decode (DeepSeek 512 + 64) equals the dense latent attention", "[attention]") {
  uint64_t seed = 1;
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kBFloat16, DType::kBFloat16},
                                   std::pair{DType::kBFloat16, DType::kFloat8E4M3},
                                   std::pair{DType::kFloat32, DType::kFloat32}}) {
    for (int32_t heads : {16, 128}) {
      for (int32_t bs : {16, 64}) {
        check_mla({.num_heads = heads,
                   .block_size = bs,
                   .q_dtype = q_dtype,
                   .kv_dtype = kv_dtype,
                   .lens = {1, bs - 1, bs, bs + 1, 300, 0},
                   .seed = seed++},
                  {1, 4});
      }
    }
  }
}

TEST_CASE("MLA decode is generic in the latent dims, head counts and block sizes", "[attention]") {
  // The decode loop's tiny MLA model and odd shapes: dims not multiples of 8, no rope,
  // one head, head counts tensor parallelism leaves.
  const int32_t dims[][2] = {{32, 16}, {64, 8}, {13, 3}, {24, 0}};
  uint64_t seed = 100;
  for (const auto& d : dims) {
    for (int32_t heads : {1, 3, 16, 32, 64}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
        check_mla({.kv_lora_rank = d[0],
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
}

TEST_CASE("MLA decode over long and skewed contexts with split-K", "[attention]") {
  check_mla({.num_heads = 32,
             .block_size = 64,
             .q_dtype = DType::kBFloat16,
             .kv_dtype = DType::kFloat8E4M3,
             .lens = {2048, 1, 700, 64},
             .seed = 200},
            {1, 7, 0});
}

TEST_CASE("write_kv with v null writes an MLA cache's latents, which MLA decode reads",
          "[attention]") {
  // Latents written through write_kv (K only, the V pool null) give the same output as the
  // fixture's directly stored ones.
  MlaFixture f = testing::make_mla_fixture({.kv_lora_rank = 32,
                                            .rope_dim = 16,
                                            .num_heads = 4,
                                            .block_size = 16,
                                            .q_dtype = DType::kFloat32,
                                            .kv_dtype = DType::kFloat32,
                                            .lens = {20, 3},
                                            .seed = 300});
  const Run expected = run_mla_cpu(f, 1);
  std::vector<float> latents;
  std::vector<int64_t> slots;
  for (int32_t s = 0; s < f.num_seqs(); ++s) {
    for (int32_t t = 0; t < f.lens[s]; ++t) {
      for (int32_t d = 0; d < 48; ++d) latents.push_back(static_cast<float>(f.latent(s, t, d)));
      slots.push_back(f.index(s, t, 0) / 48);  // block * block_size + offset
    }
  }
  std::fill(f.pool.begin(), f.pool.end(), 0);
  REQUIRE(write_kv(Device::kCpu, f.view(),
                   {.k = latents.data(),
                    .v = nullptr,
                    .src_dtype = DType::kFloat32,
                    .slot_mapping = slots.data(),
                    .num_tokens = static_cast<int32_t>(slots.size())})
              .ok());
  const Run written = run_mla_cpu(f, 1);
  CHECK(written.out == expected.out);
  CHECK(written.lse == expected.lse);
}

TEST_CASE("MLA decode refuses bad arguments with the value and the limit", "[attention]") {
  MlaFixture f = testing::make_mla_fixture(
      {.kv_lora_rank = 32, .rope_dim = 16, .num_heads = 4, .block_size = 16, .lens = {20, 3}});
  std::vector<uint8_t> out(2 * 4 * 32 * 2);
  const MlaDecodeArgs args{.q = f.q.data(),
                           .out = out.data(),
                           .dtype = DType::kBFloat16,
                           .num_heads = 4,
                           .kv_lora_rank = 32,
                           .qk_rope_head_dim = 16,
                           .sm_scale = 0.1f};
  REQUIRE(paged_mla_decode(Device::kCpu, f.view(), f.table_view(), args).ok());
  auto expect = [&](const absl::Status& s, const std::string& fragment) {
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(fragment) != std::string::npos);
  };
  MlaDecodeArgs bad = args;
  bad.qk_rope_head_dim = 8;
  expect(paged_mla_decode(Device::kCpu, f.view(), f.table_view(), bad),
         "kv_lora_rank 32 + qk_rope_head_dim 8 must equal the cache head_dim 48");
  bad = args;
  bad.sm_scale = 0.0f;
  expect(paged_mla_decode(Device::kCpu, f.view(), f.table_view(), bad),
         "sm_scale 0 must be finite and > 0");
  bad = args;
  bad.num_heads = 0;
  expect(paged_mla_decode(Device::kCpu, f.view(), f.table_view(), bad), "num_heads is 0");
  bad = args;
  bad.dtype = DType::kFloat16;
  expect(paged_mla_decode(Device::kCpu, f.view(), f.table_view(), bad),
         "cache dtype bf16 must be the q dtype (fp16) or fp8_e4m3");
  KvCacheView two_heads =
      make_kv_cache_view(f.pool.data(), nullptr, DType::kBFloat16, f.num_blocks / 2, 2, 16, 48);
  expect(paged_mla_decode(Device::kCpu, two_heads, f.table_view(), args),
         "cache num_kv_heads is 2; an MLA cache holds one latent per token (1)");
  std::vector<int32_t> table = f.table;
  table[1] = -1;  // sequence 0 (20 tokens) reads entries 0 and 1
  BlockTableView tv = f.table_view();
  tv.block_table = table.data();
  expect(paged_mla_decode(Device::kCpu, f.view(), tv, args),
         "sequence 0: block table entry 1 is -1");
}

}  // namespace
}  // namespace pagedkv
