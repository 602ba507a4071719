// File: examples/simulator/state_cache.h
//
// The state-layer prefix-hit study (docs/results.md, "State-space layers"): hybrid models
// whose state layers (Mamba2, Gated DeltaNet) keep one fixed-size state per sequence. A
// prefix hit of p tokens needs the attention blocks up to p and a checkpoint (a copy of the
// state) at exactly p. Requests are replayed one at a time (the replay rule of
// docs/results.md) through two block-level models at the same byte budget:
//
//   pagedkv   16-token attention blocks in one LRU pool; a pool of state slots, one for the
//             running sequence, the rest cached checkpoints, admitted and evicted by a
//             CheckpointPolicy (the manager's policy and its variants).
//   vLLM rule one shared pool: attention blocks of vLLM's block size B (hundreds to
//             thousands of tokens, so that one block's KV is as large as one layer's
//             state), a state per cached block boundary, and at each prompt's last 16-token
//             boundary a partial entry (the attention block holding it and the state there),
//             all LRU in one free queue (vllm/v1/core/single_type_kv_cache_manager.py:
//             FullAttentionManager and MambaManager find_longest_cache_hit() with
//             fine-grained hash lookup, _cache_partial_tail_block(), BlockPool).
//
// Glossary: b = 16 tokens, the hash block; "position" p is a token count, always a
// multiple of b; a checkpoint at p is the state after the first p tokens.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STATE_CACHE_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STATE_CACHE_H_

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_config.h"
#include "pagedkv/types.h"
#include "trace.h"

namespace pagedkv::sim {

// One prompt as the study sees it: its length and the chain key of each full b-token block
// (keys[i] names tokens [0, (i + 1) b): equal keys, equal prefixes).
struct PromptKeys {
  int32_t length = 0;
  int32_t output = 0;  // generated tokens (the split's target length counts them)
  std::vector<uint64_t> keys;
};

struct StateWorkload {
  std::string name;
  std::vector<PromptKeys> prompts;
};

// The chain keys of `tokens` in blocks of `block_size`.
PromptKeys prompt_keys(std::span<const TokenId> tokens, int32_t block_size);

// A trace's prompts (Mooncake hash ids expanded to tokens as tokens.h does).
StateWorkload state_workload(const Trace& trace, int32_t block_size);

// A generated workload of shared system prompts shorter than vLLM's block under
// multi-turn conversations: each conversation starts with one of the system prompts (or
// none), and turn t's prompt is turn t - 1's prompt, its answer and a new user turn.
// Conversations overlap in time, so their turns interleave.
struct SharedPromptOptions {
  int32_t conversations = 800;
  int32_t num_system_prompts = 8;
  int32_t system_min = 300;  // tokens, uniform
  int32_t system_max = 1500;
  double no_system_fraction = 0.1;  // conversations without a system prompt
  int32_t max_turns = 6;            // turns per conversation, uniform in [1, max_turns]
  int32_t user_min = 30;            // user turn tokens, log-uniform
  int32_t user_max = 600;
  int32_t answer_min = 50;  // answer tokens, log-uniform
  int32_t answer_max = 800;
  double turn_gap = 20;  // mean gap between a conversation's turns, in mean arrival gaps
  uint64_t seed = 1;
};
StateWorkload shared_prompt_workload(const SharedPromptOptions& options, int32_t block_size);

// The nearest-rank median of prompt + output tokens (the split's target length).
int64_t median_prompt_output(const StateWorkload& workload);

// What the study needs of a model: its attention KV per token (the full-attention groups),
// one state slot (every state group), and vLLM's page-unified sizes.
struct StateModel {
  std::string name;
  KvCacheConfig config;
  int64_t attention_bytes_per_token = 0;
  int64_t slot_bytes = 0;  // one sequence's state in every state layer
  int32_t vllm_block_tokens = 0;
  // vLLM pads each state layer's page to the attention page (B tokens of one attention
  // layer), so one cached state costs (state layers) x (attention page).
  int64_t vllm_state_bytes = 0;
  int64_t vllm_block_bytes = 0;  // one attention block of B tokens, every attention layer
};

// The study's view of `config` with vLLM's attention block of `vllm_block_tokens`.
// Errors: InvalidArgument unless the config has one full-attention and one state group, or with a
// block size that is not a positive multiple of config.block_size or too small for the state.
[[nodiscard]] absl::StatusOr<StateModel> state_model(std::string name, const KvCacheConfig& config,
                                                     int32_t vllm_block_tokens);

// The built-in models, read from the planner's fixtures (tests/planner/fixtures, with
// vLLM's default state dtypes) with vLLM's block by vllm_state_block_size():
// qwen3-next-80b-a3b, nemotron-h-8b, granite-4.0-h-tiny. Errors: InvalidArgument naming
// the known models, the reader's.
[[nodiscard]] absl::StatusOr<StateModel> builtin_state_model(std::string_view name);
std::vector<std::string> builtin_state_model_names();

// Where a sequence saves its state and how cached checkpoints are evicted. One policy type,
// so that variants differ only in these fields.
struct CheckpointPolicy {
  // The order in which cached checkpoints are evicted.
  enum class Eviction {
    kLru,      // least recently saved or hit first (the state pool's free queue)
    kClasses,  // never-hit before hit, then the smallest log2(position / b) bucket, LRU within
  };
  std::string name;
  bool prompt_end = true;    // (a) floor(prompt / b) b
  bool branch_point = true;  // (b) where the attention chain's match ended
  int32_t every_blocks = 0;  // (c) every N blocks (0: off; 1: every block boundary)
  Eviction eviction = Eviction::kLru;

