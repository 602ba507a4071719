// File: examples/simulator/studies/vllm_state_rule.h
//
// A model of vLLM's prefix cache for models with state layers (Mamba2, Gated DeltaNet), the
// baseline of the state-layer study (state_study.h), replayed one request at a time under
// the replay rule of prefix_replay.h. One shared pool in bytes: attention blocks of vLLM's
// block size B (hundreds to thousands of tokens, so that one block's KV is as large as one
// layer's state), a state per cached block boundary, and at each prompt's last 16-token
// boundary a partial entry (the attention block holding it and the state there), all LRU in
// one free queue (vllm/v1/core/single_type_kv_cache_manager.py: FullAttentionManager and
// MambaManager find_longest_cache_hit() with fine-grained hash lookup,
// _cache_partial_tail_block(), BlockPool). A hit is the coordinator's fixed point of the two
// managers: the largest position with a state cached there and the attention up to it.
//
// Glossary: b = 16 tokens, the hash block; "position" p is a token count, always a multiple
// of b; a state at p is the state after the first p tokens.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_VLLM_STATE_RULE_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_VLLM_STATE_RULE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/types.h"
#include "prefix_replay.h"

namespace pagedkv::sim {

// One prompt as the model sees it: its length and the chain key of each full b-token block
// (keys[i] names tokens [0, (i + 1) b): equal keys, equal prefixes).
struct PromptKeys {
  int32_t length = 0;
  std::vector<uint64_t> keys;
};

// The chain keys of `tokens` in blocks of `block_size`.
PromptKeys prompt_keys(std::span<const TokenId> tokens, int32_t block_size);

// vLLM's page-unified sizes for a model: its attention block and one cached state.
struct VllmStateSizes {
  int32_t block_tokens = 0;  // B
  // vLLM pads each state layer's page to the attention page (B tokens of one attention
  // layer), so one cached state costs (state layers) x (attention page).
  int64_t state_bytes = 0;
  int64_t block_bytes = 0;  // one attention block of B tokens, every attention layer
};

// The model on one pool of `pool_bytes`, `block_size` (b) tokens per hash block. Counts
// hit tokens, requests with a hit and states cached (PrefixHits::checkpoints_saved).
// Errors: InvalidArgument for a prompt larger than the pool.
[[nodiscard]] absl::StatusOr<PrefixHits> replay_vllm_state_rule(std::span<const PromptKeys> prompts,
                                                                const VllmStateSizes& sizes,
                                                                int64_t pool_bytes,
                                                                int32_t block_size);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_VLLM_STATE_RULE_H_
