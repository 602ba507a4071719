// File: pagedkv/capacity_plan.h
//
// The capacity planner: for a model's KV cache (KvCacheConfig, usually read from a Hugging
// Face config.json by hf_model_config.h) and a byte budget, how pagedkv's pools are split
// (one pool per layer group, KvCacheConfig::split_budget()), how many sequences of given
// lengths fit, what one sequence keeps against the analytic minimum, and, beside it, what
// vLLM's grouping of the same layers wastes on padding. Part of the pagedkv::planner
// library; the pagedkv-plan binary (examples/planner) prints it as text or JSON.
//
// vLLM's figure follows vLLM's own rule, vllm/v1/core/kv_cache_utils.py at commit
// 001cabc1be16a59a70d720ed61a13b678c060a18: get_kv_cache_groups() keeps a model whose
// layers all have one spec, or one attention type, in one group; otherwise
// unify_kv_cache_spec_page_size() scales block sizes to one page size and
// _get_kv_cache_groups_uniform_page_size() cuts each attention type's layers into groups of
// group_size layers (the fewest layers of any type, or the most when that is below 1.5x
// the fewest), padding each type up to a multiple of group_size. All groups share one
// pool whose block spans group_size layers (get_kv_cache_config_from_groups()), so a
// block of a group with fewer real layers carries padding. The waste is the padded layers'
// share of the blocks that sequences of the target length take.
//
// Example:
//   absl::StatusOr<HfModelConfig> model = read_hf_config("gemma-3-27b-it/config.json");
//   absl::StatusOr<CapacityPlan> plan = plan_capacity(
//       *model, {.budget_bytes = int64_t{64} << 30, .target_tokens = 32768});
//   // plan->groups[g]: bytes per token, pages, blocks; plan->lengths: sequences that fit;
//   // plan->waste_fraction (pagedkv) beside plan->vllm.waste_fraction.
//   std::string text = format_plan_text(*plan), json = format_plan_json(*plan);
#ifndef PAGEDKV_CAPACITY_PLAN_H_
#define PAGEDKV_CAPACITY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/hf_model_config.h"
#include "pagedkv/kv_cache_config.h"