  // (a) + (b), LRU: the KvCacheManager's policy.
  static CheckpointPolicy pagedkv();
  // (a) + (b), priority classes: never hit, then shortest, first (measured, not taken).
  static CheckpointPolicy classes();
  static CheckpointPolicy every_block();  // every block boundary, LRU
  // A copy of `base` that also saves every `blocks` blocks, named after it.
  static CheckpointPolicy with_every(CheckpointPolicy base, int32_t blocks);
};

// The positions, ascending and distinct, where a sequence of `prompt_len` tokens saves its
// state: its hit ended at `hit_tokens` (it computes only what follows) and its match on the
// attention chain at `match_tokens` (both multiples of b).
std::vector<int64_t> admission_positions(int64_t prompt_len, int64_t match_tokens,
                                         int64_t hit_tokens, const CheckpointPolicy& policy,
                                         int32_t block_size);

// The bucket of a checkpoint at `position` under Eviction::kClasses (the smallest goes
// first within a class): floor(log2(position / b)).
int32_t checkpoint_bucket(int64_t position, int32_t block_size);

// The cached checkpoints of one state pool under a CheckpointPolicy: `capacity` slots (the
// running sequence's slot is not among them; < 0: unbounded). A new checkpoint takes a free
// slot, or the slot of the first cached one in eviction order.
class CheckpointCache {
 public:
  CheckpointCache(int64_t capacity, const CheckpointPolicy& policy, int32_t block_size);

  bool contains(uint64_t key) const { return entries_.contains(key); }
  // A hit: the checkpoint becomes the most recent (under kClasses, of its bucket in the hit
  // class).
  void hit(uint64_t key);
  // Saves a checkpoint at `position`; a cached one is only made the most recent.
  void save(uint64_t key, int64_t position);

  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  int64_t saved() const { return saved_; }
  int64_t evicted() const { return evicted_; }
  int64_t hit_class_peak() const { return hit_class_peak_; }

 private:
  struct Entry {
    int64_t position;
    int64_t hits;
    uint64_t stamp;  // last save or hit
  };
  // (class, bucket, stamp, key): the smallest is evicted first.
  using Rank = std::tuple<int32_t, int32_t, uint64_t, uint64_t>;

  Rank rank(uint64_t key, const Entry& e) const;
  void evict_one();

  int64_t capacity_;
  CheckpointPolicy policy_;
  int32_t block_size_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::set<Rank> order_;
  uint64_t clock_ = 0;
  int64_t saved_ = 0;
  int64_t evicted_ = 0;
  int64_t hit_class_ = 0;
  int64_t hit_class_peak_ = 0;
};

// What one replay hit.
struct StateReplayResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;        // claimed from the cache
  int64_t attention_tokens = 0;  // what the attention blocks alone held at each match
  int64_t hits = 0;              // requests with a hit
  int64_t checkpoints_saved = 0;
  int64_t checkpoints_evicted = 0;
  int64_t hit_class_peak = 0;  // most cached checkpoints that had been hit, at once

