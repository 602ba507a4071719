// KvCacheSpec: validation and sizing from a byte budget.
#include "pagedkv/kv_cache_spec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace pagedkv {
namespace {

bool is_known_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3:
      return true;
  }
  return false;
}

}  // namespace

absl::Status KvCacheSpec::validate() const {
  if (num_layers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheSpec: num_layers is ", num_layers, ", must be at least 1"));
  }
  if (num_kv_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheSpec: num_kv_heads is ", num_kv_heads, ", must be at least 1"));
  }
  if (head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheSpec: head_dim is ", head_dim, ", must be at least 1"));
  }
  if (!is_known_dtype(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheSpec: dtype value ", static_cast<int>(dtype), " is not a DType"));
  }
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheSpec: block_size is ", block_size, ", must be at least 1"));
  }
  // A latent vector is shared by all query heads (MLA); more than one would be a
  // different model, not a latent cache.
  if (latent && num_kv_heads != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCacheSpec: a latent (MLA) spec has num_kv_heads ", num_kv_heads, ", must be 1"));
  }
  // bytes_per_block() must fit int64 with room to spare: each factor is below 2^31, so
  // bound the product before anyone multiplies it by a block count.
  const double block_bytes = static_cast<double>(vectors_per_token()) * num_layers * num_kv_heads *
                             head_dim * bytes_per_element(dtype) * static_cast<double>(block_size);
  if (block_bytes > static_cast<double>(int64_t{1} << 50)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCacheSpec: one block would take ", block_bytes, " bytes (num_layers ",
                     num_layers, " x num_kv_heads ", num_kv_heads, " x head_dim ", head_dim,
                     " x block_size ", block_size, "), more than the limit of 2^50 bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> KvCacheSpec::num_blocks_for_budget(int64_t budget_bytes) const {
  if (absl::Status status = validate(); !status.ok()) return status;
  if (budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_blocks_for_budget: budget is ",
                                                   budget_bytes, " bytes, must not be negative"));
  }
  const int64_t block_bytes = bytes_per_block();
  const int64_t blocks = budget_bytes / block_bytes;
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_blocks_for_budget: budget of ", budget_bytes, " bytes does not hold one block of ",
        block_bytes, " bytes (", block_size, " tokens x ", bytes_per_token(),
        " bytes per token); raise the budget or lower block_size"));
  }
  // Block ids are int32: a budget beyond that many blocks is capped, not an error.
  return static_cast<int32_t>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max()));
}

}  // namespace pagedkv
