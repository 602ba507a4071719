#include "state_study.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "pagedkv/capacity_plan.h"
#include "pagedkv/hf_model_config.h"
#include "report.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

constexpr uint64_t kConversationDomain = 0x434f4e5645525341ULL;  // "CONVERSA"
constexpr uint64_t kStateSystemDomain = 0x5354415445535953ULL;   // "STATESYS"

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `prompts` with their chain keys.
StateWorkload with_keys(Prompts prompts, int32_t block_size) {
  StateWorkload w{.prompts = std::move(prompts)};
  w.keys.reserve(static_cast<size_t>(w.prompts.size()));
  std::vector<TokenId> tokens;
  for (int64_t i = 0; i < w.prompts.size(); ++i) {
    w.prompts.tokens(i, tokens);
    w.keys.push_back(prompt_keys(tokens, block_size));
  }
  return w;
}

// Log-uniform integer in [lo, hi].
int32_t log_uniform(std::mt19937_64& rng, int32_t lo, int32_t hi) {
  std::uniform_real_distribution<double> u(std::log(lo), std::log(hi + 1.0));
  return std::clamp(static_cast<int32_t>(std::exp(u(rng))), lo, hi);
}

int64_t distinct_blocks(const StateWorkload& workload) {
  absl::flat_hash_set<uint64_t> seen;
  for (const PromptKeys& p : workload.keys) seen.insert(p.keys.begin(), p.keys.end());
  return static_cast<int64_t>(seen.size());
}

}  // namespace

// ---- Workloads ------------------------------------------------------------------------------

StateWorkload state_workload(const Trace& trace, int32_t block_size) {
  return with_keys(trace_prompts(trace), block_size);
}

StateWorkload shared_prompt_workload(const SharedPromptOptions& o, int32_t block_size) {
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> system(o.num_system_prompts);
  for (int32_t& s : system)
    s = std::uniform_int_distribution<int32_t>(o.system_min, o.system_max)(rng);
  // A turn's prompt: a system prompt (or none), then its conversation's first tokens.
  struct Turn {
    double time;
    int32_t conversation;
    int32_t prompt;  // tokens after the system prompt
    int32_t answer;
    int32_t system = -1;
    int32_t system_tokens = 0;
  };
  std::vector<Turn> turns;
  std::exponential_distribution<double> gap(1.0), turn_gap(1.0 / o.turn_gap);
  double start = 0;
  for (int32_t c = 0; c < o.conversations; ++c) {
    start += gap(rng);
    const bool none = std::uniform_real_distribution<double>(0, 1)(rng) < o.no_system_fraction;
    const int32_t s =
        none ? -1 : std::uniform_int_distribution<int32_t>(0, o.num_system_prompts - 1)(rng);
    const int32_t n = std::uniform_int_distribution<int32_t>(1, o.max_turns)(rng);
    double t = start;
    int32_t length = 0;
    for (int32_t k = 0; k < n; ++k) {
      length += log_uniform(rng, o.user_min, o.user_max);
      const int32_t answer = log_uniform(rng, o.answer_min, o.answer_max);
      turns.push_back({t, c, length, answer, s, s >= 0 ? system[s] : 0});
      length += answer;  // the next turn's prompt holds this answer
      t += turn_gap(rng);
    }
  }
  std::stable_sort(turns.begin(), turns.end(),
                   [](const Turn& a, const Turn& b) { return a.time < b.time; });
  Prompts prompts{.name = "generated-shared"};
  for (const Turn& turn : turns) {
    prompts.lengths.push_back(turn.system_tokens + turn.prompt);
    prompts.outputs.push_back(turn.answer);
  }
  prompts.tokens = [turns = std::move(turns)](int64_t i, std::vector<TokenId>& out) {
    const Turn& turn = turns[static_cast<size_t>(i)];
    out.clear();
    for (int32_t p = 0; p < turn.system_tokens; ++p)
      out.push_back(derive_token(kStateSystemDomain, turn.system, p));
    for (int32_t p = 0; p < turn.prompt; ++p)
      out.push_back(derive_token(kConversationDomain, turn.conversation, p));
  };
  return with_keys(std::move(prompts), block_size);
}

