#include "hybrid.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "pagedkv/capacity_plan.h"
#include "pagedkv/kv_cache_manager.h"
#include "report.h"
#include "sim_allocator.h"
#include "studies/vllm_hybrid_rule.h"
#include "tokens.h"

namespace pagedkv::sim {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1 << 30); }

std::string group_name(const LayerGroup& g) {
  return g.kind == AttentionKind::kFull ? std::string("full")
                                        : absl::StrCat(attention_kind_name(g.kind), " ", g.window);
}

std::string pools_text(std::span<const LayerGroup> groups) {
  std::vector<std::string> parts;
  for (const LayerGroup& g : groups)
    parts.push_back(absl::StrCat(group_name(g), ": ", commas(g.num_blocks)));
  return absl::StrJoin(parts, ", ");
}

double ratio(int64_t a, int64_t b) {
  return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
}

}  // namespace

HybridModel gemma3_27b() {
  const KvCacheSpec layer{.num_layers = 0, .num_kv_heads = 16, .head_dim = 128};
  KvCacheSpec sliding = layer, full = layer;
  sliding.num_layers = 52;
  full.num_layers = 10;
  return {.name = "gemma-3-27b",
          .config = {
              .groups = {{.kind = AttentionKind::kSlidingWindow, .window = 1024, .shape = sliding},
                         {.kind = AttentionKind::kFull, .shape = full}},
              .dtype = DType::kBFloat16,
              .block_size = 16}};
}

HybridModel gpt_oss_120b() {
  const KvCacheSpec layer{.num_layers = 18, .num_kv_heads = 8, .head_dim = 64};
  return {
      .name = "gpt-oss-120b",
      .config = {.groups = {{.kind = AttentionKind::kSlidingWindow, .window = 128, .shape = layer},
                            {.kind = AttentionKind::kFull, .shape = layer}},
                 .dtype = DType::kBFloat16,
                 .block_size = 16}};
}

absl::StatusOr<HybridModel> hybrid_model(std::string_view name) {
  for (HybridModel m : {gemma3_27b(), gpt_oss_120b()}) {
    if (m.name == name) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown hybrid model \"", std::string(name),
                                                 "\"; known: gemma-3-27b, gpt-oss-120b"));
}

absl::StatusOr<KvCacheConfig> full_treatment(const KvCacheConfig& config) {
  if (config.groups.empty()) return absl::InvalidArgumentError("full_treatment: no groups");
  KvCacheSpec shape = config.groups[0].shape;
  for (const KvCacheGroup& g : config.groups) {
    if (g.shape.num_kv_heads != shape.num_kv_heads || g.shape.head_dim != shape.head_dim ||
        g.shape.latent != shape.latent) {
      return absl::InvalidArgumentError(
          "full_treatment: the groups' layers differ in KV shape; treat each as full apart");
    }
  }
  shape.num_layers = config.num_layers();
  return KvCacheConfig{.groups = {{.kind = AttentionKind::kFull, .shape = shape}},
                       .dtype = config.dtype,
                       .block_size = config.block_size};
}

KvCacheManager::Options hit_study_manager_options(std::span<const LayerGroup> groups,
                                                  const HybridStudyOptions& options,
                                                  int32_t longest) {
  return {.block_size = options.block_size,
          .max_model_len = longest,
          .window_checkpoint_tokens = options.checkpoint_tokens,
          .window_checkpoint_levels = options.checkpoint_levels,
          .enable_prefix_caching = true,
          .layer_groups = std::vector<LayerGroup>(groups.begin(), groups.end())};
}

