#include "simulate.h"

#include <cmath>
#include <filesystem>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fmt/format.h"

namespace pagedkv::sim {
namespace {

TraceKind kind_of(const std::string& path) {
  return std::string_view(path).ends_with(".jsonl") ? TraceKind::kMooncake : TraceKind::kAzure;
}

}  // namespace

TierCostModel tier_cost_model(const SimOptions& options, const Trace& trace) {
  TierCostModel costs;
  costs.block_bytes = int64_t{costs.block_tokens} * options.spec.bytes_per_token();
  costs.prefill_tokens_per_s = 1e6 / options.engine.prefill_ms_per_1k_tokens;
  costs.trace_seconds = trace_seconds(trace);
  return costs;
}

TraceSettings default_settings(TraceKind kind, const std::string& name) {
  switch (kind) {
    case TraceKind::kAzure:
      return {.budget_gib = 8,
              .time_scale = name.find("conv") != std::string::npos ? 8.0 : 16.0,
              .max_model_len = 8192};
    case TraceKind::kMooncake:
      return {.budget_gib = 64, .time_scale = 1, .max_model_len = 131072};
    case TraceKind::kSynthetic:
      return {.budget_gib = 8, .time_scale = 1, .max_model_len = 8192};
  }
  return {};
}

std::vector<AllocatorConfig> allocator_configs(const SimOptions& options) {
  std::vector<AllocatorConfig> configs = {{.kind = AllocatorKind::kContiguousMax}};
  if (options.contiguous_oracle) configs.push_back({.kind = AllocatorKind::kContiguousOracle});
  for (int32_t bs : options.block_sizes) {
    configs.push_back({.kind = AllocatorKind::kPaged, .block_size = bs});
  }
  for (int32_t bs : options.block_sizes) {
    configs.push_back({.kind = AllocatorKind::kPagedPrefix, .block_size = bs});
  }
  return configs;
}

std::string resolve_trace_path(const SimOptions& options, const std::string& trace) {
  if (std::filesystem::exists(trace) || options.traces_dir.empty()) return trace;
  return (std::filesystem::path(options.traces_dir) / trace).string();
}

namespace {

// The trace's settings with the options' overrides. Errors: InvalidArgument out of range.
absl::StatusOr<TraceSettings> settings_for(const Trace& trace, TraceKind kind,
                                           const SimOptions& options) {
  TraceSettings settings = default_settings(kind, trace.name);
  if (options.budget_gib) settings.budget_gib = *options.budget_gib;
  if (options.time_scale) settings.time_scale = *options.time_scale;
  if (options.max_model_len) settings.max_model_len = *options.max_model_len;
  if (!(settings.budget_gib > 0) || !(settings.time_scale > 0) || settings.max_model_len < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(trace.name, ": budget_gib (", settings.budget_gib, ") and time_scale (",
                     settings.time_scale, ") must be > 0 and max_model_len (",
                     settings.max_model_len, ") >= 2"));
  }
  return settings;
}

int64_t max_requests(const SimOptions& options) {
  return options.quick ? options.quick_requests : options.max_requests;
}

// The hybrid study on one loaded trace: utilization for each model, and prefix hits when
// the trace has hash ids.
absl::Status run_hybrid(const Trace& loaded, TraceKind kind, const SimOptions& options,
                        SimReport& report) {
  absl::StatusOr<TraceSettings> settings = settings_for(loaded, kind, options);
  if (!settings.ok()) return settings.status();
  const HybridStudyOptions& h = options.hybrid_options;
  for (const std::string& name : h.models) {
    absl::StatusOr<HybridModel> model = hybrid_model(name);
    if (!model.ok()) return model.status();
    if (kind == TraceKind::kMooncake) {
      Trace trace = loaded;
      truncate_trace(trace, max_requests(options));
      absl::StatusOr<HybridHitStudy> hits = hybrid_hit_study(trace, *model, h);
      if (!hits.ok()) return hits.status();
      report.hybrid_hits.push_back(*std::move(hits));
    }
    Trace trace = loaded;
    truncate_trace(trace, max_requests(options));
    clamp_to_model_len(trace, settings->max_model_len);
    scale_arrivals(trace, settings->time_scale);
    const int64_t tokens =
        kind == TraceKind::kMooncake ? h.mooncake_budget_tokens : h.azure_budget_tokens;
    absl::StatusOr<HybridUtilRun> util =
        hybrid_util_run(trace, *model, tokens * model->config.bytes_per_token(),
                        settings->max_model_len, h, options.engine);
    if (!util.ok()) return util.status();
    report.hybrid_util.push_back(*std::move(util));
  }
  return absl::OkStatus();
}

int64_t gib_bytes(double gib) { return static_cast<int64_t>(std::llround(gib * (1 << 30))); }

// One allocator's setup under the trace's settings and the options' host budgets.
absl::StatusOr<AllocatorSetup> allocator_setup(const AllocatorConfig& config,
                                               const TraceSettings& settings,
                                               const SimOptions& options) {
  AllocatorSetup setup;
  setup.config = config;
  const int64_t budget_bytes = gib_bytes(settings.budget_gib);
  if (config.kind == AllocatorKind::kPaged || config.kind == AllocatorKind::kPagedPrefix) {
    KvCacheSpec spec = options.spec;
    spec.block_size = config.block_size;
    absl::StatusOr<int32_t> blocks = spec.num_blocks_for_budget(budget_bytes);
    if (!blocks.ok()) return blocks.status();
    setup.budget_tokens = int64_t{*blocks} * config.block_size;
  } else {
    setup.budget_tokens = budget_bytes / options.spec.bytes_per_token();
  }
  setup.host_budget_tokens = gib_bytes(options.host_swap_gib) / options.spec.bytes_per_token();
  setup.host_cache_tokens = gib_bytes(options.host_cache_gib) / options.spec.bytes_per_token();
  setup.host_admission = options.host_admission;
  setup.eviction_policy = options.eviction_policy;
  setup.max_model_len = settings.max_model_len;
  setup.preemption_mode = options.preemption_mode;
  return setup;
}

// Cluster mode on one loaded trace: paged+prefix engines at the KV spec's block size.
absl::StatusOr<ClusterResult> run_cluster_trace(Trace trace, TraceKind kind,
                                                const SimOptions& options) {
  absl::StatusOr<TraceSettings> settings = settings_for(trace, kind, options);
  if (!settings.ok()) return settings.status();
  if (absl::Status s = options.spec.validate(); !s.ok()) return s;
  truncate_trace(trace, max_requests(options));
  clamp_to_model_len(trace, settings->max_model_len);
  scale_arrivals(trace, settings->time_scale);
  absl::StatusOr<AllocatorSetup> setup =
      allocator_setup({.kind = AllocatorKind::kPagedPrefix, .block_size = options.spec.block_size},
                      *settings, options);
  if (!setup.ok()) return setup.status();
  EngineOptions engine = options.engine;
  engine.kv_bytes_per_token = options.spec.bytes_per_token();
  return run_cluster(trace, *setup, engine, *options.cluster);
}

}  // namespace