// ---- Models ---------------------------------------------------------------------------------

absl::StatusOr<StateModel> state_model(std::string name, const KvCacheConfig& config,
                                       int32_t vllm_block_tokens) {
  StateModel m{std::move(name), config};
  int64_t token_page = 0;  // one attention layer, one token
  int32_t attention_layers = 0, state_layers = 0;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const KvCacheGroup& group = config.groups[g];
    if (group.kind == AttentionKind::kFull) {
      m.attention_bytes_per_token += config.bytes_per_token(g);
      attention_layers += group.shape.num_layers;
      token_page = std::max(token_page, config.bytes_per_token(g) / group.shape.num_layers);
    } else if (group.kind == AttentionKind::kState) {
      m.slot_bytes += group.state.bytes();
      state_layers += group.state.num_layers;
    }
  }
  int32_t full_groups = 0, state_groups = 0;
  for (const KvCacheGroup& group : config.groups) {
    full_groups += group.kind == AttentionKind::kFull ? 1 : 0;
    state_groups += group.kind == AttentionKind::kState ? 1 : 0;
  }
  if (full_groups != 1 || state_groups != 1 || config.num_groups() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.name, ": the state study takes one full-attention and one state group, not ",
                     full_groups, " and ", state_groups, " of ", config.num_groups()));
  }
  if (attention_layers == 0 || state_layers == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.name, ": the state study needs full-attention and state groups (",
                     attention_layers, " attention and ", state_layers, " state layers)"));
  }
  if (vllm_block_tokens <= 0 || vllm_block_tokens % config.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(m.name, ": vLLM block of ", vllm_block_tokens,
                                                   " tokens, not a positive multiple of ",
                                                   config.block_size));
  }
  const int64_t page = vllm_block_tokens * token_page;
  for (const KvCacheGroup& group : config.groups) {
    if (group.kind == AttentionKind::kState && group.state.bytes_per_layer() > page) {
      return absl::InvalidArgumentError(absl::StrCat(
          m.name, ": vLLM block of ", vllm_block_tokens, " tokens holds ", page,
          " bytes per layer, less than a state layer's ", group.state.bytes_per_layer()));
    }
  }
  m.vllm = {.block_tokens = vllm_block_tokens,
            .state_bytes = state_layers * page,
            .block_bytes = attention_layers * page};
  return m;
}

namespace {

// The built-in models: a short name and its fixture directory.
constexpr std::pair<std::string_view, std::string_view> kStateModels[] = {
    {"qwen3-next-80b-a3b", "Qwen--Qwen3-Next-80B-A3B-Instruct"},
    {"nemotron-h-8b", "nvidia--Nemotron-H-8B-Base-8K"},
    {"granite-4.0-h-tiny", "ibm-granite--granite-4.0-h-tiny"},
};

}  // namespace

std::vector<std::string> builtin_state_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, dir] : kStateModels) names.emplace_back(name);
  return names;
}

absl::StatusOr<StateModel> builtin_state_model(std::string_view name) {
  for (const auto& [known, dir] : kStateModels) {
    if (known != name) continue;
    absl::StatusOr<HfModelConfig> hf =
        read_hf_config(absl::StrCat(PAGEDKV_FIXTURES_DIR, "/", std::string(dir), "/excerpt.json"));
    if (!hf.ok()) return hf.status();
    absl::StatusOr<int32_t> block = vllm_state_block_size(hf->kv);
    if (!block.ok()) return block.status();
    return state_model(std::string(name), hf->kv, *block);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown state model '", std::string(name),
                   "'; known: ", absl::StrJoin(builtin_state_model_names(), ", ")));
}

// ---- The manager's pools --------------------------------------------------------------------

