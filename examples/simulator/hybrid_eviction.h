// File: examples/simulator/hybrid_eviction.h
//
// Block-level models of a hybrid model's prefix cache (layer groups: full attention,
// sliding window, chunked local), replayed under the replay rule of docs/results.md at
// the manager's block size: requests one at a time in file order; each looks up its
// cached prefix, computes the rest of its prompt in chunks of `chunk_tokens` (one engine
// step each, so a windowed group releases the blocks behind its window between chunks),
// and is freed. No decode blocks, no concurrency. A hit never covers a prompt's last
// token. The models work on block identities (HitStreams), not token ids, so they replay a
// whole trace at many pool sizes in seconds. Two arrangements:
//
// pagedkv (replay_pagedkv_model): one pool per layer group (KvCacheConfig::split_budget()),
// each with the free queue of BlockPool: clean blocks at its head (reused first), cached
// blocks in LRU order, a hit's free blocks taken out, allocation from the head evicting
// the least recently used. A windowed group releases the entries wholly before the window
// of the next chunk's first token, in table order; a freed sequence returns each group's
// held entries tail first. A block recomputed while its content is cached becomes a
// standby of the indexed copy (it takes over when that one is evicted). Hits: each full
// group's verified chain from block 0 (each block after its parent's content), then each
// windowed group the longest prefix whose window it holds (each entry verified after the
// anchor's block before it, the anchor being the first full group), in turn until they
// agree (KvCacheManager::match_prefix). HybridReplayOptions::proposed() is
// KvCacheManager's own rule (docs/results.md, "Hybrid models"): the tests check that the
// model hits, token for token, what the manager hits on the same replay. WindowRule::kLru
// with the other options off is the manager before that rule (plain LRU pools).
//
// vLLM (replay_vllm_model): one shared pool of equal blocks (vLLM's grouping with padding,
// capacity_plan.h vllm_grouping()), one free queue over (hash, KV cache group) blocks,
// written from vllm/v1/core (block_pool.py BlockPool, single_type_kv_cache_manager.py
// FullAttentionManager / SlidingWindowManager, kv_cache_coordinator.py
// HybridKVCacheCoordinator):
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
// The hash chain alone identifies a block (vLLM verifies nothing more).
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_HYBRID_EVICTION_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_HYBRID_EVICTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/layer_group.h"
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
  int64_t prompt_tokens() const;
};

// The Mooncake trace's prompts at `block_size` tokens per block: token p of the 512-token
// block with hash id h is f(h, p) (tokens.h), so full block i of a prompt is named by
// (hash_ids[i * block_size / 512], its place in that 512-token block), and hash ids are
// prefix-chained (shared/traces/README.md). Errors: InvalidArgument for a block size that
// does not divide 512, or a request without hash ids.
[[nodiscard]] absl::StatusOr<HitStreams> hit_streams(const Trace& trace, int32_t block_size);

// Which kind of earlier event a hit point (the end of the full groups' chain) is.
enum class HitPoint : uint8_t {
  kNone,         // no hit
  kPromptEnd,    // the last full block of an earlier prompt: a conversation continues
  kKnownBranch,  // where an earlier request's full chain ended: a known branch point
  kNewBranch,    // inside an earlier prompt, where no request diverged before
};

// The windowed groups' eviction rule (pagedkv arrangement).
enum class WindowRule : uint8_t {
  kLru,  // one LRU per pool (the manager before kRetainHitPoints)
  // The proposed rule's retention classes: a windowed block goes, when released, to an
  // LRU list by the most useful hit point it completes (it is among the windowed entries
  // that point needs): highest a branch point (where the full groups' chain ended at the
  // sequence's match, and the hit it got), then the checkpoints (every checkpoint_tokens
  // of the prompt, then each finer level of checkpoint_levels, one class lower), lowest
  // none. Lists are evicted lowest first; full groups keep plain LRU.
  kRetainHitPoints,
};

struct HybridReplayOptions {
  int32_t chunk_tokens = 8192;  // prompt tokens per step; 0: the whole prompt at once
  // false: the blocks are cached group after group in index order (the manager before
  // the fix), a windowed group after the anchor's content keys as they are then; a windowed
  // group listed before the anchor (as the planner lists Gemma 3 and gpt-oss) reads the
  // keys of recomputed anchor blocks before they become standbys and take the indexed
  // copy's key, so it caches them after contents that never verify. true: the anchor's
  // blocks are cached first (the fix).
  bool anchor_cached_first = false;
  WindowRule rule = WindowRule::kLru;
  int32_t checkpoint_tokens = 0;  // kRetainHitPoints: a checkpoint every this many tokens
  // Levels of checkpoints: level l every checkpoint_tokens / 2^l tokens, each level in a
  // class below the coarser ones (1: one level).
  int32_t checkpoint_levels = 1;
  // A block whose key is held by copies cached after other parent contents (stale copies:
  // they can never verify again) replaces them, and they become clean, instead of being
  // refused.
  bool replace_stale = false;
  // When the anchor's content of a block leaves its pool, the windowed blocks cached after
  // it (no hit point can use them any more) become clean: reused before any cached block.
  bool uncache_dead_windows = false;

