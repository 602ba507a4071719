// File: examples/simulator/prefix_replay.h
//
// The prefix-hit replay rule of docs/results.md, through the library: requests one at a
// time in file order; each is added (KvCacheManager::add_sequence), claims its cached prefix
// (match_prefix), computes the rest of its prompt in chunks of `chunk_tokens` tokens, one
// engine step each (allocate_slots, then take_step_ops(): a windowed group releases the
// blocks behind its window between chunks, and a state group's checkpoints become
// restorable), and is freed. No decode tokens, no concurrency. Beside each hit it counts what
// the full-attention groups alone hold at that match (the *full hold*): the first full
// group's verified chain, read with BlockPool::find_cached() before match_prefix(). The
// hybrid-model and state-layer studies (hybrid.h, state_study.h) replay their workloads
// through it; the models of vLLM's rules beside them (studies/) count the same figures.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_PREFIX_REPLAY_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_PREFIX_REPLAY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_manager.h"
#include "pagedkv/types.h"
#include "trace.h"

namespace pagedkv::sim {

// A workload's prompts. A whole trace's token ids would take hundreds of MiB, so tokens(i,
// out) writes prompt i's ids into a buffer the caller reuses.
struct Prompts {
  std::string name;
  std::vector<int32_t> lengths = {};  // prompt tokens, per prompt
  std::vector<int32_t> outputs = {};  // generated tokens, per prompt (a split's target counts them)
  std::function<void(int64_t index, std::vector<TokenId>& out)> tokens = nullptr;

  int64_t size() const { return static_cast<int64_t>(lengths.size()); }
  int32_t longest() const;
  int64_t total_tokens() const;
};

// A trace's prompts, Mooncake hash ids expanded to token ids as tokens.h does.
Prompts trace_prompts(const Trace& trace);

// The nearest-rank median of prompt + output tokens (the length pools are split for, as
// pagedkv-plan --trace takes it).
int64_t median_request_tokens(const Prompts& prompts);

// What one replay hit, in prompt tokens.
struct PrefixHits {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;         // claimed from the cache
  int64_t full_hold_tokens = 0;   // what the full-attention groups alone held at each match
  int64_t hits = 0;               // requests with a hit
  int64_t cut_hits = 0;           // requests whose hit is shorter than their full hold
  int64_t checkpoints_saved = 0;  // state checkpoints saved (the vLLM rule: states cached)
  std::vector<int64_t>
      evictions;  // cached blocks or checkpoints evicted, per group (vLLM: its pool)

  int64_t recomputed_tokens() const { return prompt_tokens - hit_tokens; }
  double hit_rate() const {
    return prompt_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / prompt_tokens;
  }
  double of_full_hold() const {
    return full_hold_tokens == 0 ? 1.0 : static_cast<double>(hit_tokens) / full_hold_tokens;
  }
};

// Replays `prompts` through a KvCacheManager created with `options` (prefix caching on, a
// full-attention group, max_model_len at least prompts.longest()), in chunks of
// `chunk_tokens` (0: each prompt in one step). Errors: InvalidArgument for a negative chunk;
// the manager's, naming the request.
[[nodiscard]] absl::StatusOr<PrefixHits> replay_prefix_hits(const Prompts& prompts,
                                                            const KvCacheManager::Options& options,
                                                            int32_t chunk_tokens);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_PREFIX_REPLAY_H_