absl::StatusOr<StateSplit> split_state_budget(const StateModel& model, int64_t budget_bytes,
                                              int64_t target_tokens,
                                              int32_t checkpoints_per_sequence) {
  KvCacheConfig config = model.config;
  config.checkpoints_per_sequence = checkpoints_per_sequence;
  absl::StatusOr<PoolSplit> split = config.split_budget(budget_bytes, target_tokens);
  if (!split.ok()) return split.status();
  StateSplit s;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    // state_model() allows one attention and one state group.
    (config.is_state(g) ? s.state_slots : s.attention_blocks) = split->groups[g].num_blocks;
  }
  return s;
}

absl::StatusOr<PrefixHits> replay_state_manager(const StateWorkload& workload,
                                                const StateSplit& split,
                                                const CheckpointPolicy& policy,
                                                int32_t block_size) {
  // The full-attention group first: allocate_slots() returns its slot mapping.
  const KvCacheManager::Options options{
      .block_size = block_size,
      .max_model_len = workload.prompts.longest(),
      .state_checkpoint_interval_blocks = policy.interval_blocks,
      .enable_prefix_caching = true,
      .layer_groups = {
          {.kind = AttentionKind::kFull,
           .num_blocks = static_cast<int32_t>(split.attention_blocks)},
          {.kind = AttentionKind::kState, .num_blocks = static_cast<int32_t>(split.state_slots)}}};
  return replay_prefix_hits(workload.prompts, options, /*chunk_tokens=*/0);
}

// ---- The study ------------------------------------------------------------------------------

absl::StatusOr<StateStudy> state_study(const StateWorkload& workload, const StateModel& model,
                                       const StateStudyOptions& options) {
  const int32_t b = options.block_size;
  const Prompts& prompts = workload.prompts;
  StateStudy study;
  study.model = model.name;
  study.workload = prompts.name;
  study.requests = prompts.size();
  study.prompt_tokens = prompts.total_tokens();
  study.target_tokens = median_request_tokens(prompts);
  study.vllm_block_tokens = model.vllm.block_tokens;
  const std::vector<CheckpointPolicy>& policies = options.policies;
  for (const CheckpointPolicy& p : policies) study.policy_names.push_back(p.name);
  const auto replay = [&](const StateSplit& split, const CheckpointPolicy& policy) {
    return replay_state_manager(workload, split, policy, b);
  };

  // Nothing evicted: an attention block per block of every prompt (a block recomputed while
  // its content is cached stays cached as a standby), and a slot per distinct block (a
  // checkpoint ends one) beside the running one.
  const int32_t longest = prompts.longest();
  study.footprint_blocks = distinct_blocks(workload);
  int64_t all_blocks = 0;
  for (int32_t length : prompts.lengths) all_blocks += ceil_div(length, b);
  absl::StatusOr<PrefixHits> unbounded = replay(
      {.attention_blocks = all_blocks, .state_slots = study.footprint_blocks + 1}, policies[0]);
  if (!unbounded.ok()) return unbounded.status();
  study.unbounded = *unbounded;
  study.footprint_checkpoints = unbounded->checkpoints_saved;
  study.footprint_bytes = study.footprint_blocks * b * model.attention_bytes_per_token +
                          study.footprint_checkpoints * model.slot_bytes;

  // Both must hold the longest prompt while it runs: its blocks, and for vLLM its running
  // state and the two boundary states it holds while writing the next.
  auto fits = [&](const StateSplit& split, int64_t budget) {
    const int64_t vllm_need = ceil_div(longest, model.vllm.block_tokens) * model.vllm.block_bytes +
                              3 * model.vllm.state_bytes;
    return split.attention_blocks >= ceil_div(longest, b) && split.state_slots >= 2 &&
           budget >= vllm_need;
  };
  for (double fraction : options.fractions) {
    StateStudyRow row;
    row.fraction = fraction;
    row.budget_bytes = static_cast<int64_t>(fraction * study.footprint_bytes);
    absl::StatusOr<StateSplit> split = split_state_budget(
        model, row.budget_bytes, study.target_tokens, options.checkpoints_per_sequence);
    if (!split.ok()) return split.status();
    row.split = *split;
    row.fits = fits(row.split, row.budget_bytes);
    if (row.fits) {
      for (const CheckpointPolicy& policy : policies) {
        absl::StatusOr<PrefixHits> r = replay(row.split, policy);
        if (!r.ok()) return r.status();
        row.policies.push_back(*r);
      }
      absl::StatusOr<PrefixHits> v =
          replay_vllm_state_rule(workload.keys, model.vllm, row.budget_bytes, b);
      if (!v.ok()) return v.status();
      row.vllm = *v;
    }
    study.rows.push_back(std::move(row));
  }
  const int64_t budget = static_cast<int64_t>(options.sensitivity_fraction * study.footprint_bytes);
  for (int32_t share : options.sensitivity) {
    absl::StatusOr<StateSplit> split =
        split_state_budget(model, budget, study.target_tokens, share);
    if (!split.ok()) return split.status();
    if (!fits(*split, budget)) continue;
    absl::StatusOr<PrefixHits> r = replay(*split, policies[0]);
    if (!r.ok()) return r.status();
    study.sensitivity.emplace_back(share, *r);
  }
  return study;
}

