// File: examples/simulator/simulate.h
//
// The whole pagedkv-sim run: load each trace, clamp it to the model length, scale its
// arrivals, replay it with the engine model against every allocator (contiguous max and
// oracle, paged and paged+prefix at each block size) under one KV budget, and run the
// eviction study on the Mooncake trace. main.cc parses flags into SimOptions; tests call
// run_simulation() in quick mode.
#ifndef PAGEDKV_EXAMPLES_SIMULATOR_SIMULATE_H_
#define PAGEDKV_EXAMPLES_SIMULATOR_SIMULATE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster.h"
#include "engine.h"
#include "hybrid.h"
#include "pagedkv/kv_cache_spec.h"
#include "report.h"
#include "state_study.h"
#include "synthetic.h"

namespace pagedkv::sim {

// Per-trace settings; unset fields take the defaults of the trace's kind (see
// default_settings()).
struct TraceSettings {
  double budget_gib = 0;  // device KV budget
  double time_scale = 1;  // arrivals divided by this
  int32_t max_model_len = 0;
};

enum class TraceKind { kAzure, kMooncake, kSynthetic };

// Azure: 8 GiB, max_model_len 8192, arrivals x16 (code) / x8 (conv);
// Mooncake: 64 GiB, max_model_len 131072, arrivals x1; synthetic: 8 GiB, 8192, x1.
TraceSettings default_settings(TraceKind kind, const std::string& name);

struct SimOptions {
  std::string traces_dir;           // where the shipped traces live
  std::vector<std::string> traces;  // file names in traces_dir, or paths
  bool synthetic = false;           // also run the synthetic workload
  SyntheticOptions synthetic_options;
  bool quick = false;  // first quick_requests requests of each trace
  int64_t quick_requests = 400;
  int64_t max_requests = -1;  // -1: all (quick sets quick_requests)
  std::vector<int32_t> block_sizes = {8, 16, 32};
  bool contiguous_oracle = true;
  std::optional<double> budget_gib;  // overrides every trace's default
  std::optional<double> time_scale;
  std::optional<int32_t> max_model_len;
  double host_swap_gib = 4;
  double host_cache_gib = 0;                              // host tier behind paged+prefix (0: none)
  HostAdmission host_admission = HostAdmission::kAll;     // the host tier's
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;  // the prefix cache's
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  EngineOptions engine;
  bool eviction = true;  // eviction study on the first Mooncake trace
  std::vector<int32_t> eviction_sizes = {1024, 4096, 16384, 65536};
  // The tier study (device + host blocks, and retained head blocks with no host tier) on
  // the eviction study's trace; recompute runs at the engine's prefill speed
  // (engine.prefill_ms_per_1k_tokens).
  std::vector<TierSize> tier_sizes = {{1024, 3072},  {4096, 12288}, {16384, 49152}, {1024, 0, 2},
                                      {1024, 0, 32}, {4096, 0, 2},  {4096, 0, 32}};
  // The hybrid-model study (hybrid.h): utilization and concurrency on every trace, prefix
  // hits on the Mooncake traces, for each of hybrid_options.models. hybrid_only skips the
  // allocator comparison and the eviction and tier studies.
  bool hybrid = false;
  bool hybrid_only = false;
  HybridStudyOptions hybrid_options;
  // The state-layer study (state_study.h): prefix hits of hybrid models with state layers,
  // pagedkv's checkpoint policy against the vLLM rule, on the Mooncake traces and the
  // generated shared-prompt workload. state_only skips everything else.
  bool state = false;
  bool state_only = false;
  std::vector<std::string> state_models = builtin_state_model_names();
  StateStudyOptions state_options;
  SharedPromptOptions shared_prompt_options;
  // Cluster mode (cluster.h): only the cluster, paged+prefix engines at spec.block_size
  // with the budgets above, on each trace and (synthetic) the generated workload.
  std::optional<ClusterOptions> cluster;
  // Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x 2 bytes x 2 = 128 KiB per token.
  KvCacheSpec spec{.num_layers = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .dtype = DType::kBFloat16,
                   .block_size = 16};
  // Progress: (trace, allocator, steps, finished requests, total requests).
  std::function<void(const std::string&, const std::string&, int64_t, int64_t, int64_t)> progress;
};

// The allocator configurations compared, in report order.
std::vector<AllocatorConfig> allocator_configs(const SimOptions& options);

// Resolves a trace argument: an existing path as is, else traces_dir/name.
std::string resolve_trace_path(const SimOptions& options, const std::string& trace);

// The tier study's costs: 512-token blocks of options.spec, recompute at the engine's
// prefill speed (infinite when prefill_ms_per_1k_tokens is 0), the trace's arrival span.
TierCostModel tier_cost_model(const SimOptions& options, const Trace& trace);

// Runs everything. Errors: NotFound / InvalidArgument from the readers (file and line),
// InvalidArgument for bad options, Internal from the engine.
[[nodiscard]] absl::StatusOr<SimReport> run_simulation(const SimOptions& options);

// Replays one loaded trace against every allocator (the trace is clamped and scaled here).
[[nodiscard]] absl::StatusOr<TraceRun> run_trace(Trace trace, TraceKind kind,
                                                 const SimOptions& options);

}  // namespace pagedkv::sim

#endif  // PAGEDKV_EXAMPLES_SIMULATOR_SIMULATE_H_