namespace {

// vLLM's KV cache groups of `config` at `budget_bytes` as the vLLM-rule model takes them
// (kind and window, in vLLM's order), and its pool. Errors: InvalidArgument when vLLM's
// blocks are not `block_size` tokens or its pool does not fit int32.
struct VllmPool {
  std::vector<LayerGroup> groups = {};
  int64_t usable_blocks = 0;  // its pool less block 0, vLLM's null block
  std::string grouping = {};  // in words
};

absl::StatusOr<VllmPool> vllm_pool(const HybridModel& model, int64_t budget_bytes,
                                   int64_t target_tokens, int32_t block_size) {
  const KvCacheConfig& config = model.config;
  const VllmGrouping vllm = vllm_grouping(config, budget_bytes, target_tokens);
  VllmPool pool{.usable_blocks = vllm.num_blocks - 1};
  std::vector<std::string> layers;
  for (const VllmKvCacheGroup& g : vllm.groups) {
    if (g.block_size != block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("hit study: vLLM's groups of ", model.name, " have ", g.block_size,
                       "-token blocks; the study replays ", block_size));
    }
    const KvCacheGroup& source = config.groups[static_cast<size_t>(g.source_group)];
    pool.groups.push_back({.kind = source.kind, .window = source.window});
    layers.push_back(std::to_string(g.num_layers));
  }
  if (pool.usable_blocks < 1 || pool.usable_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("hit study: vLLM pool of ", vllm.num_blocks, " blocks"));
  }
  pool.grouping = absl::StrCat(vllm.groups.size(), " KV cache groups of ", vllm.group_size,
                               " layers (real layers ", absl::StrJoin(layers, "/"), ")");
  return pool;
}

}  // namespace

absl::StatusOr<HybridHitStudy> hybrid_hit_study(const Trace& trace, const HybridModel& model,
                                                const HybridStudyOptions& options) {
  const KvCacheConfig& config = model.config;
  if (config.block_size != options.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("hit study: block size ", options.block_size,
                                                   " against the model's ", config.block_size));
  }
  absl::StatusOr<HitStreams> streams = hit_streams(trace, options.block_size);
  if (!streams.ok()) return streams.status();
  HybridHitStudy study;
  study.model = model.name;
  study.trace = trace.name;
  study.requests = static_cast<int64_t>(trace.requests.size());
  study.footprint_blocks = streams->num_ids;
  study.footprint_bytes = int64_t{streams->num_ids} * options.block_size * config.bytes_per_token();
  study.cached_tokens = study.footprint_blocks * options.block_size;
  study.chunk_tokens = options.chunk_tokens;
  study.checkpoint_tokens = options.checkpoint_tokens;
  study.checkpoint_levels = options.checkpoint_levels;
  const Prompts prompts = trace_prompts(trace);
  study.target_tokens = median_request_tokens(prompts);
  // The manager on pools `groups`.
  const auto replay_manager = [&](const std::vector<LayerGroup>& groups) {
    return replay_prefix_hits(prompts,
                              hit_study_manager_options(groups, options, prompts.longest()),
                              options.chunk_tokens);
  };
  for (double fraction : options.fractions) {
    HybridHitRow row;
    row.fraction = fraction;
    row.budget_bytes =
        static_cast<int64_t>(std::llround(fraction * static_cast<double>(study.footprint_bytes)));
    absl::StatusOr<PoolSplit> split = config.split_budget(row.budget_bytes, study.target_tokens);
    if (!split.ok()) return split.status();
    row.groups = split->groups;
    split = config.split_budget(row.budget_bytes, study.target_tokens, study.cached_tokens);
    if (!split.ok()) return split.status();
    row.cache_groups = split->groups;
    absl::StatusOr<VllmPool> vllm =
        vllm_pool(model, row.budget_bytes, study.target_tokens, options.block_size);
    if (!vllm.ok()) return vllm.status();
    row.vllm_blocks = vllm->usable_blocks;
    study.vllm_grouping = vllm->grouping;
    absl::StatusOr<PrefixHits> hits = replay_manager(row.groups);
    if (!hits.ok()) return hits.status();
    row.manager = *std::move(hits);
    hits = replay_manager(row.cache_groups);
    if (!hits.ok()) return hits.status();
    row.cache_manager = *std::move(hits);
    hits = replay_vllm_hybrid_rule(*streams, static_cast<int32_t>(vllm->usable_blocks),
                                   vllm->groups, options.chunk_tokens);
    if (!hits.ok()) return hits.status();
    row.vllm = *std::move(hits);
    study.rows.push_back(std::move(row));
  }
  return study;
}