absl::StatusOr<TraceRun> run_trace(Trace trace, TraceKind kind, const SimOptions& options) {
  absl::StatusOr<TraceSettings> checked = settings_for(trace, kind, options);
  if (!checked.ok()) return checked.status();
  const TraceSettings settings = *checked;
  if (absl::Status s = options.spec.validate(); !s.ok()) return s;
  truncate_trace(trace, max_requests(options));

  TraceRun run;
  run.trace = trace.name;
  run.requests = static_cast<int64_t>(trace.requests.size());
  run.clamp = clamp_to_model_len(trace, settings.max_model_len);
  scale_arrivals(trace, settings.time_scale);
  run.time_scale = settings.time_scale;
  run.budget_gib = settings.budget_gib;
  run.budget_tokens = gib_bytes(settings.budget_gib) / options.spec.bytes_per_token();
  run.max_model_len = settings.max_model_len;
  run.host_cache_gib = options.host_cache_gib;

  for (const AllocatorConfig& config : allocator_configs(options)) {
    absl::StatusOr<AllocatorSetup> checked_setup = allocator_setup(config, settings, options);
    if (!checked_setup.ok()) return checked_setup.status();
    const AllocatorSetup& setup = *checked_setup;
    EngineOptions engine = options.engine;
    engine.kv_bytes_per_token = options.spec.bytes_per_token();
    const std::string name = allocator_name(config);
    if (options.progress) {
      engine.progress = [&](int64_t steps, int64_t done, int64_t total) {
        options.progress(run.trace, name, steps, done, total);
      };
    }
    absl::StatusOr<EngineResult> result = run_engine(trace, setup, engine);
    if (!result.ok()) return result.status();
    if (options.progress) {
      options.progress(run.trace, name, result->steps, result->completed + result->rejected,
                       result->requests);
    }
    run.results.push_back(std::move(*result));
  }
  return run;
}

// The state-layer study (state_study.h) on one workload, for each of options.state_models.
absl::Status run_state(const StateWorkload& workload, const SimOptions& options,
                       SimReport& report) {
  for (const std::string& name : options.state_models) {
    absl::StatusOr<StateModel> model = builtin_state_model(name);
    if (!model.ok()) return model.status();
    absl::StatusOr<StateStudy> study = state_study(workload, *model, options.state_options);
    if (!study.ok()) return study.status();
    report.state_hits.push_back(*std::move(study));
  }
  return absl::OkStatus();
}