  int64_t recomputed_tokens() const { return prompt_tokens - hit_tokens; }
  double hit_rate() const {
    return prompt_tokens > 0 ? static_cast<double>(hit_tokens) / prompt_tokens : 0;
  }
};

// pagedkv's model: `attention_blocks` b-token blocks, `state_slots` slots (one runs the
// sequence, the rest hold checkpoints; < 0: unbounded, for the footprint).
// Errors: InvalidArgument for fewer than 2 slots or a prompt larger than the attention pool.
[[nodiscard]] absl::StatusOr<StateReplayResult> replay_pagedkv_state(const StateWorkload& workload,
                                                                     int64_t attention_blocks,
                                                                     int64_t state_slots,
                                                                     const CheckpointPolicy& policy,
                                                                     int32_t block_size);

// The vLLM-rule model on one pool of `pool_bytes`. Errors: InvalidArgument for a prompt
// larger than the pool.
[[nodiscard]] absl::StatusOr<StateReplayResult> replay_vllm_state(const StateWorkload& workload,
                                                                  const StateModel& model,
                                                                  int64_t pool_bytes,
                                                                  int32_t block_size);

// pagedkv's split of a budget between attention blocks and state slots:
// KvCacheConfig::split_budget() for `target_tokens`, each sequence with
// `checkpoints_per_sequence` cached checkpoints beside its running slot.
struct StateSplit {
  int64_t attention_blocks = 0;
  int64_t state_slots = 0;
};
[[nodiscard]] absl::StatusOr<StateSplit> split_state_budget(const StateModel& model,
                                                            int64_t budget_bytes,
                                                            int64_t target_tokens,
                                                            int32_t checkpoints_per_sequence);

// The study: per model and workload, pool sizes as fractions of the footprint (every
// distinct attention block plus every checkpoint pagedkv's admission keeps with nothing
// evicted), pagedkv's policy and its variants against the vLLM rule.
struct StateStudyOptions {
  std::vector<double> fractions = {1, 0.5, 0.25};
  // The first is pagedkv's policy: the ratio to the vLLM rule and the sensitivity use it.
  std::vector<CheckpointPolicy> policies = {
      CheckpointPolicy::pagedkv(), CheckpointPolicy::classes(), CheckpointPolicy::every_block(),
      CheckpointPolicy::with_every(CheckpointPolicy::pagedkv(), 64)};
  int32_t checkpoints_per_sequence = 2;  // KvCacheConfig's default
  // The sensitivity table: pagedkv's policy at these shares, at sensitivity_fraction.
  std::vector<int32_t> sensitivity = {0, 1, 2, 4, 8, 16};
  double sensitivity_fraction = 0.25;
  int32_t block_size = 16;
};

struct StateStudyRow {
  double fraction = 0;
  int64_t budget_bytes = 0;
  StateSplit split;
  bool fits = true;                         // the pools hold the longest prompt (else no replay)
  std::vector<StateReplayResult> policies;  // in the order of StateStudy::policy_names
  StateReplayResult vllm;
};

struct StateStudy {
  std::string model;
  std::string workload;
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t target_tokens = 0;
  int64_t footprint_blocks = 0;
  int64_t footprint_checkpoints = 0;
  int64_t footprint_bytes = 0;
  int32_t vllm_block_tokens = 0;
  StateReplayResult unbounded;  // pagedkv's policy with nothing evicted
  std::vector<std::string> policy_names;
  std::vector<StateStudyRow> rows;
  std::vector<std::pair<int32_t, StateReplayResult>> sensitivity;
};

[[nodiscard]] absl::StatusOr<StateStudy> state_study(const StateWorkload& workload,
                                                     const StateModel& model,
                                                     const StateStudyOptions& options);

std::string format_state_study(const StateStudy& study);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STATE_CACHE_H_