std::string format_state_study(const StateStudy& s) {
  std::string out = fmt::format(
      "State-layer prefix hits, {} on {} ({} requests, {} prompt tokens; split for {} tokens; "
      "footprint {} blocks + {} checkpoints = {:.0f} GiB; vLLM block {} tokens)\n",
      s.model, s.workload, commas(s.requests), commas(s.prompt_tokens), commas(s.target_tokens),
      commas(s.footprint_blocks), commas(s.footprint_checkpoints),
      s.footprint_bytes / double(int64_t{1} << 30), s.vllm_block_tokens);
  out += fmt::format("  unbounded: pagedkv hits {} ({:.3f}), attention alone holds {}\n",
                     commas(s.unbounded.hit_tokens), s.unbounded.hit_rate(),
                     commas(s.unbounded.full_hold_tokens));
  out += "| pool | GiB | blocks / slots |";
  for (const std::string& n : s.policy_names) out += fmt::format(" {} |", n);
  out += " vLLM rule | pagedkv / vLLM |\n|---:|---:|---|";
  for (size_t i = 0; i <= s.policy_names.size() + 1; ++i) out += "---:|";
  out += "\n";
  for (const StateStudyRow& row : s.rows) {
    out += fmt::format("| {:.0f} % | {:.0f} | {} / {} |", row.fraction * 100,
                       row.budget_bytes / double(int64_t{1} << 30),
                       commas(row.split.attention_blocks), commas(row.split.state_slots));
    if (!row.fits) {
      out += " a pool below the longest prompt |\n";
      continue;
    }
    for (const PrefixHits& r : row.policies)
      out += fmt::format(" {} ({:.3f}) |", commas(r.hit_tokens), r.hit_rate());
    out += fmt::format(" {} ({:.3f}) |", commas(row.vllm.hit_tokens), row.vllm.hit_rate());
    const double ratio = row.vllm.hit_tokens > 0
                             ? static_cast<double>(row.policies[0].hit_tokens) / row.vllm.hit_tokens
                             : INFINITY;
    out += fmt::format(" {:.2f} |\n", ratio);
  }
  out += "  recomputed tokens (pagedkv / vLLM rule):";
  for (const StateStudyRow& row : s.rows) {
    if (!row.fits) continue;
    out += fmt::format(" {:.0f} %: {} / {};", row.fraction * 100,
                       commas(row.policies[0].recomputed_tokens()),
                       commas(row.vllm.recomputed_tokens()));
  }
  out += "\n  pagedkv's hits by checkpoints per sequence in the split:";
  for (const auto& [share, r] : s.sensitivity)
    out += fmt::format(" {}: {:.3f};", share, r.hit_rate());
  out += "\n";
  return out;
}

}  // namespace pagedkv::sim
