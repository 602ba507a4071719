// File: examples/simulator/hybrid.h
//
// The hybrid-model study (issue 21, docs/results.md "Hybrid models"): hybrid models whose
// layer groups (full attention, sliding window) each get a pool of their own from one byte
// budget, split by KvCacheConfig::split_budget() at the trace's median request length, and
// driven through the real KvCacheManager (Options::layer_groups).
//   - Utilization and concurrency: the engine model (engine.h, chunked prefill) replays a
//     trace with the hybrid pools and with every layer treated as full attention (one pool
//     of all layers) at the same byte budget: KV bytes held against the model's analytic
//     need (KvCacheConfig::min_bytes_per_sequence()), running sequences.
//   - Prefix hits (Mooncake trace): the replay rule of prefix_replay.h at 16-token blocks
//     through the KvCacheManager (its windowed eviction rule), at pool sizes given as
//     fractions of the trace's footprint, against what the full-attention groups alone hold
//     at each match and against a model of vLLM's hybrid rule at the same memory
//     (studies/vllm_hybrid_rule.h).
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_HYBRID_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_HYBRID_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/kv_cache_manager.h"
#include "prefix_replay.h"
#include "trace.h"

namespace pagedkv::sim {

// A model's KV cache as layer groups, in the order of their first layer (as the planner
// reads config.json).
struct HybridModel {
  std::string name;
  KvCacheConfig config;
};

// Gemma-3-27B: 52 sliding-window layers (1,024 tokens) and 10 full ones, 16 KV heads of
// 128, bf16 (tests/planner/fixtures/google--gemma-3-27b-it).
HybridModel gemma3_27b();
// gpt-oss-120b: 18 sliding-window layers (128 tokens) and 18 full ones, 8 KV heads of 64,
// bf16 (tests/planner/fixtures/openai--gpt-oss-120b).
HybridModel gpt_oss_120b();
// "gemma-3-27b" or "gpt-oss-120b". Errors: InvalidArgument naming the known models.
[[nodiscard]] absl::StatusOr<HybridModel> hybrid_model(std::string_view name);

// Every layer treated as full attention: one full group of all of the config's layers.
// Errors: InvalidArgument when the groups' per-layer KV shapes differ.
[[nodiscard]] absl::StatusOr<KvCacheConfig> full_treatment(const KvCacheConfig& config);

struct HybridStudyOptions {
  std::vector<std::string> models = {"gemma-3-27b", "gpt-oss-120b"};
  // Pool sizes for the hit study: fractions of the trace's footprint (every distinct full
  // block cached in every group).
  std::vector<double> fractions = {1, 0.5, 0.25, 0.125, 0.0625};
  int32_t block_size = 16;
  int32_t chunk_tokens = 8192;  // prefill chunk, both studies
  // The windowed groups' eviction rule: its coarsest checkpoints (0: none) and their levels,
  // each at half the spacing (KvCacheManager::Options::window_checkpoint_tokens, _levels).
  int32_t checkpoint_tokens = 16384;
  int32_t checkpoint_levels = 5;
  // Utilization: the budget holds this many tokens with every layer full (Azure, Mooncake).
  int64_t azure_budget_tokens = 65536;
  int64_t mooncake_budget_tokens = 524288;
};

// The KvCacheManager options of the hit study: `groups` (in their order), prefix caching
// on, the windowed groups' checkpoints of `options`, prompts of up to `longest` tokens.
KvCacheManager::Options hit_study_manager_options(std::span<const LayerGroup> groups,
                                                  const HybridStudyOptions& options,
                                                  int32_t longest);

// One pool size of the hit study.
struct HybridHitRow {
  double fraction = 0;
  int64_t budget_bytes = 0;
  std::vector<LayerGroup> groups;  // pagedkv's pools, in the planner's order
  int64_t vllm_blocks = 0;         // vLLM's usable blocks (its pool less the null block)
  PrefixHits manager;              // the KvCacheManager on `groups`
  PrefixHits vllm;                 // the model of vLLM's rule
  // The split that counts the prefix cache (KvCacheConfig::split_budget() with the
  // footprint as cached_tokens): its pools, and the KvCacheManager on them.
  std::vector<LayerGroup> cache_groups;
  PrefixHits cache_manager;
};

struct HybridHitStudy {
  std::string model;
  std::string trace;
  int64_t requests = 0;
  int64_t target_tokens = 0;  // the split's length: the trace's median request
  int64_t footprint_blocks = 0;
  int64_t footprint_bytes = 0;
  int64_t cached_tokens = 0;  // the footprint in tokens: the cache-counting split's
  int32_t chunk_tokens = 0;
  int32_t checkpoint_tokens = 0;
  int32_t checkpoint_levels = 0;
  std::string vllm_grouping;  // in words
  std::vector<HybridHitRow> rows;
};

// The hit study of `model` on a Mooncake trace. Errors: InvalidArgument (no hash ids, a
// budget too small for a pool), the replays'.
[[nodiscard]] absl::StatusOr<HybridHitStudy> hybrid_hit_study(const Trace& trace,
                                                              const HybridModel& model,
                                                              const HybridStudyOptions& options);

// One trace and model of the utilization study.
struct HybridUtilRun {
  std::string trace;
  std::string model;
  int64_t requests = 0;
  int64_t budget_bytes = 0;
  int64_t target_tokens = 0;
  std::vector<LayerGroup> groups;  // the hybrid pools
  int32_t full_blocks = 0;         // the full treatment's one pool
  // The hybrid pools with room for one prefill chunk in flight in each windowed group
  // (split_with_chunk_headroom()).
  std::vector<LayerGroup> headroom_groups;
  EngineResult hybrid;
  EngineResult full;
  EngineResult headroom;
};

// The blocks a windowed group of `window` tokens holds for one step that computes `chunk`
// prompt tokens beyond the window before it: ceil(chunk / b) + ceil((window - 1) / b) + 1.
// KvCacheConfig::blocks_per_sequence() counts a decode step (b tokens) instead.
int64_t chunk_headroom_blocks(int32_t window, int32_t chunk, int32_t block_size);

// A split that sets aside chunk_headroom_blocks() in every windowed group first and splits
// the rest of the budget as KvCacheConfig::split_budget() does: its sequences of the target
// length, plus one prefill chunk in flight. Errors: those of split_budget().
[[nodiscard]] absl::StatusOr<std::vector<LayerGroup>> split_with_chunk_headroom(
    const KvCacheConfig& config, int64_t budget_bytes, int64_t target_tokens, int32_t chunk);

// Replays `trace` (clamped, scaled and truncated as simulate.cc does) with the engine
// model on the hybrid pools, on the hybrid pools with chunk headroom and on the full
// treatment, prefix caching off.
[[nodiscard]] absl::StatusOr<HybridUtilRun> hybrid_util_run(
    const Trace& trace, const HybridModel& model, int64_t budget_bytes, int32_t max_model_len,
    const HybridStudyOptions& options, const EngineOptions& engine);

std::string format_hybrid_hit_study(const HybridHitStudy& study);
std::string format_hybrid_util_runs(const std::vector<HybridUtilRun>& runs);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_HYBRID_H_
