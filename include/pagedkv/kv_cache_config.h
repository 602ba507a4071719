// File: pagedkv/kv_cache_config.h
//
// KvCacheConfig is a model's KV cache as a list of layer groups: each group is an
// attention kind (full, sliding window, chunked local) and the KV shape of its layers, all
// groups sharing one block size and dtype, or (kState) state-space layers and the size of
// their per-sequence state. It says how many bytes a token costs in each
// group, the least KV a sequence of L tokens must keep, and how a byte budget is split
// into one pool per group. It knows nothing of BlockPool: it sizes, the allocator
// allocates (KvCacheManager takes the LayerGroup values split_budget() returns).
//
// The pool arrangement: one pool per group, whose pages (blocks) hold exactly block_size
// tokens of that group's layers, all carved from one byte budget. No group is padded to
// another's size, so the only bytes lost are each pool's remainder below one page. The
// budget is split in proportion to what one sequence of a target length needs in each
// group (blocks_per_sequence()), so at that length every pool runs out together; at other
// lengths one pool runs out first (docs/allocator.md, "Layer groups and their pools").
//
// A kState group's pool holds state slots instead of token blocks: a slot is every layer's
// state of one sequence (StateShape::bytes()), whatever its length. A running sequence
// holds one; the others are checkpoints, copies of a sequence's state at a block-aligned
// position that a prefix hit restores. The split sets aside 1 + checkpoints_per_sequence
// slots per sequence. Hits are verified along an attention group's block chain, so a
// config needs an attention group beside its state groups: state-only models (Mamba,
// RWKV) are out of scope.
//
// Gemma-3-27B has 52 sliding-window layers of 1,024 tokens and 10 full layers, 16 KV heads
// of 128 in bf16.
// Example:
//   KvCacheConfig config{
//       .groups = {{.kind = AttentionKind::kSlidingWindow, .window = 1024,
//                   .shape = {.num_layers = 52, .num_kv_heads = 16, .head_dim = 128}},
//                  {.kind = AttentionKind::kFull,
//                   .shape = {.num_layers = 10, .num_kv_heads = 16, .head_dim = 128}}},
//       .dtype = DType::kBFloat16, .block_size = 16};
//   config.bytes_per_token(0);             // 425984: 2 x 52 x 16 x 128 x 2
//   config.bytes_per_token();              // 507904, both groups
//   config.min_bytes_per_sequence(32768);  // 3120562176: 1,024 x 425,984 + 32,768 x 81,920
//   absl::StatusOr<PoolSplit> split = config.split_budget(int64_t{64} << 30, 32768);
//   // split->groups[g].num_blocks: each group's pool, for KvCacheManager::Options.
#ifndef PAGEDKV_KV_CACHE_CONFIG_H_
#define PAGEDKV_KV_CACHE_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pagedkv/dtype.h"
#include "pagedkv/kv_cache_spec.h"
#include "pagedkv/layer_group.h"

namespace pagedkv {

// The per-sequence state of the layers of a kState group: a short causal convolution's
// last kernel - 1 inputs and the recurrent state, each in its own dtype (vLLM's
// mamba_cache_dtype and mamba_ssm_cache_dtype).
//   Mamba2:          conv (conv_kernel - 1) x (intermediate + 2 x n_groups x state_size),
//                    recurrent num_heads x head_dim x state_size
//   Gated DeltaNet:  conv (conv_kernel - 1) x (2 x k_heads x k_dim + v_heads x v_dim),
//                    recurrent v_heads x k_dim x v_dim
struct StateShape {
  int32_t num_layers = 0;
  int64_t conv_elements = 0;       // per layer
  int64_t recurrent_elements = 0;  // per layer
  DType conv_dtype = DType::kBFloat16;
  DType recurrent_dtype = DType::kFloat32;

  int64_t bytes_per_layer() const {
    return conv_elements * bytes_per_element(conv_dtype) +
           recurrent_elements * bytes_per_element(recurrent_dtype);
  }
  // One state slot: every layer's state of one sequence.
  int64_t bytes() const { return num_layers * bytes_per_layer(); }
};

// One layer group: the layers of one attention kind (and window) and their KV shape, or
// (kState) the layers' state.
struct KvCacheGroup {
  AttentionKind kind = AttentionKind::kFull;
  int32_t window = 0;  // tokens: > 0 for kSlidingWindow and kChunkedLocal, else 0
  // The group's layers: num_layers, num_kv_heads, head_dim, latent. Its dtype and
  // block_size are ignored: the config's apply to every group. Unused for kState.
  KvCacheSpec shape = {};
  StateShape state = {};  // kState only
};

// A byte budget split into one pool per group (KvCacheConfig::split_budget()).
struct PoolSplit {
  // Per group, in the config's order: kind, window and num_blocks for
  // KvCacheManager::Options (num_host_blocks 0).
  std::vector<LayerGroup> groups;
  std::vector<int64_t> pool_bytes;  // per group: num_blocks x page bytes (kState: slots x slot)
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;     // sum of pool_bytes
  int64_t lost_bytes = 0;     // budget_bytes - used_bytes: each pool's remainder below a page
  int64_t target_tokens = 0;  // the sequence length the split balances
  int64_t cached_tokens = 0;  // the prefix-cache content it counts (0: none)
};

struct KvCacheConfig {
  std::vector<KvCacheGroup> groups;
  DType dtype = DType::kBFloat16;
  int32_t block_size = 16;  // tokens per block, every group
  // Checkpoint slots the split sets aside per sequence in each kState group, beside its
  // running slot: the prompt-end checkpoint (a later request with the same prompt resumes
  // there) and one branch point (where two requests' prompts part). A model-independent
  // default, not tuned per trace.
  int32_t checkpoints_per_sequence = 2;

