// KvCacheConfigs of hybrid models with state layers, shared by the allocator's and the
// planner's tests.
#ifndef PAGEDKV_TESTS_SUPPORT_STATE_MODELS_H_
#define PAGEDKV_TESTS_SUPPORT_STATE_MODELS_H_

#include "pagedkv/kv_cache_config.h"

namespace pagedkv::testing {

// Nemotron-H-8B: 24 Mamba2 layers and 4 full-attention layers of 8 KV heads x 128, bf16.
// Mamba2 state per layer (vLLM's mamba_utils.py): intermediate 128 heads x 64 = 8,192,
// conv_dim 8,192 + 2 x 8 groups x 128 = 10,240, conv 3 x 10,240 = 30,720 bf16 elements
// (61,440 bytes); recurrent 128 x 64 x 128 = 1,048,576 fp32 elements (4,194,304 bytes):
// 4,255,744 bytes per layer, a slot 24 x 4,255,744 = 102,137,856 bytes. A full layer's
// token: 2 x 8 x 128 x 2 = 4,096 bytes.
inline const KvCacheConfig kNemotronH{
    .groups = {{.kind = AttentionKind::kState,
                .state = {.num_layers = 24,
                          .conv_elements = 30720,
                          .recurrent_elements = 1048576,
                          .conv_dtype = DType::kBFloat16,
                          .recurrent_dtype = DType::kFloat32}},
               {.kind = AttentionKind::kFull,
                .shape = {.num_layers = 4, .num_kv_heads = 8, .head_dim = 128}}},
    .dtype = DType::kBFloat16,
    .block_size = 16};

}  // namespace pagedkv::testing

#endif  // PAGEDKV_TESTS_SUPPORT_STATE_MODELS_H_
