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