  // OK, or InvalidArgument naming the first bad field: no groups, a window that does not
  // fit its kind, a shape that KvCacheSpec::validate() refuses, a state group with a
  // window, no layers or no state elements, state groups with no attention group beside
  // them, a negative checkpoints_per_sequence.
  [[nodiscard]] absl::Status validate() const;

  // Group g's shape with the config's dtype and block_size (meaningless for kState).
  KvCacheSpec group_spec(int32_t g) const;
  int32_t num_groups() const { return static_cast<int32_t>(groups.size()); }
  bool is_state(int32_t g) const {
    return groups[static_cast<size_t>(g)].kind == AttentionKind::kState;
  }
  int32_t num_layers() const;           // over all groups
  int32_t num_layers(int32_t g) const;  // group g's: shape.num_layers, or state.num_layers

  // Bytes of one token in group g's layers, and in all layers. 0 for a kState group: its
  // state does not grow with tokens.
  int64_t bytes_per_token(int32_t g) const;
  int64_t bytes_per_token() const;
  // Bytes of one page of group g's pool: block_size tokens of its layers, or (kState) one
  // state slot, StateShape::bytes().
  int64_t page_bytes(int32_t g) const;

  // Tokens of group g that the last token of a sequence of `tokens` tokens attends to:
  // full: all of them; sliding window w: min(tokens, w); chunked c: its chunk so far,
  // (tokens - 1) % c + 1. 0 for tokens <= 0.
  int64_t tokens_attended(int32_t g, int64_t tokens) const;
  // The analytic minimum of KV bytes one sequence of `tokens` tokens keeps: the tokens
  // its last token attends to, in every group, at bytes_per_token(g), no block rounding,
  // plus one state slot per kState group.
  int64_t min_bytes_per_sequence(int64_t tokens) const;

  // Blocks of group g that hold a token the last token attends to: what a sequence of
  // `tokens` tokens keeps once the manager has released the blocks before its window
  // (kState: its one slot).
  int64_t blocks_held(int32_t g, int64_t tokens) const;
  // Bytes of those blocks over all groups.
  int64_t held_bytes_per_sequence(int64_t tokens) const;

  // Blocks of group g that the budget split sets aside per sequence of `tokens` tokens
  // (b = block_size, never more than the blocks of `tokens` tokens, ceil(tokens / b)):
  //   full:        ceil(tokens / b)
  //   sliding w:   ceil(min(tokens, w - 1 + b) / b) + 1  (a step of up to b new tokens
  //                sees w - 1 earlier ones, and the window straddles a block boundary)
  //   chunked c:   ceil(min(tokens, c) / b) + 1          (the chunk, straddling a block)
  //   state:       1                                     (its running slot)
  int64_t blocks_per_sequence(int32_t g, int64_t tokens) const;
  // Pages of group g the budget split counts per target-length sequence:
  // blocks_per_sequence(), plus checkpoints_per_sequence for a kState group.
  int64_t split_pages_per_sequence(int32_t g, int64_t tokens) const;
  // Bytes of those blocks over all groups.
  int64_t reserved_bytes_per_sequence(int64_t tokens) const;

  // Splits `budget_bytes` into one pool per group in proportion to
  // split_pages_per_sequence(g, target_tokens) x page_bytes(g), each pool whole pages
  // (capped at 2^31 - 1 blocks).
  //
  // `cached_tokens` > 0 counts the prefix cache too: the tokens of distinct prompt
  // content the cache should keep (a trace's footprint; the planner's --cached-tokens).
  // No group then gets more than it can use, ceil(cached_tokens / b) +
  // split_pages_per_sequence(g, target_tokens) pages (all of that content cached, a
  // state group's with a checkpoint per cached block at most, and one target-length
  // sequence in flight), while another group is below its own: the
  // excess goes to the others in the same proportion (water filling). Only budgets
  // large enough for the full groups to cache everything change: the windowed pools,
  // which the proportional split keeps small, then cache more. Once every group has its
  // fill, the rest is shared in proportion again.
  // Errors: InvalidArgument for an invalid config, a budget outside [0, 2^50] bytes, a
  // target below 1 token, cached_tokens outside [0, 2^50], or a budget that leaves a
  // group less than one page or slot (the message names the group, its share and its
  // page size).
  [[nodiscard]] absl::StatusOr<PoolSplit> split_budget(int64_t budget_bytes, int64_t target_tokens,
                                                       int64_t cached_tokens = 0) const;

  // Sequences of `tokens` tokens that the pools of `split` hold at once: the fewest over
  // the groups of split.groups[g].num_blocks / blocks_per_sequence(g, tokens).
  int64_t max_sequences(const PoolSplit& split, int64_t tokens) const;
};

}  // namespace pagedkv

#endif  // PAGEDKV_KV_CACHE_CONFIG_H_
