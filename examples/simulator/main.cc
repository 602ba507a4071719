// pagedkv-sim: replays LLM serving traces against contiguous reservation and pagedkv's
// paged allocator, and runs the LRU-versus-optimal eviction study. See --help.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "command_line.h"
#include "eviction.h"
#include "fmt/format.h"
#include "simulate.h"

namespace {

using pagedkv::sim::SimOptions;

// --block_sizes: a comma-separated list of positive integers.
struct BlockSizes {
  std::vector<int32_t> sizes;
};

bool AbslParseFlag(absl::string_view text, BlockSizes* out, std::string* error) {
  out->sizes.clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int32_t size;
    if (!absl::SimpleAtoi(part, &size) || size <= 0) {
      *error = absl::StrCat("'", part, "' is not a positive integer");
      return false;
    }
    out->sizes.push_back(size);
  }
  return true;
}

std::string AbslUnparseFlag(const BlockSizes& value) { return absl::StrJoin(value.sizes, ","); }

// The flags' defaults. One object: a temporary SimOptions{} per flag default trips GCC 12's
// maybe-uninitialized on its std::function member at -O3.
const SimOptions kDefaults;

}  // namespace

ABSL_FLAG(std::string, traces_dir, "",
          "the shipped traces; default $PAGEDKV_TRACES_DIR, else ../shared/traces next to "
          "the source tree");
ABSL_FLAG(std::vector<std::string>, trace,
          std::vector<std::string>({"AzureLLMInferenceTrace_code.csv",
                                    "AzureLLMInferenceTrace_conv.csv", "synthetic_trace.jsonl"}),
          "a trace to replay, repeatable or comma-separated: a file name in --traces_dir or a "
          "path (.csv Azure, .jsonl Mooncake), or \"generated\" for the generator");
ABSL_FLAG(bool, synthetic, false,
          "also replay the generated workload: shared system prompts, parallel samples, beams; "
          "trace name \"generated\"");
ABSL_FLAG(int32_t, gen_requests, pagedkv::sim::SyntheticOptions{}.num_requests,
          "generated workload: requests");
ABSL_FLAG(double, gen_rate, pagedkv::sim::SyntheticOptions{}.rate_per_s,
          "generated workload: Poisson arrivals per second");
ABSL_FLAG(uint64_t, gen_seed, pagedkv::sim::SyntheticOptions{}.seed,
          "generated workload: random seed");
ABSL_FLAG(bool, no_eviction, false, "skip the eviction and tier studies");
ABSL_FLAG(bool, eviction_policies, false,
          "run only the eviction-policy study (issue 24) on each trace with hash ids: LRU, the "
          "library's adaptive policy and Belady at 1,024 to 65,536 blocks, and the host tier's "
          "admission rule at 1,024 + 3,072 blocks");
ABSL_FLAG(bool, quick, false, "first 400 requests of each trace, for tests");
ABSL_FLAG(std::optional<int64_t>, max_requests, std::nullopt,
          "first N requests of each trace; default all");
ABSL_FLAG(BlockSizes, block_sizes, BlockSizes{kDefaults.block_sizes},
          "paged block sizes, comma-separated");
ABSL_FLAG(std::optional<double>, budget_gib, std::nullopt,
          "device KV budget in GiB for every trace; default per trace: Azure 8, Mooncake 64, "
          "synthetic 8");
ABSL_FLAG(std::optional<double>, time_scale, std::nullopt,
          "divide arrival times by X; default per trace: Azure code 16, conv 8, others 1");
ABSL_FLAG(std::optional<int32_t>, max_model_len, std::nullopt,
          "context limit in tokens; default per trace: Azure 8192, Mooncake 131072");
ABSL_FLAG(std::string, preemption, "recompute", "preemption mode: recompute or swap");
ABSL_FLAG(double, swap_gib, kDefaults.host_swap_gib,
          "host swap space in GiB for --preemption swap");
ABSL_FLAG(double, host_cache_gib, kDefaults.host_cache_gib,
          "host tier in GiB behind paged+prefix: evicted cached blocks are demoted there and "
          "promoted on a hit; 0: none");
