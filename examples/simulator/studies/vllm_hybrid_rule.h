// File: examples/simulator/studies/vllm_hybrid_rule.h
//
// A model of vLLM's prefix cache for hybrid models (layer groups of full attention and
// sliding window), the baseline of the hybrid-model study (hybrid.h): one shared pool of
// equal blocks (vLLM's grouping with padding, capacity_plan.h vllm_grouping()), one free
// queue over (hash, KV cache group) blocks, replayed under the replay rule of
// prefix_replay.h at the same block size. Written from vllm/v1/core (block_pool.py
// BlockPool, single_type_kv_cache_manager.py FullAttentionManager / SlidingWindowManager,
// kv_cache_coordinator.py HybridKVCacheCoordinator):
//   - BlockPool: free_blocks() appends every block whose ref count reaches 0 to the tail of
//     the one FreeKVCacheBlockQueue (cached or not); get_new_blocks() pops from its head
//     and _maybe_evict_cached_block() drops the popped block's (hash, group) entry;
//     touch() takes a hit's free blocks out of the queue; cached_block_hash_to_block maps
//     (hash, group) to the blocks holding it in insertion order, and get_cached_block()
//     returns the first; identical blocks are not de-duplicated.
//   - find_longest_cache_hit(): FullAttentionManager walks the chain left to right;
//     SlidingWindowManager scans right to left for cdiv(sliding_window - 1, block_size)
//     contiguous cached blocks (or the run from block 0); KV cache groups of one spec are
//     looked up together (a block is a hit only when cached in every one of them);
//     HybridKVCacheCoordinator puts full attention first and, for one full and one other
//     spec, takes the windowed answer after one round.
//   - remove_skipped_blocks() (start of allocate_slots): a sliding window group frees the
//     blocks before get_num_skipped_tokens(num_computed_tokens) = num_computed -
//     sliding_window + 1, last block first (_remove_blocks_in_range walks backwards).
//   - allocate_slots(): touch the hit's blocks (a windowed group only those in the
//     window), allocate_new_blocks() group after group, cache_blocks() for the full blocks.
//   - free(): group after group, each group's blocks in reverse (tail first).
// The hash chain alone identifies a block (vLLM verifies nothing more). The model works on
// block identities (HitStreams), not token ids, so it replays a whole trace at many pool
// sizes in seconds. It omits what this replay does not exercise: EAGLE, prefix-cache
// retention intervals, KV connectors.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_VLLM_HYBRID_RULE_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_VLLM_HYBRID_RULE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/layer_group.h"
#include "prefix_replay.h"
#include "trace.h"

namespace pagedkv::sim {

// One request's prompt as block identities: ids[i] names the content of full block i (its
// tokens and everything before them), equal ids for equal prefixes.
struct HitRequest {
  std::vector<int32_t> ids;  // the prompt's full blocks
  int32_t num_tokens = 0;    // prompt tokens (the last block may be partial)
};

struct HitStreams {
  int32_t block_size = 16;
  int32_t num_ids = 0;  // distinct full blocks: the trace's footprint in blocks
  std::vector<HitRequest> requests;
};

// The Mooncake trace's prompts at `block_size` tokens per block: token p of the 512-token
// block with hash id h is f(h, p) (tokens.h), so full block i of a prompt is named by
// (hash_ids[i * block_size / 512], its place in that 512-token block), and hash ids are
// prefix-chained (shared/traces/README.md). Errors: InvalidArgument for a block size that
// does not divide 512, or a request without hash ids.
[[nodiscard]] absl::StatusOr<HitStreams> hit_streams(const Trace& trace, int32_t block_size);

// vLLM's arrangement: `num_blocks` usable blocks (vLLM's pool less its null block) shared
// by the KV cache groups `groups` (kind and window; num_blocks ignored), in vLLM's group
// order, prompts computed in chunks of `chunk_tokens` (0: whole). clean_first: freed blocks
// without a hash are reused before cached ones, which is what vLLM v1 measured on this
// replay (tests/trace_replay_test.cc: with one full group the model then hits exactly its
// 15,619,888 and 2,932,336 tokens at 131,071 and 16,383 blocks); false: every freed block
// joins the queue's tail, as block_pool.py's free_blocks() reads (15,597,792 and
// 2,930,448). Errors: InvalidArgument for no full group, a windowed group without a window,
// chunked local attention (not modelled), a negative chunk, or a pool smaller than a chunk
// needs.
[[nodiscard]] absl::StatusOr<PrefixHits> replay_vllm_hybrid_rule(const HitStreams& streams,
                                                                 int32_t num_blocks,
                                                                 std::span<const LayerGroup> groups,
                                                                 int32_t chunk_tokens,
                                                                 bool clean_first = true);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STUDIES_VLLM_HYBRID_RULE_H_