int64_t chunk_headroom_blocks(int32_t window, int32_t chunk, int32_t block_size) {
  return (int64_t{chunk} + block_size - 1) / block_size +
         (window - 1 + block_size - 1) / block_size + 1;
}

absl::StatusOr<std::vector<LayerGroup>> split_with_chunk_headroom(const KvCacheConfig& config,
                                                                  int64_t budget_bytes,
                                                                  int64_t target_tokens,
                                                                  int32_t chunk) {
  std::vector<int64_t> extra(config.groups.size(), 0);
  int64_t extra_bytes = 0;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const KvCacheGroup& group = config.groups[static_cast<size_t>(g)];
    if (group.kind == AttentionKind::kFull) continue;
    extra[static_cast<size_t>(g)] = chunk_headroom_blocks(group.window, chunk, config.block_size);
    extra_bytes += extra[static_cast<size_t>(g)] * config.page_bytes(g);
  }
  absl::StatusOr<PoolSplit> split = config.split_budget(budget_bytes - extra_bytes, target_tokens);
  if (!split.ok()) return split.status();
  std::vector<LayerGroup> groups = split->groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].num_blocks = static_cast<int32_t>(groups[g].num_blocks + extra[g]);
  }
  return groups;
}

absl::StatusOr<HybridUtilRun> hybrid_util_run(const Trace& trace, const HybridModel& model,
                                              int64_t budget_bytes, int32_t max_model_len,
                                              const HybridStudyOptions& options,
                                              const EngineOptions& engine) {
  HybridUtilRun run;
  run.trace = trace.name;
  run.model = model.name;
  run.requests = static_cast<int64_t>(trace.requests.size());
  run.budget_bytes = budget_bytes;
  run.target_tokens = std::min<int64_t>(median_request_tokens(trace_prompts(trace)), max_model_len);
  absl::StatusOr<KvCacheConfig> full = full_treatment(model.config);
  if (!full.ok()) return full.status();
  EngineOptions chunked = engine;
  chunked.chunked_prefill = options.chunk_tokens > 0;
  if (options.chunk_tokens > 0) chunked.max_prefill_tokens = options.chunk_tokens;
  chunked.kv_bytes_per_token = model.config.bytes_per_token();
  auto replay = [&](const KvCacheConfig& pools, const std::vector<LayerGroup>& groups,
                    const char* name) -> absl::StatusOr<EngineResult> {
    AllocatorSetup setup;
    setup.config = {.kind = AllocatorKind::kPaged, .block_size = model.config.block_size};
    setup.budget_tokens = budget_bytes / model.config.bytes_per_token();
    setup.max_model_len = max_model_len;
    setup.hybrid = HybridPools{
        .groups = groups, .pools = pools, .model = model.config, .budget_bytes = budget_bytes};
    absl::StatusOr<EngineResult> result = run_engine(trace, setup, chunked);
    if (result.ok()) result->allocator = name;
    return result;
  };
  absl::StatusOr<PoolSplit> split = model.config.split_budget(budget_bytes, run.target_tokens);
  if (!split.ok()) return split.status();
  run.groups = split->groups;
  absl::StatusOr<EngineResult> result = replay(model.config, run.groups, "hybrid pools");
  if (!result.ok()) return result.status();
  run.hybrid = *std::move(result);
  if (options.chunk_tokens > 0) {
    absl::StatusOr<std::vector<LayerGroup>> headroom = split_with_chunk_headroom(
        model.config, budget_bytes, run.target_tokens, options.chunk_tokens);
    if (!headroom.ok()) return headroom.status();
    run.headroom_groups = *std::move(headroom);
    result = replay(model.config, run.headroom_groups, "+ chunk headroom");
    if (!result.ok()) return result.status();
    run.headroom = *std::move(result);
  }
  absl::StatusOr<PoolSplit> full_split = full->split_budget(budget_bytes, run.target_tokens);
  if (!full_split.ok()) return full_split.status();
  run.full_blocks = full_split->groups[0].num_blocks;
  result = replay(*full, full_split->groups, "every layer full");
  if (!result.ok()) return result.status();
  run.full = *std::move(result);
  return run;
}

