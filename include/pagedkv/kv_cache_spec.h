// File: pagedkv/kv_cache_spec.h
//
// KvCacheSpec describes the shape of a model's KV cache and sizes a pool from a byte
// budget. It is the one place where "blocks" and "bytes" meet.
//
// Example:
//   KvCacheSpec spec{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128,
//                    .dtype = DType::kBFloat16, .block_size = 16};
//   spec.bytes_per_token();                      // 131072 (Llama-3.1-8B)
//   absl::StatusOr<int32_t> n = spec.num_blocks_for_budget(int64_t{8} << 30);  // 4096
//
// MLA (DeepSeek-V2/V3) caches one latent vector per token per layer from which both K and
// V are computed: a latent spec with num_kv_heads 1 and head_dim kv_lora_rank +
// qk_rope_head_dim.
//   KvCacheSpec mla{.num_layers = 61, .num_kv_heads = 1, .head_dim = 512 + 64,
//                   .dtype = DType::kBFloat16, .block_size = 16, .latent = true};
//   mla.bytes_per_token();                       // 70272 (DeepSeek-V3)
#ifndef PAGEDKV_KV_CACHE_SPEC_H_
#define PAGEDKV_KV_CACHE_SPEC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/dtype.h"

namespace pagedkv {

struct KvCacheSpec {
  int32_t num_layers = 1;
  int32_t num_kv_heads = 1;
  int32_t head_dim = 128;
  DType dtype = DType::kBFloat16;
  int32_t block_size = 16;  // tokens per block
  // One vector of head_dim elements per token per layer serves as both K and V (MLA's
  // latent cache); needs num_kv_heads == 1. False: separate K and V vectors per KV head.
  bool latent = false;

  // Vectors cached per token, KV head and layer: 2 (K and V), or 1 for a latent spec.
  int64_t vectors_per_token() const { return latent ? 1 : 2; }

  // Bytes of K and V of one token across all layers:
  // (latent ? 1 : 2) x num_layers x num_kv_heads x head_dim x bytes_per_element(dtype).
  int64_t bytes_per_token() const {
    return vectors_per_token() * num_layers * num_kv_heads * head_dim * bytes_per_element(dtype);
  }

  // Bytes of one block (block_size tokens) across all layers.
  int64_t bytes_per_block() const { return bytes_per_token() * block_size; }

  // Returns InvalidArgument naming the first field that is not positive, or a latent spec
  // with num_kv_heads other than 1.
  [[nodiscard]] absl::Status validate() const;

  // Number of whole blocks that `budget_bytes` holds.
  // Errors: InvalidArgument for an invalid spec or a negative budget, or a budget that does
  // not hold a single block (the message names the budget and the block size in bytes).
  [[nodiscard]] absl::StatusOr<int32_t> num_blocks_for_budget(int64_t budget_bytes) const;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_CACHE_SPEC_H_
