// File: examples/decode_loop/cache_plan.h
//
// Where the model's K/V live: its layers grouped into the allocator's layer groups
// (pagedkv/layer_group.h) by the tokens they attend to, each group with the storage shape
// of its layers and its share of the byte budgets.
//
//   llama   one full-attention group of every layer (what the loop always did)
//   swa     one group per (kind, window) of the layer pattern: the full group first (the
//           manager's group 0, whose chain verifies the windowed groups' prefix hits and
//           whose figures stats() reports), then the windowed groups in layer order
//   mla     one full-attention group of latents (KvCacheSpec::latent)
//   ssm     the full group first, then one state group (AttentionKind::kState) of the
//           state layers: a slot per sequence of their conv and recurrent states (fp32),
//           and the checkpoint slots that prefix hits restore
//   treat_as_full (--treat-as-full): every layer in one full group, as an allocator
//           without layer groups keeps a hybrid model. The layers still attend only to
//           their windows (the kernels take each layer's kind and window), but no block
//           is released behind a window: the comparison for the concurrency gain.
//
// The budgets (device, swap space, host tier) are split between the groups with
// KvCacheConfig::split_budget() in proportion to what one sequence of `split_tokens`
// tokens needs in each (the workload's mean prompt + output length, main.cc), each pool
// whole pages. A one-group plan gets floor(budget / page) blocks, as before groups.
#ifndef PAGEDKV_EXAMPLES_DECODE_LOOP_CACHE_PLAN_H_
#define PAGEDKV_EXAMPLES_DECODE_LOOP_CACHE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/kv_cache_plan.h"
#include "pagedkv/kv_cache_spec.h"
#include "pagedkv/layer_group.h"

namespace decode_loop {

struct CacheGroup {
  pagedkv::AttentionKind kind = pagedkv::AttentionKind::kFull;  // as the allocator treats it
  int32_t window = 0;
  std::vector<int32_t> layers = {};  // the model's layers in the group, ascending
  pagedkv::KvCacheSpec spec = {};    // their K/V (or latents) as stored; unused for kState
  pagedkv::StateShape state = {};    // kState: their states, one slot per sequence
  int32_t num_blocks = 0;            // device blocks
  int32_t num_host_blocks = 0;       // host blocks: swap space and host tier
  int32_t host_cache_blocks = 0;     // of those, the host tier's share

  // "full", "sliding window 40": for summaries.
  std::string name() const;
  // Bytes of one block, or of one state slot.
  int64_t page_bytes() const;
};

// Where a model layer's K/V are: its group, and its index among the group's layers.
struct LayerPlace {
  int32_t group = 0;
  int32_t index = 0;
};

struct CachePlan {
  std::vector<CacheGroup> groups;
  std::vector<LayerPlace> places;  // per model layer
  pagedkv::KvCacheConfig config;   // the groups' shapes, for sizing
  bool treat_as_full = false;
  int64_t split_tokens = 0;  // the sequence length the budget split balances
  int64_t budget_bytes = 0;  // device budget; the pools use budget minus each one's remainder

  int32_t num_groups() const { return static_cast<int32_t>(groups.size()); }
  int64_t pool_bytes() const;  // device bytes of all pools
  // Device bytes of one block in every attention group: the bytes a token costs, times
  // block_size (a state group's slot costs the same at any length).
  int64_t bytes_per_block_all_groups() const;
  // The library's plan of these groups and pools: the manager's options and every group's
  // storage come from it (KvCachePlan::create()'s errors).
  absl::StatusOr<pagedkv::KvCachePlan> kv_plan() const;
};

// Groups the layers of `model` (see above). InvalidArgument for a configuration the
// storage cannot hold (KvCacheConfig::validate()), or state layers treated as full.
absl::StatusOr<CachePlan> plan_cache(const ModelConfig& model, pagedkv::DType dtype,
                                     int32_t block_size, bool treat_as_full);

// Byte budgets of the pools, all >= 0.
struct PoolBudgets {
  int64_t device_bytes = 0;
  int64_t swap_bytes = 0;        // host blocks for swapped sequences
  int64_t host_cache_bytes = 0;  // host blocks for the host tier (0: no tier)
};

// Splits the budgets into the groups' pools for sequences of `split_tokens` tokens, and
// checks that each pool can serve one sequence (a windowed one its window) beside the
// watermark of `watermark_fraction` of its blocks (at least one). InvalidArgument naming
// the budget and the group when one is too small (the swap space may be too small for a
// page: then there is no swap space), or a host pool beyond BlockPool's limit.
absl::Status size_pools(const PoolBudgets& budgets, int64_t split_tokens, CachePlan* plan);

// The device blocks group 0 leaves free for running sequences to grow (the manager scales
// it to the other groups).
int32_t watermark_blocks(const CachePlan& plan);

// The longest sequence (prompt + output) the pools hold alone beside their watermarks:
// the workload cuts prompts to it. A full group holds every block of it. A windowed group
// holds, while a sequence prefills, the blocks of the step's new tokens and the window
// before them: all of a prompt's when it is prefilled in one step (`prefill_chunk` 0),
// else a chunk's. InvalidArgument naming the group when a windowed pool cannot hold a
// chunk and its window.
absl::StatusOr<int32_t> max_sequence_tokens(const CachePlan& plan, int32_t prefill_chunk);

}  // namespace decode_loop

#endif  // PAGEDKV_EXAMPLES_DECODE_LOOP_CACHE_PLAN_H_