namespace pagedkv {

struct PlanOptions {
  int64_t budget_bytes = 0;   // KV cache bytes, > 0
  int64_t max_model_len = 0;  // tokens; 0: the config's max_position_embeddings
  // The length the pools are split for (KvCacheConfig::split_budget()); 0: max_model_len.
  int64_t target_tokens = 0;
  // Tokens of prompt content the prefix cache should keep (KvCacheConfig::split_budget()'s
  // cached_tokens); 0: the split counts running sequences only.
  int64_t cached_tokens = 0;
  // Lengths to report; empty: the target and max_model_len. Each is capped at
  // max_model_len.
  std::vector<int64_t> lengths = {};
};

// One group of pagedkv's arrangement.
struct GroupPlan {
  KvCacheGroup group;
  int64_t bytes_per_token = 0;
  int64_t page_bytes = 0;           // block_size tokens of the group's layers
  int64_t blocks_per_sequence = 0;  // set aside per target-length sequence
  int32_t num_blocks = 0;           // the group's pool
  int64_t pool_bytes = 0;
};

// One KV cache group as vLLM forms it.
struct VllmKvCacheGroup {
  int32_t source_group = 0;         // the KvCacheConfig group its layers come from
  int32_t num_layers = 0;           // real layers; group_size - num_layers are padding
  int32_t block_size = 0;           // tokens per block after page-size unification
  int64_t blocks_per_sequence = 0;  // at the target length
};

// vLLM's grouping of the same layers and what its padding costs.
struct VllmGrouping {
  // "uniform_spec" (one spec), "uniform_type" (one attention type, one group),
  // "uniform_page_size" (hybrid: groups padded to group_size layers), or "unsupported"
  // (page sizes that vLLM cannot unify; `reason` says why).
  std::string rule;
  std::string reason;
  int32_t group_size = 0;  // layers per group = tensors sharing the pool
  std::vector<VllmKvCacheGroup> groups;
  int32_t padding_layers = 0;
  int64_t page_bytes = 0;     // one layer's block (0 for uniform_type: layers differ)
  int64_t block_bytes = 0;    // one block of the shared pool, across the layers it spans
  int64_t num_blocks = 0;     // of the shared pool: budget / block_bytes
  int64_t padding_bytes = 0;  // of the target-length sequences that fill the pool
  double waste_fraction = 0;  // padding_bytes / budget
};

// What one sequence of `tokens` tokens costs and how many fit.
struct LengthPlan {
  int64_t tokens = 0;
  int64_t min_bytes = 0;        // KvCacheConfig::min_bytes_per_sequence()
  int64_t held_bytes = 0;       // KvCacheConfig::held_bytes_per_sequence()
  int64_t reserved_bytes = 0;   // KvCacheConfig::reserved_bytes_per_sequence()
  int64_t sequences = 0;        // pagedkv's pools (KvCacheConfig::max_sequences())
  int64_t vllm_sequences = 0;   // vLLM's shared pool
  int64_t ideal_sequences = 0;  // budget / min_bytes: no blocks, no padding, no split
};

struct CapacityPlan {
  std::string model_type;
  KvCacheConfig config;
  int64_t budget_bytes = 0;
  int64_t max_model_len = 0;
  int64_t target_tokens = 0;
  std::vector<GroupPlan> groups;
  PoolSplit split;
  int64_t padding_bytes = 0;  // pagedkv pads no group: always 0
  double waste_fraction = 0;  // (padding + split.lost_bytes) / budget
  VllmGrouping vllm;
  std::vector<LengthPlan> lengths;
  std::vector<std::string> notes;  // the reader's, then the planner's
};

// Plans `config` for a budget. Errors: InvalidArgument for a budget, max_model_len (needed
// when the config names none), target or length below 1, and what
// KvCacheConfig::split_budget() refuses.
[[nodiscard]] absl::StatusOr<CapacityPlan> plan_capacity(const KvCacheConfig& config,
                                                         const PlanOptions& options);
// As above for a config.json's model: max_model_len defaults to its
// max_position_embeddings, and its notes and model_type carry over.
[[nodiscard]] absl::StatusOr<CapacityPlan> plan_capacity(const HfModelConfig& model,
                                                         const PlanOptions& options);

// vLLM's grouping of `config`'s layers (see the top of this file), its shared pool for
// `budget_bytes`, and its padding waste when sequences of `target_tokens` fill it.
VllmGrouping vllm_grouping(const KvCacheConfig& config, int64_t budget_bytes,
                           int64_t target_tokens);
// Sequences of `tokens` tokens that vLLM's shared pool holds: num_blocks over the blocks
// one such sequence takes in all of its groups.
int64_t vllm_max_sequences(const KvCacheConfig& config, const VllmGrouping& vllm, int64_t tokens);

// --- vLLM's attention block size beside state layers -------------------------------------------
//
// vLLM keeps a state layer's slot in the same pool as attention blocks, so one attention
// page must hold at least one layer's state: it grows the attention block size until it
// does, and pads the state page up to it. The rule, from
// vllm/model_executor/models/config.py at commit 1936cf3841edb9781b06c50fc4daf4bac9d3b23e,
// HybridAttentionMambaModelConfig.verify_and_update_config() (later vLLM moved it unchanged
// into Platform._align_hybrid_block_size(), taking the alignment from the attention
// backend's smallest kernel block size):
//   token page  = one attention layer's KV of one token: 2 x kv_heads x head_dim x dtype
//                 bytes (FullAttentionSpec), or 1 x latent dim x dtype bytes for MLA
//                 (MLAAttentionSpec)
//   state page  = one state layer's state (MambaSpec.page_size_bytes): the largest state
//                 group's StateShape::bytes_per_layer()
//   a           = the kernel block alignment: 16, or 64 for MLA (128 with CUTLASS MLA)
//   block size  = a x ceil(state page / (a x token page))
// With prefix caching on the state layers (enable_prefix_caching, mamba_cache_mode "all"),
// the block is instead a multiple of the Mamba2 kernel's chunk, so that checkpoints fall on
// chunk boundaries:
//   c           = lcm(chunk_size, a)      (chunk_size: mamba_chunk_size or chunk_size of the
//                                          config.json; vLLM's default 2048)
//   block size  = c x ceil(ceil(state page / token page) / c)
// Prefix hits in vLLM then land only on multiples of that block size.
struct VllmStateBlockOptions {
  // The kernel block alignment a; 0: vLLM's default, 16, or 64 when the attention group is
  // latent (MLA).
  int32_t kernel_alignment = 0;
  // > 0: the prefix-caching rule with this Mamba2 chunk size; 0: the rule without.
  int32_t prefix_caching_chunk = 0;
};

// vLLM's attention block size, in tokens, for `config`'s attention and state layers. The
// token page is the first attention group's (the models vLLM sizes this way have one
// attention shape).
// Errors: InvalidArgument when the config has no state group with state bytes, or no
// attention group, when an option is negative, or when the block size exceeds 2^31 - 1.
[[nodiscard]] absl::StatusOr<int32_t> vllm_state_block_size(
    const KvCacheConfig& config, const VllmStateBlockOptions& options = {});

// The plan as an aligned text report, and as JSON (the same figures, machine-readable).
std::string format_plan_text(const CapacityPlan& plan);
std::string format_plan_json(const CapacityPlan& plan);

}  // namespace pagedkv

#endif  // PAGEDKV_CAPACITY_PLAN_H_