namespace {

using TraceVisitor = absl::FunctionRef<absl::Status(Trace trace, TraceKind kind)>;

// Reads each trace file of options.traces in order (resolve_trace_path) and visits it with
// its kind; stops at the first error, a read's or the visitor's. "generated" and
// "synthetic" name no file: like options.synthetic, they ask for the generated workload.
// Returns whether it was asked for (visit_generated visits it).
absl::StatusOr<bool> visit_trace_files(const SimOptions& options, TraceVisitor visit) {
  bool synthetic = options.synthetic;
  for (const std::string& name : options.traces) {
    if (name == "generated" || name == "synthetic") {
      synthetic = true;
      continue;
    }
    const std::string path = resolve_trace_path(options, name);
    absl::StatusOr<Trace> trace = read_trace(path);
    if (!trace.ok()) return trace.status();
    if (absl::Status s = visit(*std::move(trace), kind_of(path)); !s.ok()) return s;
  }
  return synthetic;
}

// Generates options.synthetic_options' workload and visits it (kind kSynthetic).
absl::Status visit_generated(const SimOptions& options, TraceVisitor visit) {
  absl::StatusOr<Trace> trace = generate_synthetic(options.synthetic_options);
  if (!trace.ok()) return trace.status();
  return visit(*std::move(trace), TraceKind::kSynthetic);
}

// Cluster mode: the cluster on each trace (and the generated workload), nothing else.
absl::Status run_clusters(const SimOptions& options, SimReport& report) {
  const auto run_cluster = [&](Trace trace, TraceKind kind) -> absl::Status {
    absl::StatusOr<ClusterResult> result = run_cluster_trace(std::move(trace), kind, options);
    if (!result.ok()) return result.status();
    report.clusters.push_back(*std::move(result));
    return absl::OkStatus();
  };
  const absl::StatusOr<bool> synthetic = visit_trace_files(options, run_cluster);
  if (!synthetic.ok()) return synthetic.status();
  if (*synthetic) return visit_generated(options, run_cluster);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimReport> run_simulation(const SimOptions& options) {
  SimReport report;
  report.model =
      fmt::format("{} layers x {} KV heads x head_dim {} in {} ({} bytes per token)",
                  options.spec.num_layers, options.spec.num_kv_heads, options.spec.head_dim,
                  dtype_name(options.spec.dtype), options.spec.bytes_per_token());
  report.bytes_per_token = options.spec.bytes_per_token();
  report.quick = options.quick;
  if (options.cluster) {
    if (absl::Status s = run_clusters(options, report); !s.ok()) return s;
    return report;
  }
  // The engine replay of one workload, into report.runs.
  const auto add_run = [&](Trace trace, TraceKind kind) -> absl::Status {
    absl::StatusOr<TraceRun> run = run_trace(std::move(trace), kind, options);
    if (!run.ok()) return run.status();
    report.runs.push_back(std::move(*run));
    return absl::OkStatus();
  };
  bool eviction_done = !options.eviction;
  const auto run_trace_file = [&](Trace trace, TraceKind kind) -> absl::Status {
    if ((options.state || options.state_only) && kind == TraceKind::kMooncake) {
      Trace prefix = trace;
      if (options.quick) truncate_trace(prefix, options.quick_requests);
      if (absl::Status s =
              run_state(state_workload(prefix, options.state_options.block_size), options, report);
          !s.ok()) {
        return s;
      }
    }
    if (options.state_only) return absl::OkStatus();
    if (options.hybrid || options.hybrid_only) {
      if (absl::Status s = run_hybrid(trace, kind, options, report); !s.ok()) return s;
      if (options.hybrid_only) return absl::OkStatus();
    }
    if (kind == TraceKind::kMooncake && !eviction_done) {
      // The eviction study always replays the whole trace: it takes well under a second.
      absl::StatusOr<std::vector<EvictionRow>> rows =
          eviction_study(block_streams(trace), options.eviction_sizes);
      if (!rows.ok()) return rows.status();
      report.eviction_trace = trace.name;
      report.eviction = std::move(*rows);
      absl::StatusOr<std::vector<TierRow>> tiers =
          tier_study(block_streams(trace), options.tier_sizes);
      if (!tiers.ok()) return tiers.status();
      report.tiers = std::move(*tiers);
      report.tier_costs = tier_cost_model(options, trace);
      eviction_done = true;
    }
    return add_run(std::move(trace), kind);
  };
  const absl::StatusOr<bool> synthetic = visit_trace_files(options, run_trace_file);
  if (!synthetic.ok()) return synthetic.status();
  if (options.state || options.state_only) {
    SharedPromptOptions shared = options.shared_prompt_options;
    if (options.quick) shared.conversations = std::min(shared.conversations, 100);
    if (absl::Status s = run_state(shared_prompt_workload(shared, options.state_options.block_size),
                                   options, report);
        !s.ok()) {
      return s;
    }
  }
  if (*synthetic && !options.hybrid_only && !options.state_only) {
    if (absl::Status s = visit_generated(options, add_run); !s.ok()) return s;
  }
  return report;
}

}  // namespace pagedkv::sim
