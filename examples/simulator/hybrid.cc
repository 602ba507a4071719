#include "hybrid.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "pagedkv/block_hash.h"
#include "pagedkv/capacity_plan.h"
#include "pagedkv/kv_cache_manager.h"
#include "report.h"
#include "sim_allocator.h"
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

// The same groups with the full-attention ones listed first.
std::vector<LayerGroup> full_first(std::span<const LayerGroup> groups) {
  std::vector<LayerGroup> out(groups.begin(), groups.end());
  std::stable_partition(out.begin(), out.end(),
                        [](const LayerGroup& g) { return g.kind == AttentionKind::kFull; });
  return out;
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

int64_t median_request_tokens(const Trace& trace) {
  if (trace.requests.empty()) return 0;
  std::vector<int64_t> lengths;
  lengths.reserve(trace.requests.size());
  for (const Request& r : trace.requests)
    lengths.push_back(int64_t{r.input_length} + r.output_length);
  std::sort(lengths.begin(), lengths.end());
  // Nearest rank: the ceil(0.5 n)-th smallest.
  return lengths[(lengths.size() + 1) / 2 - 1];
}

absl::StatusOr<HitReplayResult> replay_manager_hits(const Trace& trace,
                                                    std::span<const LayerGroup> groups,
                                                    int32_t block_size, int32_t chunk_tokens,
                                                    int32_t checkpoint_tokens,
                                                    int32_t checkpoint_levels) {
  int32_t longest = 1;
  for (const Request& r : trace.requests) longest = std::max(longest, r.input_length);
  absl::StatusOr<KvCacheManager> created = KvCacheManager::create(
      {.block_size = block_size,
       .max_model_len = longest,
       .window_checkpoint_tokens = checkpoint_tokens,
       .window_checkpoint_levels = checkpoint_levels,
       .enable_prefix_caching = true,
       .layer_groups = std::vector<LayerGroup>(groups.begin(), groups.end())});
  if (!created.ok()) return created.status();
  KvCacheManager& m = *created;
  int32_t anchor = 0;
  while (anchor < m.num_groups() && m.layer_group(anchor)->kind != AttentionKind::kFull) ++anchor;
  if (anchor == m.num_groups()) return absl::InvalidArgumentError("no full-attention group");
  const BlockPool& anchor_pool = **m.device_pool(anchor);
  HitReplayResult result;
  std::vector<BlockHash> hashes;
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const Request& req = trace.requests[r];
    const std::vector<TokenId> prompt = prompt_tokens(req, static_cast<int64_t>(r));
    const auto id = static_cast<SeqId>(r);
    if (absl::Status s = m.add_sequence(id, prompt); !s.ok()) return s;
    // What the full groups hold: the first full group's verified chain, as match_prefix
    // walks it (the other full groups hold at least as much on this replay).
    const int32_t max_blocks = (req.input_length - 1) / block_size;
    hashes.resize(static_cast<size_t>(max_blocks));
    int32_t hold = 0;
    BlockId parent = kNoBlock;
    for (; hold < max_blocks; ++hold) {
      const auto tokens = std::span<const TokenId>(prompt).subspan(
          static_cast<size_t>(hold) * block_size, static_cast<size_t>(block_size));
      hashes[hold] = hash_block(hold == 0 ? nullptr : &hashes[hold - 1], tokens, {});
      absl::StatusOr<BlockId> b = anchor_pool.find_cached(hashes[hold], parent, tokens, {});
      if (!b.ok()) return b.status();
      if (*b == kNoBlock) break;
      parent = *b;
    }
    absl::StatusOr<int32_t> hit = m.match_prefix(id);
    if (!hit.ok()) return hit.status();
    result.prompt_tokens += req.input_length;
    result.hit_tokens += *hit;
    result.full_hold_tokens += int64_t{hold} * block_size;
    result.cut_hits += *hit < hold * block_size;
    for (int32_t c = *hit; c < req.input_length;) {
      const int32_t n =
          chunk_tokens > 0 ? std::min(chunk_tokens, req.input_length - c) : req.input_length - c;
      absl::StatusOr<std::span<const int64_t>> slots = m.allocate_slots(id, n);
      if (!slots.ok()) {
        return absl::Status(slots.status().code(), absl::StrCat("manager replay, request ", r, ": ",
                                                                slots.status().message()));
      }
      (void)m.take_step_ops();
      c += n;
    }
    if (absl::Status s = m.free(id); !s.ok()) return s;
  }
  result.requests = static_cast<int64_t>(trace.requests.size());
  for (int32_t g = 0; g < m.num_groups(); ++g)
    result.evictions.push_back(m.group_stats(g)->evictions);
  return result;
}

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
  study.target_tokens = median_request_tokens(trace);
  study.footprint_blocks = streams->num_ids;
  study.footprint_bytes = int64_t{streams->num_ids} * options.block_size * config.bytes_per_token();
  study.cached_tokens = study.footprint_blocks * options.block_size;
  study.chunk_tokens = options.chunk_tokens;
  study.checkpoint_tokens = options.checkpoint_tokens;
  study.checkpoint_levels = options.checkpoint_levels;
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
    const VllmGrouping vllm = vllm_grouping(config, row.budget_bytes, study.target_tokens);
    std::vector<LayerGroup> vllm_groups;
    for (const VllmKvCacheGroup& g : vllm.groups) {
      const KvCacheGroup& source = config.groups[static_cast<size_t>(g.source_group)];
      if (g.block_size != options.block_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("hit study: vLLM's groups of ", model.name, " have ", g.block_size,
                         "-token blocks; the model replays ", options.block_size));
      }
      vllm_groups.push_back({.kind = source.kind, .window = source.window});
    }
    if (study.vllm_grouping.empty()) {
      std::vector<std::string> layers;
      for (const VllmKvCacheGroup& g : vllm.groups) layers.push_back(std::to_string(g.num_layers));
      study.vllm_grouping =
          absl::StrCat(vllm.groups.size(), " KV cache groups of ", vllm.group_size,
                       " layers (real layers ", absl::StrJoin(layers, "/"), ")");
    }
    row.vllm_blocks = vllm.num_blocks - 1;  // block 0 is vLLM's null block
    if (row.vllm_blocks < 1 || row.vllm_blocks > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("hit study: vLLM pool of ", vllm.num_blocks, " blocks"));
    }
    if (options.manager) {
      absl::StatusOr<HitReplayResult> manager =
          replay_manager_hits(trace, row.groups, options.block_size, options.chunk_tokens,
                              options.checkpoint_tokens, options.checkpoint_levels);
      if (!manager.ok()) return manager.status();
      row.manager = *std::move(manager);
      manager = replay_manager_hits(trace, full_first(row.groups), options.block_size,
                                    options.chunk_tokens, options.checkpoint_tokens,
                                    options.checkpoint_levels);
      if (!manager.ok()) return manager.status();
      row.manager_fixed = *std::move(manager);
      manager =
          replay_manager_hits(trace, row.cache_groups, options.block_size, options.chunk_tokens,
                              options.checkpoint_tokens, options.checkpoint_levels);
      if (!manager.ok()) return manager.status();
      row.cache_manager = *std::move(manager);
      row.has_manager = true;
    }
    const int32_t chunk = options.chunk_tokens;
    auto replay = [&](const HybridReplayOptions& o, CutAnalysis* analysis) {
      return replay_pagedkv_model(*streams, row.groups, o, analysis);
    };
    absl::StatusOr<HitReplayResult> modelled = replay({.chunk_tokens = chunk}, &row.analysis);
    if (!modelled.ok()) return modelled.status();
    row.lru = *std::move(modelled);
    modelled = replay({.chunk_tokens = chunk, .anchor_cached_first = true}, &row.fixed_analysis);
    if (!modelled.ok()) return modelled.status();
    row.fixed = *std::move(modelled);
    const HybridReplayOptions proposed =
        HybridReplayOptions::proposed(chunk, options.checkpoint_tokens, options.checkpoint_levels);
    modelled = replay(proposed, &row.proposed_analysis);
    if (!modelled.ok()) return modelled.status();
    row.proposed = *std::move(modelled);
    modelled = replay_pagedkv_model(*streams, row.cache_groups, proposed, nullptr);
    if (!modelled.ok()) return modelled.status();
    row.cache_proposed = *std::move(modelled);
    // The ablation: the proposed rule's parts one after another, then the rule without
    // each of two of them.
    HybridReplayOptions classes = proposed;
    classes.checkpoint_tokens = 0;
    classes.replace_stale = classes.uncache_dead_windows = false;
    HybridReplayOptions stale = classes;
    stale.replace_stale = stale.uncache_dead_windows = true;
    HybridReplayOptions fresh = proposed;
    fresh.replace_stale = fresh.uncache_dead_windows = false;
    HybridReplayOptions unfixed = proposed;
    unfixed.anchor_cached_first = false;
    row.ablation.push_back({"LRU (the manager before the rule)", row.lru});
    row.ablation.push_back({"+ anchor cached first", row.fixed});
    for (const auto& [name, o] :
         {std::pair<std::string, HybridReplayOptions>{"+ branch-point class", classes},
          {"+ stale copies replaced, dead windows uncached", stale}}) {
      modelled = replay(o, nullptr);
      if (!modelled.ok()) return modelled.status();
      row.ablation.push_back({name, *std::move(modelled)});
    }
    row.ablation.push_back(
        {absl::StrCat("+ checkpoints every ", commas(options.checkpoint_tokens), " tokens, ",
                      options.checkpoint_levels, " levels (the manager)"),
         row.proposed});
    for (const auto& [name, o] :
         {std::pair<std::string, HybridReplayOptions>{
              "proposed without stale copies replaced, dead windows", fresh},
          {"proposed without the anchor-first fix", unfixed}}) {
      modelled = replay(o, nullptr);
      if (!modelled.ok()) return modelled.status();
      row.ablation.push_back({name, *std::move(modelled)});
    }
    modelled = replay_vllm_model(*streams, static_cast<int32_t>(row.vllm_blocks), vllm_groups,
                                 options.chunk_tokens);
    if (!modelled.ok()) return modelled.status();
    row.vllm = *std::move(modelled);
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
  run.target_tokens = std::min<int64_t>(median_request_tokens(trace), max_model_len);
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
      "= {:.1f} GiB; pools split for {} tokens; prefill chunks of {} tokens; vLLM: {}). Hit "
      "tokens, and their ratio to what the full-attention groups hold at each match:\n",
      s.model, s.trace, commas(s.requests), commas(s.footprint_blocks), gib(s.footprint_bytes),
      commas(s.target_tokens), commas(s.chunk_tokens), s.vllm_grouping);
  out += fmt::format(
      "{:>6} {:>8} {:>32} {:>10} | {:>11} {:>5} | {:>11} {:>5} | {:>11} {:>5} | "
      "{:>11} {:>5} | {:>7} | {}\n",
      "pool", "GiB", "pagedkv pools (blocks)", "vLLM blocks", "LRU", "ratio", "anchor 1st", "ratio",
      "manager", "ratio", "vLLM rule", "ratio", "mgr/vLLM", "model = manager");
  // Whether the manager hit exactly what its model predicted.
  const auto same = [](const HitReplayResult& a, const HitReplayResult& b) {
    return a.hit_tokens == b.hit_tokens && a.full_hold_tokens == b.full_hold_tokens;
  };
  for (const HybridHitRow& r : s.rows) {
    // The manager's rule is the proposed one; without a manager run, its model stands in.
    const HitReplayResult& manager = r.has_manager ? r.manager : r.proposed;
    out += fmt::format(
        "{:>5.1f}% {:>8.1f} {:>32} {:>10} | {:>11} {:>5.3f} | {:>11} {:>5.3f} | {:>11} {:>5.3f} | "
        "{:>11} {:>5.3f} | {:>7.3f} | {}\n",
        100 * r.fraction, gib(r.budget_bytes), pools_text(r.groups), commas(r.vllm_blocks),
        commas(r.lru.hit_tokens), r.lru.of_full_hold(), commas(r.fixed.hit_tokens),
        r.fixed.of_full_hold(), commas(manager.hit_tokens), manager.of_full_hold(),
        commas(r.vllm.hit_tokens), r.vllm.of_full_hold(),
        ratio(manager.hit_tokens, r.vllm.hit_tokens),
        r.has_manager
            ? (same(r.manager, r.proposed) && same(r.manager_fixed, r.proposed) ? "yes" : "NO")
            : "not run");
  }
  out += fmt::format(
      "The split counting the prefix cache ({} cached tokens, the footprint): the manager's "
      "rule, hit tokens and their ratio to the full hold and to the vLLM rule:\n{:>6} {:>32} "
      "| {:>11} {:>5} | {:>7} | {}\n",
      commas(s.cached_tokens), "pool", "pagedkv pools (blocks)", "manager", "ratio", "mgr/vLLM",
      "model = manager");
  for (const HybridHitRow& r : s.rows) {
    const HitReplayResult& manager = r.has_manager ? r.cache_manager : r.cache_proposed;
    out += fmt::format("{:>5.1f}% {:>32} | {:>11} {:>5.3f} | {:>7.3f} | {}\n", 100 * r.fraction,
                       pools_text(r.cache_groups), commas(manager.hit_tokens),
                       manager.of_full_hold(), ratio(manager.hit_tokens, r.vllm.hit_tokens),
                       !r.has_manager                            ? "not run"
                       : same(r.cache_manager, r.cache_proposed) ? "yes"
                                                                 : "NO");
  }
  out += "The proposed rule built up (hit tokens / full hold):\n";
  if (!s.rows.empty()) {
    for (size_t v = 0; v < s.rows[0].ablation.size(); ++v) {
      out += fmt::format("  {:<48}", s.rows[0].ablation[v].name);
      for (const HybridHitRow& r : s.rows) {
        out += fmt::format(" {:>5.1f}%: {:.3f}", 100 * r.fraction,
                           r.ablation[v].result.of_full_hold());
      }
      out += "\n";
    }
  }
  out +=
      "Where hits are lost (models), per pool: cut hits and tokens lost; the cut hit points "
      "(prompt end / known branch / new branch); the missing window block (released "
      "mid-prompt / at free / never cached or stale), median requests since its eviction; "
      "window pool evictions (mid / at free) and mean age in requests, full pool's:\n";
  for (const HybridHitRow& r : s.rows) {
    for (const auto& [name, a] : {std::pair<const char*, const CutAnalysis&>{"LRU", r.analysis},
                                  {"anchor 1st", r.fixed_analysis},
                                  {"proposed", r.proposed_analysis}}) {
      out += fmt::format(
          "{:>5.1f}% {:<10} {:>5} cut, {:>11} lost; points {}/{}/{} of {}/{}/{}; missing {}/{}/{}, "
          "{} requests; evictions {}/{}, age {:.0f} vs {:.0f}\n",
          100 * r.fraction, name, commas(a.cut_hits), commas(a.lost_tokens), a.cuts_by_point[1],
          a.cuts_by_point[2], a.cuts_by_point[3], a.hits_by_point[1], a.hits_by_point[2],
          a.hits_by_point[3], a.missing_released_mid, a.missing_released_at_free,
          a.missing_never_cached, a.median_requests_since_eviction, commas(a.window_evictions_mid),
          commas(a.window_evictions_at_free), a.window_mean_age_requests, a.full_mean_age_requests);
    }
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
