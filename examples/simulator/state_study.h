// File: examples/simulator/state_study.h
//
// The state-layer prefix-hit study (docs/results.md, "State-space layers"): hybrid models
// whose state layers (Mamba2, Gated DeltaNet) keep one fixed-size state per sequence. A
// prefix hit of p tokens needs the attention blocks up to p and a checkpoint (a copy of the
// state) at exactly p. Requests are replayed one at a time (prefix_replay.h) at the same byte
// budget through
//
//   pagedkv   a KvCacheManager with a full-attention group of 16-token blocks and a state
//             group of state slots (layer_group.h kState): one slot for the running
//             sequence, the rest checkpoints, saved where the manager saves them (the prompt's
//             last full block, the branch point of its match, and with
//             Options::state_checkpoint_interval_blocks every that many blocks) and evicted
//             in LRU order;
//   vLLM rule the model of vLLM's rule (studies/vllm_state_rule.h): one shared pool of
//             attention blocks of hundreds to thousands of tokens and a state at each.
//
// Glossary: b = 16 tokens, the hash block; "position" p is a token count, always a
// multiple of b; a checkpoint at p is the state after the first p tokens.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_STATE_STUDY_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_STATE_STUDY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pagedkv/kv_cache_config.h"
#include "prefix_replay.h"
#include "studies/vllm_state_rule.h"
#include "trace.h"

namespace pagedkv::sim {

// A workload's prompts, as token ids for the manager and as chain keys for the vLLM rule
// and the footprint.
struct StateWorkload {
  Prompts prompts;
  std::vector<PromptKeys> keys = {};  // one per prompt, at the study's block size
};

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

// What the study needs of a model: its attention KV per token (the full-attention group),
// one state slot (the state group), and vLLM's page-unified sizes.
struct StateModel {
  std::string name;
  KvCacheConfig config;
  int64_t attention_bytes_per_token = 0;
  int64_t slot_bytes = 0;  // one sequence's state in every state layer
  VllmStateSizes vllm = {};
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

// Where the manager saves checkpoints besides the prompt's last full block and the branch
// point: every `interval_blocks` blocks (KvCacheManager::Options::
// state_checkpoint_interval_blocks; 0: nowhere else, 1: every block boundary).
struct CheckpointPolicy {
  std::string name;
  int32_t interval_blocks = 0;
};

// The workload through a KvCacheManager with `split` (a full-attention group, then a state
// group), saving checkpoints by `policy`. Errors: the manager's, naming the request
// (InvalidArgument for a pool too small for a prompt).
[[nodiscard]] absl::StatusOr<PrefixHits> replay_state_manager(const StateWorkload& workload,
                                                              const StateSplit& split,
                                                              const CheckpointPolicy& policy,
                                                              int32_t block_size);

// The study: per model and workload, pool sizes as fractions of the footprint (every
// distinct attention block plus every checkpoint the manager saves with nothing evicted),
// the manager's checkpoint policies against the vLLM rule.
struct StateStudyOptions {
  std::vector<double> fractions = {1, 0.5, 0.25};
  // The first is the manager's default: the ratio to the vLLM rule and the sensitivity use it.
  std::vector<CheckpointPolicy> policies = {{.name = "pagedkv", .interval_blocks = 0},
                                            {.name = "every block", .interval_blocks = 1},
                                            {.name = "pagedkv + every 64", .interval_blocks = 64}};
  int32_t checkpoints_per_sequence = 2;  // KvCacheConfig's default
  // The sensitivity table: the default policy at these shares, at sensitivity_fraction.
  std::vector<int32_t> sensitivity = {0, 1, 2, 4, 8, 16};
  double sensitivity_fraction = 0.25;
  int32_t block_size = 16;
};

struct StateStudyRow {
  double fraction = 0;
  int64_t budget_bytes = 0;
  StateSplit split;
  bool fits = true;                  // the pools hold the longest prompt (else no replay)
  std::vector<PrefixHits> policies;  // in the order of StateStudy::policy_names
  PrefixHits vllm;
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
  PrefixHits unbounded;  // the default policy with nothing evicted
  std::vector<std::string> policy_names;
  std::vector<StateStudyRow> rows;
  std::vector<std::pair<int32_t, PrefixHits>> sensitivity;
};

[[nodiscard]] absl::StatusOr<StateStudy> state_study(const StateWorkload& workload,
                                                     const StateModel& model,
                                                     const StateStudyOptions& options);

std::string format_state_study(const StateStudy& study);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_STATE_STUDY_H_