ABSL_FLAG(std::string, host_admission, "all",
          "which evicted blocks the host tier takes: all, or reused (hit, or computed again "
          "while their hash was a ghost)");
ABSL_FLAG(std::string, eviction_policy, "lru",
          "the order the engine's prefix cache evicts cached blocks in: lru or adaptive "
          "(recency against frequency, steered by ghost lists)");
ABSL_FLAG(double, host_link_gbps, pagedkv::sim::EngineOptions{}.host_link_bytes_per_s / 1e9,
          "host tier promotion bandwidth in GB/s; 55: PCIe 5.0 x16");
ABSL_FLAG(double, step_ms, pagedkv::sim::EngineOptions{}.step_ms, "decode step time in ms");
ABSL_FLAG(double, prefill_ms_per_1k, pagedkv::sim::EngineOptions{}.prefill_ms_per_1k_tokens,
          "prefill time in ms per 1,000 prompt tokens");
ABSL_FLAG(int32_t, max_num_seqs, pagedkv::sim::EngineOptions{}.max_num_seqs,
          "running sequences at most");
ABSL_FLAG(bool, hybrid, false,
          "also run the hybrid-model study: utilization and concurrency of hybrid pools against "
          "every layer full, and (Mooncake) prefix hits against vLLM's rule");
ABSL_FLAG(bool, hybrid_only, false, "run only the hybrid-model study");
ABSL_FLAG(std::vector<std::string>, hybrid_models, kDefaults.hybrid_options.models,
          "hybrid models, comma-separated: gemma-3-27b, gpt-oss-120b");
ABSL_FLAG(std::vector<std::string>, hybrid_fractions,
          std::vector<std::string>({"1", "0.5", "0.25", "0.125", "0.0625"}),
          "hit study pool sizes as fractions of the trace's footprint, comma-separated");
ABSL_FLAG(int32_t, hybrid_chunk, kDefaults.hybrid_options.chunk_tokens,
          "hybrid study: prefill chunk in tokens (the engine's prefill tokens per step)");
ABSL_FLAG(int32_t, hybrid_checkpoint, kDefaults.hybrid_options.checkpoint_tokens,
          "hit study: the windowed groups' coarsest checkpoints, every this many tokens (0: "
          "branch points only; KvCacheManager::Options::window_checkpoint_tokens)");
ABSL_FLAG(int32_t, hybrid_checkpoint_levels, kDefaults.hybrid_options.checkpoint_levels,
          "hit study: the windowed groups' checkpoint levels, each at half the spacing of the "
          "one before");
ABSL_FLAG(bool, state, false,
          "also run the state-layer study: prefix hits of hybrid models with state layers "
          "(Mamba2, Gated DeltaNet), pagedkv's checkpoints against vLLM's rule, on the Mooncake "
          "traces and a generated shared-prompt workload");
ABSL_FLAG(bool, state_only, false, "run only the state-layer study");
ABSL_FLAG(std::vector<std::string>, state_models, kDefaults.state_models,
          "state-layer study models, comma-separated: qwen3-next-80b-a3b, nemotron-h-8b, "
          "granite-4.0-h-tiny");
ABSL_FLAG(int32_t, state_checkpoints_per_sequence, kDefaults.state_options.checkpoints_per_sequence,
          "state-layer study: cached checkpoints per target-length sequence in pagedkv's split");
ABSL_FLAG(int32_t, state_conversations, kDefaults.shared_prompt_options.conversations,
          "state-layer study: conversations of the generated shared-prompt workload");
ABSL_FLAG(std::optional<int32_t>, engines, std::nullopt,
          "cluster mode: N paged+prefix/16 engines behind a router on each trace, each with the "
          "device and host budgets of a single-engine run; nothing else runs");
ABSL_FLAG(std::string, router, "kv-aware",
          "cluster mode: round-robin, or kv-aware (longest cached prefix from the engines' KV "
          "events, against the load, modelled on Dynamo's cost)");
ABSL_FLAG(double, shared_tier_gib, 0,
          "cluster mode: a prefix store of this many GiB shared by the engines (LRU); every "
          "computed block is written to it, admissions read it past their own hits; 0: none");
