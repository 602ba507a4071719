// KvCacheSpec (pagedkv/kv_cache_spec.h): bytes per token and blocks for a byte budget.
#include "pagedkv/kv_cache_spec.h"

#include <catch2/catch.hpp>
#include <string>

namespace pagedkv {
namespace {

constexpr KvCacheSpec kLlama31_8B{.num_layers = 32,
                                  .num_kv_heads = 8,
                                  .head_dim = 128,
                                  .dtype = DType::kBFloat16,
                                  .block_size = 16};

void expect_invalid(const absl::Status& s, const std::string& fragment) {
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find(fragment) != std::string::npos);
}

TEST_CASE("Llama-3.1-8B in bf16 takes 131072 bytes per token", "[kv_cache_spec]") {
  CHECK(kLlama31_8B.validate().ok());
  CHECK(kLlama31_8B.bytes_per_token() == 131072);
  CHECK(kLlama31_8B.bytes_per_block() == 131072 * 16);
  KvCacheSpec fp8 = kLlama31_8B;
  fp8.dtype = DType::kFloat8E4M3;
  CHECK(fp8.bytes_per_token() == 65536);
}

// DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 61 layers of MLA, kv_lora_rank 512 +
// qk_rope_head_dim 64 = one latent vector of 576 elements per token per layer.
constexpr KvCacheSpec kDeepSeekV3{.num_layers = 61,
                                  .num_kv_heads = 1,
                                  .head_dim = 512 + 64,
                                  .dtype = DType::kBFloat16,
                                  .block_size = 16,
                                  .latent = true};

TEST_CASE("an MLA latent spec caches one vector per token per layer", "[kv_cache_spec]") {
  REQUIRE(kDeepSeekV3.validate().ok());
  // 61 layers x 576 elements x 2 bytes = 70,272 bytes per token; no factor 2 for K and V.
  CHECK(kDeepSeekV3.vectors_per_token() == 1);
  CHECK(kDeepSeekV3.bytes_per_token() == 70272);
  CHECK(kDeepSeekV3.bytes_per_block() == 70272 * 16);
  // 8 GiB / (70,272 x 16 bytes) = 8,589,934,592 / 1,124,352 = 7,639.9 -> 7,639 blocks.
  CHECK(*kDeepSeekV3.num_blocks_for_budget(int64_t{8} << 30) == 7639);
  KvCacheSpec fp8 = kDeepSeekV3;
  fp8.dtype = DType::kFloat8E4M3;
  CHECK(fp8.bytes_per_token() == 35136);
  // The same shape as K and V heads takes twice the bytes.
  KvCacheSpec kv = kDeepSeekV3;
  kv.latent = false;
  CHECK(kv.vectors_per_token() == 2);
  CHECK(kv.bytes_per_token() == 2 * 70272);
}

TEST_CASE("a latent spec needs exactly one KV head", "[kv_cache_spec]") {
  KvCacheSpec s = kDeepSeekV3;
  s.num_kv_heads = 128;
  expect_invalid(s.validate(), "a latent (MLA) spec has num_kv_heads 128, must be 1");
  expect_invalid(s.num_blocks_for_budget(1 << 30).status(), "num_kv_heads 128, must be 1");
}

TEST_CASE("a budget holds whole blocks only", "[kv_cache_spec]") {
  CHECK(*kLlama31_8B.num_blocks_for_budget(int64_t{8} << 30) == 4096);
  CHECK(*kLlama31_8B.num_blocks_for_budget(int64_t{8} << 30 | 12345) == 4096);
  CHECK(*kLlama31_8B.num_blocks_for_budget(2097152) == 1);
  CHECK(*kLlama31_8B.num_blocks_for_budget(2097152 * 3 - 1) == 2);
  // Far beyond int32 block ids: capped, not wrapped.
  KvCacheSpec tiny{.num_layers = 1,
                   .num_kv_heads = 1,
                   .head_dim = 1,
                   .dtype = DType::kFloat8E4M3,
                   .block_size = 1};
  CHECK(*tiny.num_blocks_for_budget(int64_t{1} << 40) == 2147483647);
}

TEST_CASE("a budget below one block is refused with both sizes", "[kv_cache_spec]") {
  expect_invalid(kLlama31_8B.num_blocks_for_budget(2097151).status(),
                 "budget of 2097151 bytes does not hold one block of 2097152 bytes");
  expect_invalid(kLlama31_8B.num_blocks_for_budget(-1).status(), "budget is -1 bytes");
}

TEST_CASE("validate names the first field that is not positive", "[kv_cache_spec]") {
  KvCacheSpec s = kLlama31_8B;
  s.num_layers = 0;
  expect_invalid(s.validate(), "num_layers is 0");
  s = kLlama31_8B;
  s.num_kv_heads = -2;
  expect_invalid(s.validate(), "num_kv_heads is -2");
  s = kLlama31_8B;
  s.head_dim = 0;
  expect_invalid(s.validate(), "head_dim is 0");
  s = kLlama31_8B;
  s.block_size = 0;
  expect_invalid(s.validate(), "block_size is 0");
  expect_invalid(s.num_blocks_for_budget(1 << 30).status(), "block_size is 0");
  s = kLlama31_8B;
  s.num_layers = 1 << 20;
  s.block_size = 1 << 20;
  expect_invalid(s.validate(), "more than the limit of 2^50 bytes");
}

}  // namespace
}  // namespace pagedkv