  // The rule proposed in docs/results.md ("Hybrid models"): all of the above, with
  // checkpoints every 16,384, 8,192, 4,096, 2,048 and 1,024 tokens.
  static HybridReplayOptions proposed(int32_t chunk_tokens, int32_t checkpoint_tokens = 16384,
                                      int32_t checkpoint_levels = 5) {
    return {.chunk_tokens = chunk_tokens,
            .anchor_cached_first = true,
            .rule = WindowRule::kRetainHitPoints,
            .checkpoint_tokens = checkpoint_tokens,
            .checkpoint_levels = checkpoint_levels,
            .replace_stale = true,
            .uncache_dead_windows = true};
  }
};

// Where the windowed groups' cut hits come from (pagedkv model): for every hit shorter
// than what the full groups hold, the missing windowed entry nearest the full groups' hit
// point, and what happened to it.
struct CutAnalysis {
  int64_t cut_hits = 0;     // requests whose hit a windowed group cut
  int64_t lost_tokens = 0;  // full-hold tokens minus hit tokens, over those requests
  // The hit points (where the full groups' chain ended) of every hit and of the cut ones,
  // by kind (indexed by HitPoint): requests and full-hold tokens.
  int64_t distinct_points = 0;  // distinct hit points (full-chain ends) of all hits
  int64_t hits_by_point[4] = {};
  int64_t hold_tokens_by_point[4] = {};
  int64_t cuts_by_point[4] = {};
  int64_t lost_tokens_by_point[4] = {};
  // The missing entry: evicted after the sequence that computed it released it behind
  // its window (mid-prompt), evicted after it was freed with the sequence (its last
  // window), or never cached in that group at all (refused or never computed there).
  int64_t missing_released_mid = 0;
  int64_t missing_released_at_free = 0;
  int64_t missing_never_cached = 0;
  // Requests between the eviction of the missing entry and the cut hit (median).
  int64_t median_requests_since_eviction = 0;
  // Windowed pool evictions by how the block was released, and the same for the full
  // pool: mean requests between a block's last release and its eviction.
  int64_t window_evictions_mid = 0;
  int64_t window_evictions_at_free = 0;
  double window_mean_age_requests = 0;
  double full_mean_age_requests = 0;
};

struct HitReplayResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;          // served by every group (what match_prefix claims)
  int64_t full_hold_tokens = 0;    // what the full-attention groups alone hold at each match
  int64_t cut_hits = 0;            // requests with hit_tokens below their full hold
  std::vector<int64_t> evictions;  // cached blocks evicted, per group (vLLM: one pool)
  // pagedkv model, per group: computed blocks whose key a copy cached after other parent
  // contents held (refused and left uncached; with replace_stale, they replace it).
  std::vector<int64_t> refused;
  double hit_rate() const {
    return prompt_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / prompt_tokens;
  }
  double of_full_hold() const {
    return full_hold_tokens == 0 ? 1.0 : static_cast<double>(hit_tokens) / full_hold_tokens;
  }
};

// The pagedkv arrangement with `groups` (kind, window, num_blocks per group; at least one
// full group). Errors: InvalidArgument for no full group, a pool smaller than a chunk
// needs, or a chunk below one block.
[[nodiscard]] absl::StatusOr<HitReplayResult> replay_pagedkv_model(
    const HitStreams& streams, std::span<const LayerGroup> groups,
    const HybridReplayOptions& options, CutAnalysis* analysis = nullptr);

// vLLM's arrangement: `num_blocks` usable blocks (vLLM's pool less its null block) shared
// by the KV cache groups `groups` (kind and window; num_blocks ignored), in vLLM's group
// order. clean_first: freed blocks without a hash are reused before cached ones, which is
// what vLLM v1 measured on this replay (tests/trace_replay_test.cc: with one full group the
// model then hits exactly its 15,619,888 and 2,932,336 tokens at 131,071 and 16,383
// blocks); false: every freed block joins the queue's tail, as block_pool.py's
// free_blocks() reads (15,597,792 and 2,930,448). Errors as replay_pagedkv_model().
[[nodiscard]] absl::StatusOr<HitReplayResult> replay_vllm_model(const HitStreams& streams,
                                                                int32_t num_blocks,
                                                                std::span<const LayerGroup> groups,
                                                                int32_t chunk_tokens,
                                                                bool clean_first = true);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_HYBRID_EVICTION_H_