ABSL_FLAG(double, shared_tier_gbps, pagedkv::sim::ClusterOptions{}.shared_tier_bytes_per_s / 1e9,
          "cluster mode: shared tier bandwidth to one engine in GB/s; 25: a 200 Gb/s NIC");
ABSL_FLAG(std::string, out_dir, "out/sim", "where results.json and results-utilization.svg go");
ABSL_FLAG(bool, no_progress, false, "no progress line");

namespace {

constexpr const char* kUsage = R"(Usage: pagedkv-sim [options]

Replays traces in simulated time with an engine model and compares allocators:
contiguous-max (reserve max_model_len per request, first fit), contiguous-oracle
(reserve prompt + output), paged and paged+prefix (pagedkv's KvCacheManager) at each
block size. Runs the eviction study (LRU on BlockPool vs Belady) and the tier study
(KvCacheManager with a host tier) on the Mooncake trace. With --engines N, cluster mode runs
instead: N engines behind a router, optionally sharing a prefix store (--shared_tier_gib).
Flags take --flag=value or --flag value; dashes may stand for the underscores
(--traces-dir).)";

int fail(const std::string& message) {
  std::fprintf(stderr, "pagedkv-sim: %s\n", message.c_str());
  return 2;
}

// The checks the flags' types cannot make. Errors: InvalidArgument naming the first flag
// out of range.
absl::Status validate_flags() {
  using absl::GetFlag;
  using pagedkv::examples::check_flag;
  constexpr int64_t kMaxCount = 1 << 30;  // requests, tokens, sequences
  const auto count_in = [](int64_t n, int64_t min) { return n >= min && n <= kMaxCount; };
  const auto count_range = [](int64_t min) {
    return absl::StrCat("in [", min, ", ", kMaxCount, "]");
  };
  const std::string preemption = GetFlag(FLAGS_preemption);
  const std::string host_admission = GetFlag(FLAGS_host_admission);
  const std::string eviction_policy = GetFlag(FLAGS_eviction_policy);
  const std::string router = GetFlag(FLAGS_router);
  for (const absl::Status& status : {
           check_flag(FLAGS_gen_requests, count_in(GetFlag(FLAGS_gen_requests), 0), count_range(0)),
           check_flag(FLAGS_gen_rate, GetFlag(FLAGS_gen_rate) > 0, "> 0"),
           check_flag(FLAGS_max_requests, GetFlag(FLAGS_max_requests).value_or(1) > 0, "> 0"),
           check_flag(FLAGS_budget_gib, GetFlag(FLAGS_budget_gib).value_or(1) > 0, "> 0"),
           check_flag(FLAGS_time_scale, GetFlag(FLAGS_time_scale).value_or(1) > 0, "> 0"),
           check_flag(FLAGS_max_model_len, count_in(GetFlag(FLAGS_max_model_len).value_or(2), 2),
                      count_range(2)),
           check_flag(FLAGS_preemption, preemption == "recompute" || preemption == "swap",
                      "recompute or swap"),
           check_flag(FLAGS_swap_gib, GetFlag(FLAGS_swap_gib) >= 0, ">= 0"),
           check_flag(FLAGS_host_cache_gib, GetFlag(FLAGS_host_cache_gib) >= 0, ">= 0"),
           check_flag(FLAGS_host_admission, host_admission == "all" || host_admission == "reused",
                      "all or reused"),
           check_flag(FLAGS_eviction_policy,
                      eviction_policy == "lru" || eviction_policy == "adaptive", "lru or adaptive"),
           check_flag(FLAGS_host_link_gbps, GetFlag(FLAGS_host_link_gbps) > 0, "> 0"),
           check_flag(FLAGS_step_ms, GetFlag(FLAGS_step_ms) > 0, "> 0"),
           check_flag(FLAGS_prefill_ms_per_1k, GetFlag(FLAGS_prefill_ms_per_1k) >= 0, ">= 0"),
           check_flag(FLAGS_max_num_seqs, count_in(GetFlag(FLAGS_max_num_seqs), 1), count_range(1)),
           check_flag(FLAGS_hybrid_chunk, count_in(GetFlag(FLAGS_hybrid_chunk), 0), count_range(0)),
           check_flag(FLAGS_hybrid_checkpoint, count_in(GetFlag(FLAGS_hybrid_checkpoint), 0),
                      count_range(0)),
           check_flag(FLAGS_hybrid_checkpoint_levels,
                      GetFlag(FLAGS_hybrid_checkpoint_levels) >= 1 &&
                          GetFlag(FLAGS_hybrid_checkpoint_levels) <= 16,
                      "in [1, 16]"),
           check_flag(FLAGS_state_checkpoints_per_sequence,
                      GetFlag(FLAGS_state_checkpoints_per_sequence) >= 0, ">= 0"),
           check_flag(FLAGS_state_conversations, count_in(GetFlag(FLAGS_state_conversations), 1),
                      count_range(1)),
           check_flag(FLAGS_engines,
                      GetFlag(FLAGS_engines).value_or(1) >= 1 &&
                          GetFlag(FLAGS_engines).value_or(1) <= pagedkv::sim::kMaxClusterEngines,
                      absl::StrCat("in [1, ", pagedkv::sim::kMaxClusterEngines, "]")),
           check_flag(FLAGS_router, pagedkv::sim::parse_router(router).ok(),
                      "round-robin or kv-aware"),
           check_flag(FLAGS_shared_tier_gib, GetFlag(FLAGS_shared_tier_gib) >= 0, ">= 0"),
           check_flag(FLAGS_shared_tier_gib,
                      GetFlag(FLAGS_engines).has_value() || GetFlag(FLAGS_shared_tier_gib) == 0,
                      "0 without --engines (the shared tier is cluster mode's)"),
           check_flag(FLAGS_shared_tier_gbps, GetFlag(FLAGS_shared_tier_gbps) > 0, "> 0"),
       }) {
    if (!status.ok()) return status;
  }
  for (const std::string& f : GetFlag(FLAGS_hybrid_fractions)) {
    double x;
    if (!absl::SimpleAtod(f, &x) || !(x > 0) || x > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hybrid_fractions: '", f, "' is not a fraction > 0"));
    }
  }
  return absl::OkStatus();
}

// The options the flags give (after validate_flags()).
SimOptions options_from_flags() {
  using absl::GetFlag;
  SimOptions options;
  options.traces_dir = GetFlag(FLAGS_traces_dir);
  if (options.traces_dir.empty()) {
    const char* dir = std::getenv("PAGEDKV_TRACES_DIR");
    options.traces_dir =
        dir != nullptr ? dir : std::string(PAGEDKV_SOURCE_DIR) + "/../shared/traces";
  }
  options.traces = GetFlag(FLAGS_trace);
  options.synthetic = GetFlag(FLAGS_synthetic);
  options.synthetic_options.num_requests = GetFlag(FLAGS_gen_requests);
  options.synthetic_options.rate_per_s = GetFlag(FLAGS_gen_rate);
  options.synthetic_options.seed = GetFlag(FLAGS_gen_seed);
  options.eviction = !GetFlag(FLAGS_no_eviction);
  options.quick = GetFlag(FLAGS_quick);
  options.max_requests = GetFlag(FLAGS_max_requests).value_or(-1);
  options.block_sizes = GetFlag(FLAGS_block_sizes).sizes;
  options.budget_gib = GetFlag(FLAGS_budget_gib);
  options.time_scale = GetFlag(FLAGS_time_scale);
  options.max_model_len = GetFlag(FLAGS_max_model_len);
  options.preemption_mode = GetFlag(FLAGS_preemption) == "swap"
                                ? pagedkv::PreemptionMode::kSwap
                                : pagedkv::PreemptionMode::kRecompute;
  options.host_swap_gib = GetFlag(FLAGS_swap_gib);
  options.host_cache_gib = GetFlag(FLAGS_host_cache_gib);
  options.host_admission = GetFlag(FLAGS_host_admission) == "reused"
                               ? pagedkv::HostAdmission::kReused
                               : pagedkv::HostAdmission::kAll;
  options.eviction_policy = GetFlag(FLAGS_eviction_policy) == "adaptive"
                                ? pagedkv::EvictionPolicy::kAdaptive
                                : pagedkv::EvictionPolicy::kLru;
  options.engine.host_link_bytes_per_s = GetFlag(FLAGS_host_link_gbps) * 1e9;
  options.engine.step_ms = GetFlag(FLAGS_step_ms);
  options.engine.prefill_ms_per_1k_tokens = GetFlag(FLAGS_prefill_ms_per_1k);
  options.engine.max_num_seqs = GetFlag(FLAGS_max_num_seqs);
  options.engine.measure_allocator_time = true;
  options.hybrid = GetFlag(FLAGS_hybrid);
  options.hybrid_only = GetFlag(FLAGS_hybrid_only);
  options.hybrid_options.models = GetFlag(FLAGS_hybrid_models);
  options.hybrid_options.fractions.clear();
  for (const std::string& f : GetFlag(FLAGS_hybrid_fractions)) {
    double x = 0;
    (void)absl::SimpleAtod(f, &x);
    options.hybrid_options.fractions.push_back(x);
  }
  options.hybrid_options.chunk_tokens = GetFlag(FLAGS_hybrid_chunk);
  options.hybrid_options.checkpoint_tokens = GetFlag(FLAGS_hybrid_checkpoint);
  options.hybrid_options.checkpoint_levels = GetFlag(FLAGS_hybrid_checkpoint_levels);
  options.state = GetFlag(FLAGS_state);
  options.state_only = GetFlag(FLAGS_state_only);
  options.state_models = GetFlag(FLAGS_state_models);
  options.state_options.checkpoints_per_sequence = GetFlag(FLAGS_state_checkpoints_per_sequence);
  options.shared_prompt_options.conversations = GetFlag(FLAGS_state_conversations);
  if (const std::optional<int32_t> engines = GetFlag(FLAGS_engines)) {
    const int64_t block_bytes = options.spec.bytes_per_token() * options.spec.block_size;
    options.cluster = pagedkv::sim::ClusterOptions{
        .num_engines = *engines,
        .router = *pagedkv::sim::parse_router(GetFlag(FLAGS_router)),
        .shared_tier_blocks =
            std::llround(GetFlag(FLAGS_shared_tier_gib) * (1 << 30)) / block_bytes,
        .shared_tier_bytes_per_s = GetFlag(FLAGS_shared_tier_gbps) * 1e9};
  }
  return options;
}

// --eviction_policies: the policy and admission studies of eviction.h on each trace that
// has hash ids, the admission rule at issue 24's size (the tier study's first: 64 + 192 GiB).
int run_eviction_policies(const SimOptions& options) {
  constexpr pagedkv::sim::TierSize kAdmissionSize{.device_blocks = 1024, .host_blocks = 3072};
  for (const std::string& name : options.traces) {
    absl::StatusOr<pagedkv::sim::Trace> trace =
        pagedkv::sim::read_trace(pagedkv::sim::resolve_trace_path(options, name));
    if (!trace.ok()) return fail(std::string(trace.status().ToString()));
    const int64_t max_requests = options.quick ? options.quick_requests : options.max_requests;
    if (max_requests > 0) pagedkv::sim::truncate_trace(*trace, max_requests);
    const pagedkv::sim::BlockStreams streams = pagedkv::sim::block_streams(*trace);
    if (pagedkv::sim::distinct_blocks(streams) == 0) {
      fmt::print("{}: no hash ids, no prefix structure to evict by; skipped\n\n", trace->name);
      continue;
    }
    absl::StatusOr<std::vector<pagedkv::sim::PolicyRow>> rows =
        pagedkv::sim::policy_study(streams, options.eviction_sizes);
    if (!rows.ok()) return fail(std::string(rows.status().ToString()));
    fmt::print(
        "Eviction policies on {} ({} requests, 512-token blocks; block-level prefix hit "
        "rate):\n{}\n",
        trace->name, trace->requests.size(), pagedkv::sim::format_policy_table(*rows));
    absl::StatusOr<pagedkv::sim::AdmissionRow> admission =
        pagedkv::sim::admission_study(streams, kAdmissionSize);
    if (!admission.ok()) return fail(std::string(admission.status().ToString()));
    fmt::print("Host-tier admission on {} ({} device + {} host blocks, KvCacheManager):\n{}\n",
               trace->name, kAdmissionSize.device_blocks, kAdmissionSize.host_blocks,
               pagedkv::sim::format_admission_table(*admission));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr absl::string_view kRepeatableFlags[] = {"trace"};
  const std::vector<std::string> positional =
      pagedkv::examples::parse_command_line(argc, argv, kUsage, __FILE__, kRepeatableFlags);
  if (!positional.empty()) return fail("unexpected argument '" + positional[0] + "'; see --help");
  if (absl::Status status = validate_flags(); !status.ok()) {
    return fail(std::string(status.message()));
  }
  SimOptions options = options_from_flags();
  if (absl::GetFlag(FLAGS_eviction_policies)) return run_eviction_policies(options);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  const bool progress = isatty(STDERR_FILENO) != 0;
  const bool quiet_progress = absl::GetFlag(FLAGS_no_progress);
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  if (!quiet_progress) {
    options.progress = [&](const std::string& trace, const std::string& allocator, int64_t steps,
                           int64_t done, int64_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(250)) return;
      last = now;
      const double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "%s[%6.1fs] %s %-18s step %8lld  requests %6lld/%lld%s",
                   progress ? "\r" : "", secs, trace.c_str(), allocator.c_str(),
                   static_cast<long long>(steps), static_cast<long long>(done),
                   static_cast<long long>(total), progress ? "   " : "\n");
      std::fflush(stderr);
    };
  }
  absl::StatusOr<pagedkv::sim::SimReport> report = pagedkv::sim::run_simulation(options);
  if (!quiet_progress && progress) std::fputc('\n', stderr);
  if (!report.ok()) return fail(std::string(report.status().ToString()));

