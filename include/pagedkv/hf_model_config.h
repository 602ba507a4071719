// File: pagedkv/hf_model_config.h
//
// Reads a Hugging Face config.json into the KvCacheConfig of the model's KV cache: which
// layers are full attention, sliding window or chunked local, and the KV shape of each,
// the way transformers and vLLM read the same fields. Part of the pagedkv::planner library
// (it needs nlohmann-json; the allocator never links it).
//
// Fields read (of "text_config" when the config has one, as Gemma 3 and Llama 4 do):
//   num_hidden_layers                     layers
//   num_attention_heads, num_key_value_heads (default: num_attention_heads)
//   head_dim (default: hidden_size / num_attention_heads)
//   kv_lora_rank + qk_rope_head_dim       MLA: one latent vector of their sum per token
//   layer_types                           per layer: full_attention, sliding_attention,
//                                         chunked_attention (gpt-oss, newer transformers)
//   sliding_window, sliding_window_pattern (Gemma 3: every pattern-th layer is full),
//   use_sliding_window, max_window_layers (Qwen: layers from max_window_layers on slide)
//   attention_chunk_size, no_rope_layers, no_rope_layer_interval (Llama 4: layers that use
//                                         RoPE are chunked, the NoPE layers are full)
//   torch_dtype or dtype                  the KV dtype unless HfConfigOptions::kv_dtype
//   max_position_embeddings               the model's longest context
// State layers (one kState group, sized as vLLM's MambaStateShapeCalculator at commit
// 2afe1e8573cf51b73569ae1d35f59078a2032a91, vllm/model_executor/layers/mamba/mamba_utils.py):
//   qwen3_next (Gated DeltaNet)           layer_types linear_attention / full_attention, or
//                                         full_attention_interval (default 4: every 4th
//                                         layer full); linear_num_key_heads,
//                                         linear_key_head_dim, linear_num_value_heads,
//                                         linear_value_head_dim, linear_conv_kernel_dim
//   nemotron_h (Mamba2)                   hybrid_override_pattern: M Mamba2, * attention,
//                                         - MLP and E MoE (no KV); mamba_num_heads,
//                                         mamba_head_dim, ssm_state_size, n_groups,
//                                         conv_kernel, attention_head_dim
//   granitemoehybrid (Mamba2)             layer_types mamba / attention; mamba_n_heads,
//                                         mamba_d_head, mamba_d_state, mamba_n_groups,
//                                         mamba_d_conv, mamba_expand x hidden_size
// State dtypes are vLLM's defaults (mamba_cache_dtype and mamba_ssm_cache_dtype "auto"):
// the conv state in the model's dtype; the recurrent state too, except Nemotron-H's, which
// vLLM keeps in the config's mamba_ssm_cache_dtype or float32 (NemotronHForCausalLMConfig);
// HfConfigOptions overrides either, and `notes` says which applied. Mamba1 (Jamba) and
// other state kinds are refused by name.
// Absent fields take the defaults of the model type's transformers config class where the
// planner knows them (gemma3_text: sliding_window_pattern 6, max_position_embeddings
// 131072; llama4_text: no_rope_layer_interval 4), each recorded in `notes`.
//
// Example:
//   absl::StatusOr<HfModelConfig> model = parse_hf_config(R"({
//       "model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 64,
//       "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
//       "layer_types": ["sliding_attention", "full_attention",
//                       "sliding_attention", "full_attention"],
//       "max_position_embeddings": 131072, "torch_dtype": "bfloat16"})");
//   // model->kv: two groups of 2 layers, sliding_window 128 and full, 8 x 64 each;
//   // model->kv.bytes_per_token(0) == 2 x 2 x 8 x 64 x 2 == 4096.
#ifndef PAGEDKV_HF_MODEL_CONFIG_H_
#define PAGEDKV_HF_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_config.h"

namespace pagedkv {

struct HfConfigOptions {
  std::optional<DType> kv_dtype = std::nullopt;  // the KV dtype; empty: the config's torch_dtype
  int32_t block_size = 16;                       // tokens per block of every group
  // State layers' conv state dtype (vLLM's --mamba-cache-dtype); empty: vLLM's default,
  // the model's dtype. Gated DeltaNet keeps its recurrent state in this dtype too.
  std::optional<DType> state_dtype = std::nullopt;
  // Mamba2's recurrent (SSM) state dtype (vLLM's --mamba-ssm-cache-dtype); empty: vLLM's
  // default (see above).
  std::optional<DType> recurrent_dtype = std::nullopt;
};

// A model's KV cache as its config.json describes it.
struct HfModelConfig {
  std::string model_type;  // of the text model: "llama", "gemma3_text", "deepseek_v3"
  // Groups in the order their first layer appears; layers of one kind, window and shape
  // form one group.
  KvCacheConfig kv;
  std::vector<int32_t> layer_group;     // per layer: its group in kv.groups, -1 without KV
                                        // or state (Nemotron-H's MLP and MoE layers)
  int64_t max_position_embeddings = 0;  // 0: the config names none
  std::vector<std::string> notes;       // defaults applied and fields read in a given way
};

// Parses the text of a config.json.
// Errors: InvalidArgument naming the field and its value: malformed JSON, a missing or
// non-positive count, a layer kind the planner does not size (Mamba1, unknown layer types),
// a field that contradicts another (layer_types against no_rope_layers, a sliding layer
// without sliding_window), an unknown dtype.
[[nodiscard]] absl::StatusOr<HfModelConfig> parse_hf_config(std::string_view json_text,
                                                            const HfConfigOptions& options = {});

// Reads and parses the config.json at `path`. Errors: NotFound (cannot open), as above.
[[nodiscard]] absl::StatusOr<HfModelConfig> read_hf_config(const std::string& path,
                                                           const HfConfigOptions& options = {});

// A KV dtype by name: bf16/bfloat16, fp16/float16/half, fp32/float32/float, fp8/fp8_e4m3.
// Errors: InvalidArgument listing the names.
[[nodiscard]] absl::StatusOr<DType> parse_kv_dtype(std::string_view name);

// The short name parse_kv_dtype() reads back: "bf16", "fp16", "fp32", "fp8".
const char* kv_dtype_name(DType dtype);

}  // namespace pagedkv

#endif  // PAGEDKV_HF_MODEL_CONFIG_H_