std::string format_hybrid_hit_study(const HybridHitStudy& s) {
  std::string out = fmt::format(
      "Hybrid prefix hits, {} on {} ({} requests; footprint {} blocks of 16 tokens in every group "
      "= {:.1f} GiB; pools split for {} tokens; prefill chunks of {} tokens; windowed "
      "checkpoints every {} tokens, {} levels; vLLM: {}). Hit tokens, their ratio to what the "
      "full-attention groups hold at each match, and the hits a windowed group cut short:\n",
      s.model, s.trace, commas(s.requests), commas(s.footprint_blocks), gib(s.footprint_bytes),
      commas(s.target_tokens), commas(s.chunk_tokens), commas(s.checkpoint_tokens),
      s.checkpoint_levels, s.vllm_grouping);
  out += fmt::format("{:>6} {:>8} {:>32} {:>10} | {:>11} {:>5} {:>5} | {:>11} {:>5} | {}\n", "pool",
                     "GiB", "pagedkv pools (blocks)", "vLLM blocks", "manager", "ratio", "cut",
                     "vLLM rule", "ratio", "manager/vLLM");
  for (const HybridHitRow& r : s.rows) {
    out += fmt::format(
        "{:>5.1f}% {:>8.1f} {:>32} {:>10} | {:>11} {:>5.3f} {:>5} | {:>11} {:>5.3f} | {:.3f}\n",
        100 * r.fraction, gib(r.budget_bytes), pools_text(r.groups), commas(r.vllm_blocks),
        commas(r.manager.hit_tokens), r.manager.of_full_hold(), r.manager.cut_hits,
        commas(r.vllm.hit_tokens), r.vllm.of_full_hold(),
        ratio(r.manager.hit_tokens, r.vllm.hit_tokens));
  }
  out += fmt::format(
      "The split counting the prefix cache ({} cached tokens, the footprint): the manager's hit "
      "tokens and their ratio to its full hold and to the vLLM rule:\n{:>6} {:>32} | {:>11} "
      "{:>5} | {}\n",
      commas(s.cached_tokens), "pool", "pagedkv pools (blocks)", "manager", "ratio",
      "manager/vLLM");
  for (const HybridHitRow& r : s.rows) {
    out += fmt::format("{:>5.1f}% {:>32} | {:>11} {:>5.3f} | {:.3f}\n", 100 * r.fraction,
                       pools_text(r.cache_groups), commas(r.cache_manager.hit_tokens),
                       r.cache_manager.of_full_hold(),
                       ratio(r.cache_manager.hit_tokens, r.vllm.hit_tokens));
  }
  return out;
}

std::string format_hybrid_util_runs(const std::vector<HybridUtilRun>& runs) {
  std::string out;
  for (const HybridUtilRun& run : runs) {
    out += fmt::format(
        "{} on {}: {} requests, budget {:.2f} GiB, pools split for {} tokens: hybrid {}; with "
        "chunk headroom {}; every layer full: {} blocks\n",
        run.model, run.trace, commas(run.requests), gib(run.budget_bytes),
        commas(run.target_tokens), pools_text(run.groups), pools_text(run.headroom_groups),
        commas(run.full_blocks));
    out += fmt::format("{:<18} {:>9} {:>9} {:>9} {:>6} {:>7} {:>8} {:>8} {:>7} {:>8}\n", "pools",
                       "need/held", "held/bud", "need/bud", "peak", "mean", "req/s", "latency",
                       "preempt", "rejected");
    for (const EngineResult* r : {&run.hybrid, &run.headroom, &run.full}) {
      if (r->allocator.empty()) continue;
      out += fmt::format(
          "{:<18} {:>9.3f} {:>9.3f} {:>9.3f} {:>6} {:>7.1f} {:>8.3f} {:>7.1f}s {:>7} {:>8}\n",
          r->allocator, r->mean_utilization, r->mean_reserved, r->mean_memory_use,
          r->peak_concurrency, r->mean_concurrency, r->throughput_rps, r->mean_latency_s,
          r->preemptions, r->rejected);
    }
  }
  return out;
}

}  // namespace pagedkv::sim