  fmt::print("KV spec: {}\n\n", report->model);
  for (const pagedkv::sim::TraceRun& run : report->runs) {
    fmt::print("{}\n", pagedkv::sim::format_run_table(run));
  }
  if (!report->eviction.empty()) {
    fmt::print("Eviction study on {} (512-token blocks; block-level prefix hit rate):\n{}\n",
               report->eviction_trace, pagedkv::sim::format_eviction_table(report->eviction));
  }
  if (!report->tiers.empty()) {
    fmt::print(
        "Tier study on {} (KvCacheManager with a host tier against one LRU pool of the same "
        "total):\n{}\n",
        report->eviction_trace, pagedkv::sim::format_tier_table(report->tiers, report->tier_costs));
  }
  if (!report->hybrid_util.empty()) {
    fmt::print(
        "Hybrid models: KV bytes and running requests, hybrid pools against every layer "
        "full at the same budget (need: the analytic minimum of the running sequences):\n{}\n",
        pagedkv::sim::format_hybrid_util_runs(report->hybrid_util));
  }
  for (const pagedkv::sim::HybridHitStudy& study : report->hybrid_hits) {
    fmt::print("{}\n", pagedkv::sim::format_hybrid_hit_study(study));
  }
  for (const pagedkv::sim::StateStudy& study : report->state_hits) {
    fmt::print("{}\n", pagedkv::sim::format_state_study(study));
  }
  if (!report->clusters.empty()) {
    fmt::print(
        "Cluster: engines behind a router; prompt tokens of admitted prefills by where their KV "
        "came from (requests per engine: most/fewest):\n{}\n",
        pagedkv::sim::format_cluster_table(report->clusters));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return fail("cannot create --out-dir " + out_dir + ": " + ec.message());
  const std::string json_path = out_dir + "/results.json";
  const std::string svg_path = out_dir + "/results-utilization.svg";
  if (absl::Status s = pagedkv::sim::write_text_file(json_path, pagedkv::sim::to_json(*report));
      !s.ok()) {
    return fail(std::string(s.ToString()));
  }
  if (absl::Status s = pagedkv::sim::write_text_file(svg_path, pagedkv::sim::to_svg(*report));
      !s.ok()) {
    return fail(std::string(s.ToString()));
  }
  fmt::print("wrote {} and {} ({:.1f}s)\n", json_path, svg_path,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}
